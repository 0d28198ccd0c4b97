package orchestrator

import (
	"fmt"

	"github.com/extract-dev/extract/shm"
)

// verdict is what the coordinator does with a dump that appeared in staging.
type verdict int

const (
	moveIt      verdict = iota // the current attempt of an unfinished sample
	alreadyOn                  // being moved or quarantined already: a second report
	duplicate                  // its sample is done: remove it
	stale                      // an earlier attempt: remove it (invariant 4)
	unexplained                // no such sample: keep it for a person (quarantine)
)

// route decides a dump's fate from the ledger alone (no I/O), with the reason to log.
func route(d shm.Dump, l *ledger, busy bool) (verdict, string) {
	s := d.RID.Sample
	switch {
	case busy:
		return alreadyOn, ""
	case s >= l.total():
		return unexplained, fmt.Sprintf("sample %d is past the dataset's %d samples", s, l.total())
	case l.done(s):
		return duplicate, "sample already done"
	case uint32(d.RID.Attempt) != l.attempt[s]:
		return stale, fmt.Sprintf("attempt %d, current is %d", d.RID.Attempt, l.attempt[s])
	}
	return moveIt, ""
}

// rejectReason is the status and metrics label of each verdict that drops a dump.
func (v verdict) rejectReason() string {
	switch v {
	case duplicate:
		return "duplicate"
	case stale:
		return "stale_attempt"
	case unexplained:
		return "unknown_sample"
	}
	return ""
}
