package orchestrator

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/extract-dev/extract/configs"
	"github.com/extract-dev/extract/orchestrator/generate"
)

// JobStatus is `extract status --all`: the whole job across every shard of its plan.
type JobStatus struct {
	State            string  `json:"state"` // running | stopped | complete
	Shards           int     `json:"shards"`
	Total            int     `json:"total"`
	Done             int     `json:"done"`
	Failed           int     `json:"failed"`
	Pending          int     `json:"pending"`
	BytesWritten     int64   `json:"bytes_written"`
	SamplesPerSecond float64 `json:"samples_per_second"`
	// ETASeconds is the slowest running shard's; -1 when a shard with work left has no
	// run (it finishes only once restarted) or no running shard has a rate yet.
	ETASeconds float64 `json:"eta_seconds"`
	// Dead lists the shards with no live process that are not complete: the ones to
	// resubmit (or that were never started).
	Dead      []int         `json:"dead"`
	PerShard  []ShardStatus `json:"per_shard"`
	StateDir  string        `json:"state_dir"`
	OutputDir string        `json:"output_dir"`
	// Generate sums the shards' generate stages, when any ran.
	Generate *generate.Status `json:"generate,omitempty"`
}

// ShardStatus is one shard's row.
type ShardStatus struct {
	Shard    int    `json:"shard"`
	StateDir string `json:"state_dir"`
	// State is running, stopped or complete, or "not started" when the shard has no
	// index yet.
	State            string    `json:"state"`
	Dead             bool      `json:"dead"`
	Source           string    `json:"source"` // live | snapshot | lock | index | plan
	PID              int       `json:"pid,omitempty"`
	Host             string    `json:"host,omitempty"`
	First            int       `json:"first"`
	End              int       `json:"end"`
	Total            int       `json:"total"`
	Done             int       `json:"done"`
	Failed           int       `json:"failed"`
	Pending          int       `json:"pending"`
	BytesWritten     int64     `json:"bytes_written"`
	SamplesPerSecond float64   `json:"samples_per_second"`
	ETASeconds       float64   `json:"eta_seconds"`
	UpdatedAt        time.Time `json:"updated_at"`
	Error            string    `json:"error,omitempty"`
	// Generate is the shard's generate stage, when one ran.
	Generate *generate.Status `json:"generate,omitempty"`
	dataset  int              // the dataset's size as the shard knows it; 0 unknown
}

// liveTimeout bounds asking a running shard on this host: status --all must answer in
// well under a second even when a shard's endpoint hangs; its snapshot stands in.
const liveTimeout = 150 * time.Millisecond

// QueryStatusAll finds the job's plan under its state dir and reads every shard: a
// running one from its live endpoint when it runs on this host, else from the snapshot
// it leaves in its state dir (shards on other nodes share the dir, not the loopback);
// a stopped one from its index, opened read-only. Shards are read in parallel.
func QueryStatusAll(ctx context.Context, cfg *configs.Config) (JobStatus, error) {
	base := cfg.JobStateDir()
	js := JobStatus{StateDir: base, OutputDir: cfg.OutputDir, Dead: []int{}, ETASeconds: -1}
	plans, err := planDirs(base)
	if err != nil {
		return js, err
	}
	n, unsharded := cfg.Shard.Count, false
	switch {
	case len(plans) > 1:
		var ns []int
		for m := range plans {
			ns = append(ns, m)
		}
		slices.Sort(ns)
		return js, fmt.Errorf("%w: state dir %s holds more than one plan (%v shards): move the old one aside", ErrRefused, base, ns)
	case len(plans) == 1:
		for m := range plans {
			n = m
		}
	case n == 0:
		if _, err := os.Stat(filepath.Join(base, "index.db")); err == nil {
			n, unsharded = 1, true // an unsharded job is the plan of one
		} else {
			return js, fmt.Errorf("%w: no shard state under %s (shard-<i>-of-<n> dirs): has a sharded run started with this config?", ErrRefused, base)
		}
	}
	js.Shards = n
	rows := make([]ShardStatus, n)
	var wg sync.WaitGroup
	for i := range rows {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := *cfg
			c.StateDir, c.Shard = filepath.Join(base, configs.ShardDirName(i, n)), configs.Shard{Index: i, Count: n}
			if unsharded {
				c.StateDir, c.Shard = base, configs.Shard{}
			}
			rows[i] = shardStatus(ctx, &c, i)
			rows[i].Generate = GenerateStatus(c.StateDir)
		}()
	}
	wg.Wait()
	// A shard without an index knows its range only from the dataset's size: take it
	// from any shard's index before counting the dataset's lines.
	total := -1
	for _, r := range rows {
		if r.dataset > 0 {
			total = r.dataset
		}
	}
	for i := range rows {
		r := &rows[i]
		if r.dataset == 0 {
			if total < 0 {
				if total, err = countLines(cfg.Dataset); err != nil {
					return js, fmt.Errorf("count the dataset's samples: %w", err)
				}
			}
			r.First, r.End = ShardRange(total, i, n)
			// Figures unknown (not started, not reporting yet, unreadable): the whole
			// range counts as pending, so the job's totals still add up to the dataset.
			r.Total, r.Pending = r.End-r.First, r.End-r.First
		}
	}
	js.finish(rows)
	js.Generate = sumGenerate(rows)
	return js, nil
}

