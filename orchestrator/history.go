package orchestrator

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"net/http"
	"path/filepath"
	"strings"
	"time"

	"github.com/extract-dev/extract/configs"
	"github.com/extract-dev/extract/internal/history"
	"github.com/extract-dev/extract/internal/report"
)

// HistoryPath is where a run keeps its history in its state dir.
func HistoryPath(stateDir string) string { return filepath.Join(stateDir, history.FileName) }

// openHistory starts recording the run's history and serves the report from the
// status endpoint. A history that cannot be opened is logged and the run goes on
// without one: it is for people, and no sample depends on it.
func (j *job) openHistory() {
	w, err := history.Open(HistoryPath(j.cfg.StateDir), history.Options{Log: j.log})
	if err != nil {
		j.log.Warn("no history this run", "err", err)
	}
	j.history = w
	if j.status != nil {
		serveReport(j.status, j.cfg)
	}
}

// recordHistory offers the current state to the history, which keeps one record every
// few seconds and one at each change.
func (j *job) recordHistory() {
	if j.history != nil {
		j.history.Append(historyRecord(j.snapshot(), j.budgets, j.started, j.ledger.c.Tokens))
	}
}

// closeHistory records how the run ends.
func (j *job) closeHistory() {
	if j.history == nil {
		return
	}
	r := historyRecord(j.snapshot(), j.budgets, j.started, j.ledger.c.Tokens)
	if r.State == "running" {
		r.State = "stopped"
	}
	if err := j.history.Close(r); err != nil {
		j.log.Warn("close history", "err", err)
	}
}

// quarantineReasons are the reject reasons whose dumps are kept aside, not deleted.
var quarantineReasons = []string{"unknown_sample", "malformed"}

// historyRecord is one status snapshot as the history keeps it: pause reasons cut to
// their stable prefix (the figures in them change every tick), the rate to three
// decimals.
func historyRecord(st Status, b budgets, run time.Time, tokens int64) history.Record {
	r := history.Record{
		T: st.UpdatedAt.UnixMilli(), Run: run.UnixMilli(), PID: st.PID, State: st.State,
		Total: st.Total, Done: st.Done, Failed: st.Failed, Bytes: st.BytesWritten, Tokens: tokens,
		Inflight: st.Inflight, Rate: math.Round(st.SamplesPerSecond*1000) / 1000,
		StagingBytes: b.shmUsed, StagingBudget: b.shmBudget, DiskFree: b.diskFree, DiskReserve: b.diskReserve,
	}
	for reason, n := range st.Rejected {
		r.Rejected += n
		for _, q := range quarantineReasons {
			if reason == q {
				r.Quarantined += n
			}
		}
	}
	for _, p := range st.Paused {
		r.Paused = append(r.Paused, pauseKey(p))
	}
	for _, s := range st.Servers {
		r.Replicas = append(r.Replicas, history.Replica{State: s.State, Inflight: s.Inflight, Done: s.Done, Restarts: s.Restarts})
	}
	return r
}

// pauseKey is the stable prefix of a pause reason.
func pauseKey(p string) string {
	for _, k := range pauseReasons {
		if strings.HasPrefix(p, k) {
			return k
		}
	}
	if len(p) > 60 {
		p = p[:60]
	}
	return p
}

// ReportInput gathers what `extract report` shows of cfg's job: its status and its
// history, or with all every shard's of the plan under the state dir, merged.
func ReportInput(ctx context.Context, cfg *configs.Config, all bool) (report.Input, error) {
	now := time.Now()
	if !all {
		st, err := QueryStatus(ctx, cfg)
		if err != nil {
			return report.Input{}, err
		}
		return statusReport(cfg, st, now), nil
	}
	js, err := QueryStatusAll(ctx, cfg)
	if err != nil {
		return report.Input{}, err
	}
	var shards []history.Shard
	var notes []string
	for _, row := range js.PerShard {
		name := fmt.Sprint(row.Shard)
		if js.Shards == 1 {
			name = ""
		}
		recs, note := readHistory(row.StateDir)
		if note != "" {
			notes = append(notes, fmt.Sprintf("shard %d: %s", row.Shard, note))
		}
		shards = append(shards, history.Shard{Name: name, Records: recs})
	}
	if len(js.Dead) > 0 {
		notes = append(notes, fmt.Sprintf("dead shards %v: no live process and not complete; resubmit them", js.Dead))
	}
	in := report.Input{
		Title:  fmt.Sprintf("extract report: %s, %d shards", shortDir(js.OutputDir), js.Shards),
		Now:    now,
		Series: history.Merge(shards),
		Facts: report.Facts{State: js.State, Total: js.Total, Done: js.Done, Failed: js.Failed, Pending: js.Pending,
			BytesWritten: js.BytesWritten, SamplesPerSecond: js.SamplesPerSecond, ETASeconds: js.ETASeconds,
			OutputDir: js.OutputDir, DiskReserve: int64(cfg.Disk.Reserve), Notes: notes},
	}
	for _, row := range js.PerShard {
		in.Facts.Servers = append(in.Facts.Servers, report.Server{Name: fmt.Sprintf("shard %d", row.Shard), State: row.State})
	}
	return in, nil
}

