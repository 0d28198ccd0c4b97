// Package sglang owns everything about the inference server: launch spec to argv, the
// supervised process group and its adoption, readiness, and the retrying HTTP client.
package sglang
