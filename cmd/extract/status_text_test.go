package main

import "testing"

// A dataset's id reaches the terminal in status --sample: one with a newline or an
// escape sequence is quoted, not printed as lines of its own.
func TestStatusTextQuotesAnIDThatCouldForgeALine(t *testing.T) {
	for in, want := range map[string]string{
		"conv-ü-17":                   "conv-ü-17",
		"a\nstate:     done":          `"a\nstate:     done"`,
		"\x1b[2Jcleared":              `"\x1b[2Jcleared"`,
		"tab\there":                   `"tab\there"`,
		"spaces are fine, commas too": "spaces are fine, commas too",
	} {
		if got := shown(in); got != want {
			t.Errorf("shown(%q) = %s, want %s", in, got, want)
		}
	}
}
