// Package history keeps a job's past in its state dir: a bounded, append-only time
// series of what `extract status` shows, one record every few seconds, so that a report
// can answer what a snapshot cannot (did the rate drop after the 3 a.m. restart, which
// replica stalls, when did the disk pause start).
//
// The file (history.log) is a header and a sequence of frames: length, crc32c, JSON
// record. A frame torn by a crash or a power cut fails its checksum and is ignored; the
// next writer truncates it away before it appends. Every append is fdatasync'd, so a
// power cut loses at most the record being written. Compaction rewrites the file the
// crash-safe way (temp, fsync, rename, fsync dir) with old records thinned by age
// (Tiers), so that a 10-day job's history stays well under a few MB.
//
// The decisions are values tested without I/O: when a record is due (sampler), which
// records compaction keeps (Compact), how shards' histories add up (Merge) and which
// events a history shows (Events). The package keeps no invariant of the pipeline's:
// history is for people, and a failure to write it never stops a run (the caller logs
// it).
package history

import (
	"slices"
	"time"
)

// Record is the job's state at one moment, as one run saw it.
type Record struct {
	// T is when, in Unix milliseconds.
	T int64 `json:"t"`
	// Run is when the run that wrote the record started (Unix milliseconds): a change
	// between records is a new run (a restart of extract itself).
	Run int64 `json:"run"`
	PID int   `json:"pid,omitempty"`
	// State is running, stopped or complete.
	State string `json:"st,omitempty"`

	Total  int   `json:"n"`
	Done   int   `json:"d"`
	Failed int   `json:"f,omitempty"`
	Bytes  int64 `json:"b,omitempty"`
	Tokens int64 `json:"tk,omitempty"`
	// Inflight counts the samples sent and not yet done.
	Inflight int `json:"i,omitempty"`
	// Rate is samples per second over the run's recent window.
	Rate float64 `json:"r,omitempty"`
	// Rejected counts the dumps not accepted in this run, Quarantined those of them
	// kept aside for a person to look at.
	Rejected    int64 `json:"rj,omitempty"`
	Quarantined int64 `json:"q,omitempty"`
	// Paused lists why admission paused (the reasons' stable prefixes) at any moment
	// since the previous record: a pause shorter than the record interval still shows.
	Paused   []string  `json:"p,omitempty"`
	Replicas []Replica `json:"rs,omitempty"`

	StagingBytes  int64 `json:"sb,omitempty"`
	StagingBudget int64 `json:"sg,omitempty"`
	DiskFree      int64 `json:"df,omitempty"`
	DiskReserve   int64 `json:"dr,omitempty"`
}

// Replica is one server of the run at that moment.
type Replica struct {
	// State is starting, ready, restarting or stopped.
	State    string `json:"s,omitempty"`
	Inflight int    `json:"i,omitempty"`
	// Done counts the samples finished through this replica in this run, Restarts its
	// restarts in this run: both only grow within a run.
	Done     int `json:"d,omitempty"`
	Restarts int `json:"r,omitempty"`
}

// Time is the record's moment.
func (r Record) Time() time.Time { return time.UnixMilli(r.T).UTC() }

// Millis is t in the records' unit.
func Millis(t time.Time) int64 { return t.UnixMilli() }

// changed says whether b shows something a person would want marked that a is silent
// on: a new run, a pause reason, a replica's state or restart count, new failures. Such
// a record is written without waiting for the interval.
func changed(a, b Record) bool {
	if a.Run != b.Run || a.State != b.State || a.Failed != b.Failed || a.Quarantined != b.Quarantined ||
		!slices.Equal(a.Paused, b.Paused) || len(a.Replicas) != len(b.Replicas) {
		return true
	}
	for i := range a.Replicas {
		if a.Replicas[i].State != b.Replicas[i].State || a.Replicas[i].Restarts != b.Replicas[i].Restarts {
			return true
		}
	}
	return false
}

// union is the sorted set of both lists' reasons.
func union(a, b []string) []string {
	if len(b) == 0 {
		return a
	}
	out := append(append([]string{}, a...), b...)
	slices.Sort(out)
	return slices.Compact(out)
}
