// Package errclass holds the error classes the CLI maps to exit codes, so that every
// package returning one (dataset, doctor, orchestrator) wraps the same value.
package errclass

import "errors"

// Errors that map to the CLI's exit codes.
var (
	// ErrRefused: the job cannot start as asked; the message says what to do (exit 2).
	ErrRefused = errors.New("refused")
	// ErrPreflight: the node is not fit to run (exit 3).
	ErrPreflight = errors.New("preflight failed")
	// ErrTemporary: worth a retry later, e.g. by cron (exit 75).
	ErrTemporary = errors.New("temporary failure")
)
