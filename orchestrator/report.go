package orchestrator

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/extract-dev/extract/internal/atomicfile"
	"github.com/extract-dev/extract/shm"
)

// reject counts a dump (or an event) that was not accepted, by reason.
func (j *job) reject(reason string) {
	j.rejected[reason]++
	j.metrics.rejected.WithLabelValues(reason).Inc()
}

// countWatcherFindings reports what the watcher saw but never opened: names in the
// staging dir that are not dumps, and dump names that are not regular files.
func (j *job) countWatcherFindings() {
	for reason, n := range map[string]int64{"foreign_name": j.watcher.Ignored(), "not_regular": j.watcher.NotRegular()} {
		if d := n - j.rejected[reason]; d > 0 {
			j.rejected[reason] += d
			j.metrics.rejected.WithLabelValues(reason).Add(float64(d))
		}
	}
}

// measure refreshes the disk and staging usage that admission checks.
func (j *job) measure() error {
	fs, err := shm.StatFS(j.cfg.OutputDir)
	if err != nil {
		return err
	}
	u, err := shm.Measure(j.cfg.ShmDir)
	if err != nil {
		if !os.IsNotExist(errors.Unwrap(err)) {
			return err
		}
		if err := os.MkdirAll(j.cfg.ShmDir, 0o755); err != nil {
			return fmt.Errorf("create staging dir %s: %w", j.cfg.ShmDir, err)
		}
	}
	budget := int64(j.cfg.ShmBudget)
	if budget == 0 {
		budget = u.Total / 2
	}
	j.budgets = budgets{
		diskFree: fs.Free, diskReserve: int64(j.cfg.Disk.Reserve),
		shmUsed: u.Bytes, shmBudget: budget,
		outputDir: j.cfg.OutputDir, shmDir: j.cfg.ShmDir,
	}
	j.metrics.shmBytes.Set(float64(u.Bytes))
	j.metrics.diskFree.Set(float64(fs.Free))
	return nil
}

// publish refreshes the live status and metrics.
func (j *job) publish() {
	c := j.ledger.c
	j.rates.add(ratePoint{at: time.Now(), samples: int64(c.Done), tokens: c.Tokens, byts: c.BytesWritten})
	st := j.snapshot()
	if j.status != nil {
		j.status.set(st)
	}
	m := j.metrics
	m.total.Set(float64(st.Total))
	m.done.Set(float64(st.Done))
	m.failed.Set(float64(st.Failed))
	m.inflight.Set(float64(st.Inflight))
	m.bytesWritten.Set(float64(st.BytesWritten))
	if j.opt.OnStatus != nil {
		j.opt.OnStatus(st)
	}
}

func (j *job) snapshot() Status {
	now := time.Now()
	sps, tps, bps := j.rates.rates()
	c := j.ledger.c
	remaining := j.ledger.remaining()
	eta := -1.0
	if remaining == 0 {
		eta = 0
	} else if sps > 0 {
		eta = float64(remaining) / sps
	}
	rejected := make(map[string]int64, len(j.rejected))
	for k, v := range j.rejected {
		rejected[k] = v
	}
	started := j.started.UTC()
	var gpus []GPUStatus
	if p := j.gpus.Load(); p != nil {
		gpus = *p
	}
	state := "running"
	if remaining == 0 && c.Failed == 0 {
		state = "complete"
	}
	return Status{
		State: state, Source: "live", PID: os.Getpid(),
		Total: j.ledger.size(), DatasetSamples: j.ds.Len(), Done: c.Done, Failed: c.Failed, Pending: remaining,
		Inflight: len(j.inflight), BytesWritten: c.BytesWritten, Imported: c.Imported,
		SamplesPerSecond: sps, TokensPerSecond: tps, BytesPerSecond: bps, ETASeconds: eta,
		Paused: append([]string{}, j.admission.paused...), Server: j.server, Rejected: rejected, AdoptedDumps: j.adopted, GPUs: gpus,
		Dataset: j.ds.Path, OutputDir: j.cfg.OutputDir, StartedAt: &started, UpdatedAt: now.UTC(),
	}
}

func (j *job) logProgress() {
	st := j.snapshot()
	j.log.Info("progress", "done", st.Done, "total", st.Total, "failed", st.Failed, "inflight", st.Inflight,
		"samples_per_second", fmt.Sprintf("%.2f", st.SamplesPerSecond), "bytes_written", st.BytesWritten,
		"eta", time.Duration(st.ETASeconds*float64(time.Second)).Round(time.Second), "paused", strings.Join(st.Paused, "; "))
}

// writeProgress leaves a snapshot in state_dir for `extract status` while the live
// endpoint is not answering.
func (j *job) writeProgress() {
	b, err := json.MarshalIndent(j.snapshot(), "", "  ")
	if err == nil {
		err = atomicfile.WriteFile(progressPath(j.cfg.StateDir), b, 0o644)
	}
	if err != nil {
		j.log.Warn("write progress snapshot", "err", err)
	}
}
