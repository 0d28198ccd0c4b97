// Package orchestrator runs an extraction job: it feeds the dataset's pending samples to
// the server under admission limits, turns dumps into indexed outputs, and reports progress.
package orchestrator
