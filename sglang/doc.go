// Package sglang owns everything about the inference server: launch spec to argv, the
// supervised process group and its adoption, readiness, and the retrying HTTP client.
// It also answers what a triage asks about the server's side of the node (who holds a
// GPU and how to stop it, the model's shape, the Python that would run the server, who
// holds the port) as facts; judging them is the caller's (orchestrator's doctor). It
// imports neither checkpoint nor orchestrator (deps_test.go).
package sglang
