package orchestrator

import (
	"fmt"
	"sort"
	"time"

	"github.com/extract-dev/extract/configs"
)

// admission decides which samples go out next: never-sent ones in order, retries when
// due, and why sending pauses. It owns no I/O; the coordinator records the attempts and
// sends the requests.
type admission struct {
	queue    []int       // never-sent samples, ascending
	retries  []retry     // samples to send again, by due time
	failures map[int]int // failed attempts per sample in this run
	paused   []string    // why the last round stopped short, for status
	// deaths counts the server deaths (and hangs) each sample was in flight at, in this
	// run; alone holds the samples sent alone since (the poison rule: died).
	deaths map[int]int
	alone  map[int]bool
}

type retry struct {
	sample int
	due    time.Time
}

// next peeks at the sample to send next: a due retry first, then the queue. Entries that
// skip says need no request (in flight, done) are dropped on the way.
func (a *admission) next(now time.Time, skip func(int) bool) (int, bool) {
	for len(a.retries) > 0 && !a.retries[0].due.After(now) {
		s := a.retries[0].sample
		if skip(s) {
			a.retries = a.retries[1:] // its dump came after all
			continue
		}
		return s, true
	}
	for len(a.queue) > 0 {
		s := a.queue[0]
		if skip(s) {
			a.queue = a.queue[1:] // adopted from a leftover dump meanwhile
			continue
		}
		return s, false
	}
	return -1, false
}

// take removes what next returned.
func (a *admission) take(fromRetry bool) {
	if fromRetry {
		a.retries = a.retries[1:]
	} else {
		a.queue = a.queue[1:]
	}
}

// retryAt sends sample again at due.
func (a *admission) retryAt(sample int, due time.Time) {
	a.retries = append(a.retries, retry{sample: sample, due: due})
	sort.Slice(a.retries, func(i, j int) bool { return a.retries[i].due.Before(a.retries[j].due) })
}

// fail counts a failed attempt and says whether the sample has now used up maxAttempts
// in this run; if not, it is retried after a backoff that doubles up to 32 s.
func (a *admission) fail(sample, maxAttempts int, now time.Time) (final bool, attempts int) {
	a.failures[sample]++
	n := a.failures[sample]
	if n >= maxAttempts {
		return true, n
	}
	a.retryAt(sample, now.Add(time.Second<<min(n-1, 5)))
	return false, n
}

// died counts a server death or hang with sample in flight: not the sample's fault as a
// rule (a death requeues without spending an attempt), but a prompt that kills the server
// would otherwise be retried forever. After isolateAfter deaths the sample is sent alone;
// the next death with it alone is its failure, which died reports.
func (a *admission) died(sample, isolateAfter int, wasAlone bool) (fail bool) {
	if wasAlone {
		return true
	}
	if a.deaths == nil {
		a.deaths, a.alone = map[int]int{}, map[int]bool{}
	}
	a.deaths[sample]++
	if a.deaths[sample] >= isolateAfter {
		a.alone[sample] = true
	}
	return false
}

// empty says nothing is left to send.
func (a *admission) empty() bool { return len(a.queue) == 0 && len(a.retries) == 0 }

// budgets are the limits admission checks a sample against (invariant 5).
type budgets struct {
	diskFree, diskReserve int64
	shmUsed, shmBudget    int64
	// shmFree is what the staging filesystem has left: others (another job, a server's
	// own files) may fill it below the budget.
	shmFree           int64
	outputDir, shmDir string
}

// blocked says why a sample of want bytes cannot be admitted now, with reserved bytes
// already in flight, or "" when it can. A sample that is alone may pass the staging
// budget, or a dump larger than the budget would never run.
func (b budgets) blocked(reserved, want int64, alone bool) string {
	if b.diskFree-reserved-want < b.diskReserve {
		return fmt.Sprintf("output disk reserve: %s free on %s, %s kept in reserve, %s in flight", configs.ByteSize(b.diskFree), b.outputDir, configs.ByteSize(b.diskReserve), configs.ByteSize(reserved+want))
	}
	if b.shmFree-reserved-want < 0 {
		// Not even alone: the hook's write of the dump would fail.
		return fmt.Sprintf("staging full: %s free on %s, %s in flight", configs.ByteSize(max(b.shmFree, 0)), b.shmDir, configs.ByteSize(reserved+want))
	}
	if !alone && b.shmUsed+reserved+want > b.shmBudget {
		return fmt.Sprintf("staging budget: %s in %s + %s in flight, budget %s", configs.ByteSize(b.shmUsed), b.shmDir, configs.ByteSize(reserved), configs.ByteSize(b.shmBudget))
	}
	return ""
}