// finish sums the rows into the job's figures.
func (js *JobStatus) finish(rows []ShardStatus) {
	running, complete, stuck := 0, 0, false
	eta := 0.0
	for i := range rows {
		r := &rows[i]
		js.Total += r.Total
		js.Done += r.Done
		js.Failed += r.Failed
		js.Pending += r.Pending
		js.BytesWritten += r.BytesWritten
		switch r.State {
		case "running":
			running++
			js.SamplesPerSecond += r.SamplesPerSecond
			if r.ETASeconds < 0 {
				stuck = true
			}
			eta = max(eta, r.ETASeconds)
		case "complete":
			complete++
		default:
			r.Dead = true
			js.Dead = append(js.Dead, r.Shard)
			stuck = true
		}
	}
	js.PerShard = rows
	switch {
	case complete == len(rows):
		js.State, js.ETASeconds = "complete", 0
	case running > 0:
		js.State = "running"
	default:
		js.State = "stopped"
	}
	if js.State == "running" && !stuck {
		js.ETASeconds = eta
	}
}

// shardStatus reads one shard; a failure is the row's Error, never the whole answer's.
func shardStatus(ctx context.Context, cfg *configs.Config, i int) ShardStatus {
	r := ShardStatus{Shard: i, StateDir: cfg.StateDir, ETASeconds: -1}
	if _, err := os.Stat(cfg.StateDir); os.IsNotExist(err) {
		r.State, r.Source = "not started", "plan"
		return r
	}
	var st Status
	if h, held := LockHolder(cfg.StateDir); held && h.IsRun() {
		pid := h.PID
		r.PID = pid
		ri, riErr := readRunInfo(cfg.StateDir)
		r.Host = ri.Host
		host, _ := os.Hostname()
		var err error = fmt.Errorf("runs on %s", ri.Host)
		if riErr == nil && (ri.Host == "" || ri.Host == host) {
			lctx, cancel := context.WithTimeout(ctx, liveTimeout)
			st, err = queryLive(lctx, cfg.StateDir)
			cancel()
		}
		if err != nil {
			st, err = readSnapshot(cfg.StateDir)
			if err != nil {
				// Started, not yet reporting: running, figures unknown.
				r.State, r.Source = "running", "lock"
				return r
			}
			st.Source = "snapshot"
		}
		st.State = "running"
		if st.PID == 0 {
			st.PID = pid
		}
	} else {
		if _, err := os.Stat(filepath.Join(cfg.StateDir, "index.db")); os.IsNotExist(err) {
			r.State, r.Source = "not started", "plan"
			return r
		}
		var err error
		if st, err = statusFromIndex(cfg); err != nil {
			r.State, r.Source, r.Error = "stopped", "index", err.Error()
			return r
		}
	}
	r.State, r.Source, r.PID = st.State, st.Source, st.PID
	r.Total, r.Done, r.Failed, r.Pending = st.Total, st.Done, st.Failed, st.Pending
	r.BytesWritten, r.SamplesPerSecond, r.ETASeconds, r.UpdatedAt = st.BytesWritten, st.SamplesPerSecond, st.ETASeconds, st.UpdatedAt
	r.First, r.End = ShardRange(st.DatasetSamples, cfg.Shard.Index, cfg.Shard.Count)
	r.dataset = st.DatasetSamples
	return r
}

func readSnapshot(stateDir string) (Status, error) {
	var st Status
	b, err := os.ReadFile(progressPath(stateDir))
	if err != nil {
		return st, err
	}
	return st, json.Unmarshal(b, &st)
}
