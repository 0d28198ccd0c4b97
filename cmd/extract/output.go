package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"time"
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

// watchLoop calls show once, or every interval until ctx ends when interval > 0. On a
// terminal each snapshot replaces the screen; into a pipe or file (a log, `watch`'s own
// capture) snapshots are appended, a blank line apart, with no escape codes to garble
// them. A snapshot is rendered whole before it is written, so the screen is cleared and
// redrawn in one write.
func watchLoop(ctx context.Context, out io.Writer, interval time.Duration, asJSON bool, show func(io.Writer) error) error {
	f, ok := out.(*os.File)
	redraw := interval > 0 && !asJSON && ok && isTerminal(f)
	for n := 0; ; n++ {
		var buf bytes.Buffer
		if redraw {
			buf.WriteString("\033[H\033[2J")
		} else if n > 0 && !asJSON {
			buf.WriteString("\n")
		}
		if err := show(&buf); err != nil {
			return err
		}
		if _, err := out.Write(buf.Bytes()); err != nil {
			return err
		}
		if interval <= 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(interval):
		}
	}
}

// printUnlisted ends a capped list of problems with how many it left out.
func printUnlisted(w io.Writer, n int) {
	if n > 0 {
		fmt.Fprintf(w, "and %d more (not listed)\n", n)
	}
}
