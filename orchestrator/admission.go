package orchestrator

import (
	"fmt"
	"slices"
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

// empty says nothing is left to send.
func (a *admission) empty() bool { return len(a.queue) == 0 && len(a.retries) == 0 }

// backlogPerWindow bounds the dumps waiting to be moved at this many request windows.
// Staging absorbs the disk's hiccups; a backlog beyond that means the disk is the limit,
// and a longer one would only grow the coordinator's work per event, not the throughput.
const backlogPerWindow = 8

// window is what admission decides from, as the coordinator counts it at one moment:
// the request window, the backlog of dumps to move, the budgets and the replicas. It is
// a value; decide does no I/O.
type window struct {
	maxInflight int
	// requestsOpen counts every request still open at a server (its dump may have come
	// and even landed: SGLang dumps at the end of the prefill and answers after
	// decoding); answered, the answered ones whose dump has not arrived. Both hold the
	// window.
	requestsOpen, answered int
	// moving counts the dumps handed to movers or queued for them: they hold staging,
	// not the window (the servers must not wait on our fsyncs), up to a backlog.
	moving int
	// flights is how many samples are in flight at any stage; reserved, the bytes they
	// hold against the budgets until their move lands.
	flights  int
	reserved int64
	// storeFailing says why storing dumps fails, "" while it works.
	storeFailing string
	budgets      budgets
	replicas     []replicaView
	poison       *poison
	// cost is a sample's load on a replica (tokens) and its reservation (bytes).
	cost func(sample int) (tokens, bytes int64)
}

// replicaView is what admission knows of a replica.
type replicaView struct {
	ready     bool
	load      int64 // tokens sent to it whose dump has not arrived
	busy      bool  // a request open at it
	exclusive bool  // it runs a sample alone (the poison rule)
}

// send is one admitted sample and the replica it goes to.
type send struct {
	sample, replica int
	alone           bool
}

// decide takes from a the samples to send now, each to its replica, and says why it
// stopped short (invariant 5): storing failing, the backlog of dumps to move, no replica
// ready or idle for a sample sent alone, a budget. A full window is no pause: the
// next answer frees a slot. skip says which queued samples need no request (in
// flight, done).
func (a *admission) decide(w window, now time.Time, skip func(int) bool) (batch []send, paused []string) {
	if w.storeFailing != "" {
		// Storing is failing (a full disk behind our back, an I/O error): admitting more
		// would only pile dumps up in staging.
		return nil, []string{"cannot store dumps: " + w.storeFailing}
	}
	if w.requestsOpen >= w.maxInflight {
		return nil, nil // the window is full whatever the flights say
	}
	if limit := backlogPerWindow * w.maxInflight; w.moving >= limit {
		return nil, []string{fmt.Sprintf("output disk behind: %d dumps wait to be moved (at most %d × run.max_inflight)", w.moving, backlogPerWindow)}
	}
	reps := slices.Clone(w.replicas)
	reserved, awaiting := w.reserved, w.requestsOpen+w.answered
	for awaiting+len(batch) < w.maxInflight {
		s, fromRetry := a.next(now, skip)
		if s < 0 {
			break
		}
		// Each sample goes to the ready replica with the fewest tokens in flight; one to
		// be sent alone waits for a replica with no request open, and has it to itself
		// until answered.
		alone := w.poison.isAlone(s)
		target := leastLoaded(reps)
		if alone {
			target = idleReplica(reps)
		}
		if target < 0 {
			if !anyReady(reps) {
				paused = append(paused, "no server ready: every replica is restarting")
			} else {
				paused = append(paused, fmt.Sprintf("isolating a sample: sample %d, or one sent before it, was in flight at %d server deaths and goes alone to a replica with nothing else in flight", s, w.poison.deathsOf(s)))
			}
			break
		}
		tokens, want := w.cost(s)
		if reason := w.budgets.blocked(reserved, want, w.flights+len(batch) == 0); reason != "" {
			paused = append(paused, reason)
			break
		}
		a.take(fromRetry)
		reps[target].busy = true
		reps[target].exclusive = reps[target].exclusive || alone
		reps[target].load += tokens
		reserved += want
		batch = append(batch, send{sample: s, replica: target, alone: alone})
	}
	return batch, paused
}

// leastLoaded is the ready replica with the fewest tokens in flight (the lowest number
// on a tie), skipping those that run a sample alone, or -1 when none is left.
func leastLoaded(reps []replicaView) int {
	best := -1
	for n, r := range reps {
		if r.ready && !r.exclusive && (best < 0 || r.load < reps[best].load) {
			best = n
		}
	}
	return best
}

// idleReplica is the lowest-numbered ready replica with no request open, for a sample
// to be sent alone; -1 when every ready replica has work.
func idleReplica(reps []replicaView) int {
	for n, r := range reps {
		if r.ready && !r.busy {
			return n
		}
	}
	return -1
}

func anyReady(reps []replicaView) bool {
	for _, r := range reps {
		if r.ready {
			return true
		}
	}
	return false
}

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