// statusReport is the report of one job (or shard) from its status and history.
func statusReport(cfg *configs.Config, st Status, now time.Time) report.Input {
	recs, note := readHistory(cfg.StateDir)
	title := "extract report: " + shortDir(cfg.OutputDir)
	if cfg.Shard.Count > 0 {
		title += fmt.Sprintf(", shard %d of %d", cfg.Shard.Index, cfg.Shard.Count)
	}
	in := report.Input{
		Title:  title,
		Now:    now,
		Series: history.Merge([]history.Shard{{Records: recs}}),
		Facts: report.Facts{State: st.State, Total: st.Total, Done: st.Done, Failed: st.Failed, Pending: st.Pending,
			BytesWritten: st.BytesWritten, SamplesPerSecond: st.SamplesPerSecond, ETASeconds: st.ETASeconds,
			Paused: st.Paused, OutputDir: st.OutputDir, DiskReserve: int64(cfg.Disk.Reserve)},
	}
	if note != "" {
		in.Facts.Notes = []string{note}
	}
	if st.State == "running" {
		for _, s := range st.Servers {
			in.Facts.Servers = append(in.Facts.Servers, report.Server{Name: fmt.Sprintf("replica %d", s.Replica), State: s.State, Restarts: s.Restarts, Inflight: s.Inflight})
		}
	}
	return in
}

// shortDir is a long path's last two elements, for a title (the header names it whole).
func shortDir(dir string) string {
	if len(dir) <= 48 {
		return dir
	}
	return "…/" + filepath.Join(filepath.Base(filepath.Dir(dir)), filepath.Base(dir))
}

// readHistory reads a state dir's history for a report; what went wrong is a note for
// the reader, not an error: the status is worth showing without it.
func readHistory(stateDir string) ([]history.Record, string) {
	d, err := history.ReadFile(HistoryPath(stateDir))
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil, ""
	case err != nil:
		return nil, "history unreadable: " + err.Error()
	case d.Skipped > 0:
		return d.Records, fmt.Sprintf("history: %d damaged bytes skipped", d.Skipped)
	}
	return d.Records, ""
}

// serveReport adds the report to the status endpoint: /report (HTML) and /report.png.
// Both only read, and only answer GET and HEAD.
func serveReport(s *statusServer, cfg *configs.Config) {
	page := func(contentType string, write func(*bytes.Buffer, report.Input) error) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			if r.Method != http.MethodGet && r.Method != http.MethodHead {
				w.Header().Set("Allow", "GET, HEAD")
				http.Error(w, "read-only: GET or HEAD", http.StatusMethodNotAllowed)
				return
			}
			var b bytes.Buffer
			if err := write(&b, statusReport(cfg, s.get(), time.Now())); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			w.Header().Set("Content-Type", contentType)
			w.Header().Set("Content-Security-Policy", report.CSP)
			w.Header().Set("X-Content-Type-Options", "nosniff")
			w.Header().Set("Cache-Control", "no-store")
			w.Write(b.Bytes())
		}
	}
	s.mux.Handle("/report", page("text/html; charset=utf-8", func(b *bytes.Buffer, in report.Input) error { return report.WriteHTML(b, in) }))
	s.mux.Handle("/report.png", page("image/png", func(b *bytes.Buffer, in report.Input) error { return report.WritePNG(b, in) }))
}

// RecentRates is the job's rate over the last span (or since its history began) in n
// slots, from its history, for a sparkline; the span drawn is 0 when there is none.
func RecentRates(cfg *configs.Config, span time.Duration, n int) (rates []float64, hi float64, drawn time.Duration) {
	recs, _ := readHistory(cfg.StateDir)
	if len(recs) == 0 {
		return nil, 0, 0
	}
	return report.RecentRates(recs, time.Now(), span, n)
}
