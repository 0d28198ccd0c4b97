package orchestrator

import "github.com/extract-dev/extract/checkpoint"

// ledger is every sample's state and current attempt as the coordinator knows them, with
// the counters that status reports. set is its one mutator: it applies a transition the
// way the index's put does, so the counters in memory equal the index's whatever path a
// sample takes (failed in one run, retried and done in the next).
type ledger struct {
	state   []checkpoint.State
	attempt []uint32
	c       checkpoint.Counters
	// owned is how many samples this run owns: the dataset, or the shard's range.
	owned int
}

func newLedger(p *checkpoint.Progress, c checkpoint.Counters) ledger {
	return ledger{state: p.State, attempt: p.Attempt, c: c, owned: len(p.State)}
}

// set moves sample s to state to; a done sample's bytes and tokens are counted once.
func (l *ledger) set(s int, to checkpoint.State, bytes int64, tokens int) {
	from := l.state[s]
	if from == to {
		return
	}
	switch from {
	case checkpoint.StateDone:
		// Done is final within a run: the index refuses new attempts of a done sample.
		return
	case checkpoint.StateFailed:
		l.c.Failed--
	}
	switch to {
	case checkpoint.StateDone:
		l.c.Done++
		l.c.BytesWritten += bytes
		l.c.Tokens += int64(tokens)
	case checkpoint.StateFailed:
		l.c.Failed++
	}
	l.state[s] = to
}

// total is the dataset's size, which bounds every sample index.
func (l *ledger) total() int { return len(l.state) }

// size is how many samples this run owns: the dataset, or the shard's range.
func (l *ledger) size() int { return l.owned }

// remaining is what this run owns that is neither done nor failed.
func (l *ledger) remaining() int { return l.size() - l.c.Done - l.c.Failed }

func (l *ledger) done(s int) bool { return l.state[s] == checkpoint.StateDone }
