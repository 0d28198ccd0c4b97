package history

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// Shard is one shard's history, named as the report shows it ("" unsharded).
type Shard struct {
	Name    string
	Records []Record
}

// Series is what a report draws: the job's records in time order, the names of the
// replicas their Replicas lists hold (by position), and the events marked on the time
// axis.
type Series struct {
	Records  []Record
	Replicas []string
	Events   []Event
}

// EventKind says what an event marks.
type EventKind string

// The events a history shows.
const (
	RunStart   EventKind = "run"        // extract (re)started: a new run
	Restart    EventKind = "restart"    // a replica's server was restarted
	Pause      EventKind = "pause"      // admission paused, from T to End
	Failure    EventKind = "failure"    // samples failed every attempt
	Quarantine EventKind = "quarantine" // dumps kept aside as unexplained or malformed
)

// Event is one thing marked on the time axis.
type Event struct {
	Kind EventKind
	T    int64 // Unix milliseconds
	End  int64 // Pause only: when it was last seen
	// Replica is the restarted replica's position in Series.Replicas; -1 otherwise.
	Replica int
	Count   int // samples or dumps, for Failure and Quarantine; restarts for Restart
	Text    string
}

// Merge adds shards' histories into the job's. At every moment any shard recorded, a
// shard counts with its latest record until then (nothing before its first): done,
// failed, bytes and staging add up, the disk free is the least any shard saw, the rate
// adds the shards still running, pause reasons are named with their shard. Replicas
// are listed shard by shard. One shard is returned as it is.
func Merge(shards []Shard) Series {
	var s Series
	offsets := make([]int, len(shards))
	for i, sh := range shards {
		offsets[i] = len(s.Replicas)
		n := 0
		for _, r := range sh.Records {
			n = max(n, len(r.Replicas))
		}
		for k := range n {
			s.Replicas = append(s.Replicas, replicaName(sh.Name, k))
		}
		s.Events = append(s.Events, Events(sh.Records, offsets[i], sh.Name)...)
	}
	slices.SortStableFunc(s.Events, func(a, b Event) int { return int(a.T - b.T) })
	if len(shards) == 1 {
		s.Records = shards[0].Records
		return s
	}
	var times []int64
	for _, sh := range shards {
		for _, r := range sh.Records {
			times = append(times, r.T)
		}
	}
	slices.Sort(times)
	times = slices.Compact(times)
	at := make([]int, len(shards)) // index of each shard's next record
	for _, t := range times {
		m := Record{T: t, State: "stopped", Replicas: make([]Replica, len(s.Replicas))}
		running, complete := 0, 0
		for i, sh := range shards {
			for at[i] < len(sh.Records) && sh.Records[at[i]].T <= t {
				at[i]++
			}
			if at[i] == 0 {
				continue
			}
			r := sh.Records[at[i]-1]
			var next *Record
			if at[i] < len(sh.Records) {
				next = &sh.Records[at[i]]
			}
			live := r.State == "running" && (r.T == t || (next != nil && next.Run == r.Run))
			addInto(&m, r, live, sh.Name)
			copy(m.Replicas[offsets[i]:], r.Replicas)
			switch {
			case live:
				running++
			case r.State == "complete":
				complete++
			}
		}
		switch {
		case running > 0:
			m.State = "running"
		case complete == len(shards):
			m.State = "complete"
		}
		s.Records = append(s.Records, m)
	}
	return s
}

// addInto counts one shard's record into the job's.
func addInto(m *Record, r Record, live bool, shard string) {
	m.Total += r.Total
	m.Done += r.Done
	m.Failed += r.Failed
	m.Bytes += r.Bytes
	m.Tokens += r.Tokens
	m.Rejected += r.Rejected
	m.Quarantined += r.Quarantined
	m.StagingBytes += r.StagingBytes
	m.StagingBudget += r.StagingBudget
	if r.DiskFree > 0 && (m.DiskFree == 0 || r.DiskFree < m.DiskFree) {
		m.DiskFree, m.DiskReserve = r.DiskFree, r.DiskReserve
	}
	if !live {
		return
	}
	m.Inflight += r.Inflight
	m.Rate += r.Rate
	for _, p := range r.Paused {
		m.Paused = union(m.Paused, []string{shardPrefix(shard) + p})
	}
}

func replicaName(shard string, k int) string {
	if shard == "" {
		return fmt.Sprintf("replica %d", k)
	}
	return fmt.Sprintf("shard %s replica %d", shard, k)
}

func shardPrefix(shard string) string {
	if shard == "" {
		return ""
	}
	return "shard " + shard + ": "
}

// Events lists what one shard's records show: each run's start, each replica restart,
// each stretch of pausing, and each rise of the failed and quarantined counts. A
// replica's position in the job's list is offset plus its own.
func Events(recs []Record, offset int, shard string) []Event {
	var evs []Event
	pre := shardPrefix(shard)
	var pause *Event
	var reasons []string // the current pause's
	endPause := func() {
		if pause != nil {
			evs = append(evs, *pause)
			pause = nil
		}
	}
	for i, r := range recs {
		var prev *Record
		if i > 0 {
			prev = &recs[i-1]
		}
		newRun := prev == nil || prev.Run != r.Run
		if newRun {
			what := "run started"
			if prev != nil {
				what = "run restarted"
			}
			evs = append(evs, Event{Kind: RunStart, T: r.T, Replica: -1, Text: fmt.Sprintf("%s%s (pid %d)", pre, what, r.PID)})
		}
		for k, rep := range r.Replicas {
			before := 0
			if !newRun && k < len(prev.Replicas) {
				before = prev.Replicas[k].Restarts
			}
			if rep.Restarts > before {
				n := rep.Restarts - before
				evs = append(evs, Event{Kind: Restart, T: r.T, Replica: offset + k, Count: n,
					Text: fmt.Sprintf("%s%s restarted (%d in this run)", pre, replicaName("", k), rep.Restarts)})
			}
		}
		if prev != nil {
			if d := r.Failed - prev.Failed; d > 0 {
				evs = append(evs, Event{Kind: Failure, T: r.T, Replica: -1, Count: d, Text: fmt.Sprintf("%s%d samples failed every attempt", pre, d)})
			}
			q := r.Quarantined
			if !newRun {
				q -= prev.Quarantined
			}
			if q > 0 {
				evs = append(evs, Event{Kind: Quarantine, T: r.T, Replica: -1, Count: int(q), Text: fmt.Sprintf("%s%d dumps quarantined", pre, q)})
			}
		}
		if len(r.Paused) == 0 || newRun {
			endPause()
		}
		if len(r.Paused) > 0 {
			if pause == nil {
				start := r.T
				if prev != nil && !newRun {
					start = prev.T // paused at some moment after the previous record
				}
				pause, reasons = &Event{Kind: Pause, T: start, Replica: -1}, nil
			}
			reasons = union(reasons, r.Paused)
			pause.End = r.T
			pause.Text = pre + "paused: " + strings.Join(reasons, "; ")
		}
	}
	endPause()
	return evs
}

// Duration is a pause's length.
func (e Event) Duration() time.Duration { return time.Duration(e.End-e.T) * time.Millisecond }
