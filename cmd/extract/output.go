package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
)

// printJSON writes v as indented JSON: every command's --json output.
func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// terminalProgress returns a progress callback that redraws one line on a terminal
// ("import: 3 / 10 files"), or nil where nobody watches (cron, --json).
func terminalProgress(what, unit string, quiet bool) func(seen, total int) {
	if quiet || !isTerminal(os.Stderr) {
		return nil
	}
	return func(seen, total int) {
		fmt.Fprintf(os.Stderr, "\r\033[K%s: %d / %d %s", what, seen, total, unit)
		if seen == total {
			fmt.Fprintln(os.Stderr)
		}
	}
}
