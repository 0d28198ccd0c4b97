package generate

import (
	"slices"
	"strings"
)

// Flag is something a validation rule found in a reply.
type Flag string

// The flags, as the peers' validators raise them.
const (
	FlagEmpty    Flag = "empty"     // no text (or only whitespace)
	FlagLength   Flag = "length"    // cut at max_new_tokens (finish reason length)
	FlagThink    Flag = "think"     // a think marker although generate.thinking is off
	FlagOnlyStop Flag = "only_stop" // nothing but stop or end-of-turn tokens
)

// Action is what a flag makes of a reply.
type Action string

// The actions of generate.on_*.
const (
	Keep  Action = "keep"
	Drop  Action = "drop"
	Retry Action = "retry"
)

// Rules are the validation keys.
type Rules struct {
	On           map[Flag]Action
	ThinkingOff  bool
	ThinkMarkers []string
	Stop         map[int64]bool // end-of-turn and stop tokens
}

// Check lists the flags of one reply.
func (r Rules) Check(text string, out []int64, finish string) []Flag {
	var flags []Flag
	if strings.TrimSpace(text) == "" {
		flags = append(flags, FlagEmpty)
	}
	if finish == "length" {
		flags = append(flags, FlagLength)
	}
	if r.ThinkingOff && slices.ContainsFunc(r.ThinkMarkers, func(m string) bool { return strings.Contains(text, m) }) {
		flags = append(flags, FlagThink)
	}
	if len(out) > 0 && !slices.ContainsFunc(out, func(id int64) bool { return !r.Stop[id] }) {
		flags = append(flags, FlagOnlyStop)
	}
	return flags
}

// Decide is the action for flags with attemptsLeft more sends allowed: a retry while
// one is left, else a drop if any rule asks for one (a spent retry is a drop), else keep.
func (r Rules) Decide(flags []Flag, attemptsLeft int) Action {
	act := Keep
	for _, f := range flags {
		switch r.On[f] {
		case Retry:
			if attemptsLeft > 0 {
				return Retry
			}
			act = Drop
		case Drop:
			act = Drop
		}
	}
	return act
}
