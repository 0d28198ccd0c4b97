package orchestrator

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/extract-dev/extract/configs"
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
	var ignored, notRegular int64
	for _, w := range j.watchers {
		ignored += w.Ignored()
		notRegular += w.NotRegular()
	}
	for reason, n := range map[string]int64{"foreign_name": ignored, "not_regular": notRegular} {
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
	u, err := measureStaging(j.cfg)
	if err != nil {
		return err
	}
	budget := int64(j.cfg.ShmBudget)
	if budget == 0 {
		budget = u.Total / 2
	}
	j.budgets = budgets{
		diskFree: fs.Free, diskReserve: int64(j.cfg.Disk.Reserve),
		shmUsed: u.Bytes, shmBudget: budget, shmFree: u.Free,
		outputDir: j.cfg.OutputDir, shmDir: j.cfg.ShmDir,
	}
	j.metrics.shmBytes.Set(float64(u.Bytes))
	j.metrics.shmBudget.Set(float64(budget))
	j.metrics.diskFree.Set(float64(fs.Free))
	j.metrics.diskReserve.Set(float64(j.cfg.Disk.Reserve))
	return nil
}

// measureStaging sums the usage of every staging dir (one per replica, and those of
// earlier runs); the filesystem's figures are shm_dir's, where they all live. Missing
// dirs are created: a fresh tmpfs after a reboot has none.
func measureStaging(cfg *configs.Config) (shm.Usage, error) {
	var total shm.Usage
	for i, dir := range cfg.StagingDirs() {
		u, err := shm.Measure(dir)
		if err != nil {
			if !os.IsNotExist(errors.Unwrap(err)) {
				return total, err
			}
			if err := os.MkdirAll(dir, 0o700); err != nil { // gone since shm.PrepareDir: ours alone
				return total, fmt.Errorf("create staging dir %s: %w", dir, err)
			}
			// Measured once made: shm_dir's free space is what admission checks.
			if u, err = shm.Measure(dir); err != nil {
				return total, err
			}
		}
		if i == 0 {
			total.Free, total.Total, total.Tmpfs = u.Free, u.Total, u.Tmpfs
		}
		total.Bytes += u.Bytes
		total.Files += u.Files
		total.Partials += u.Partials
	}
	return total, nil
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
	for _, s := range st.Servers {
		m.serverInflight.WithLabelValues(fmt.Sprint(s.Replica)).Set(float64(s.Inflight))
		m.serverInflightTokens.WithLabelValues(fmt.Sprint(s.Replica)).Set(float64(s.InflightTokens))
	}
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
	servers := make([]ServerStatus, len(j.sup.replicas))
	for i, rep := range j.sup.replicas {
		servers[i] = rep.status
	}
	for _, f := range j.inflight {
		if f.replica >= 0 && !f.moving {
			servers[f.replica].Inflight++
			servers[f.replica].InflightTokens += f.tokens
		}
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
		Paused: append([]string{}, j.admission.paused...), Server: servers[0], Servers: servers, Rejected: rejected, AdoptedDumps: j.adopted, GPUs: gpus,
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
