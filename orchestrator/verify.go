package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/extract-dev/extract/checkpoint"
	"github.com/extract-dev/extract/configs"
	"github.com/extract-dev/extract/dataset"
	"github.com/extract-dev/extract/internal/atomicfile"
	"github.com/extract-dev/extract/shm"
)

// VerifyResult is what Verify found and did.
type VerifyResult struct {
	checkpoint.VerifyReport
	// Mismatch says why the config's dataset or job definition is not the index's
	// ("" when they agree); Verify then cannot compare the files with the dataset.
	Mismatch string `json:"mismatch,omitempty"`
	// Rebuild is set when --repair replaced a missing or damaged index.
	Rebuild *Rebuild `json:"rebuild,omitempty"`
}

// Rebuild describes an index rebuilt from the output files.
type Rebuild struct {
	// Why the old index could not be used: "missing", or the damage Open reported.
	Why string `json:"why"`
	// MovedAside is where the old index now lives ("" when there was none).
	MovedAside string `json:"moved_aside,omitempty"`
	// Files is the number of output files found; Adopted of them are done in the new
	// index, Refused are not (wrong sample, dataset, config or content).
	Files   int `json:"files"`
	Adopted int `json:"adopted"`
	Refused int `json:"refused"`
	// AttemptBase is the new index's attempt base: above every attempt the files and
	// the staging and quarantine names show, so no rid is used twice.
	AttemptBase int `json:"attempt_base"`
}

// datasetSource adapts a Dataset to checkpoint.SampleSource.
type datasetSource struct{ ds *dataset.Dataset }

func (s datasetSource) Len() int { return s.ds.Len() }

// Sample returns nil ids for a text sample: the server tokenised it, so the file's ids
// are the truth.
func (s datasetSource) Sample(i int) ([]int64, []int64, error) {
	smp, err := s.ds.Sample(i)
	if err != nil {
		return nil, nil, err
	}
	return smp.InputIDs, smp.LossMask, nil
}

// Verify checks the output files against the index and the dataset: each file's
// dataset and config fingerprints, layers and width, and with opt.Deep its crc32c and
// its tokens against the dataset's. With opt.Repair it returns bad samples to pending
// and adopts valid files the index lacks; a missing or damaged index is moved aside
// (never deleted) and rebuilt from the files. It takes the run lock, so it never races a
// running job; a held lock is ErrTemporary.
func Verify(ctx context.Context, cfg *configs.Config, opt checkpoint.VerifyOptions) (VerifyResult, error) {
	var res VerifyResult
	path := filepath.Join(cfg.StateDir, "index.db")
	ds, err := openExtractedDataset(ctx, cfg)
	if err != nil {
		return res, err
	}
	defer func() { _ = ds.Close() }()
	opt.HiddenSize, opt.Layers, opt.Model = cfg.HiddenSize(), cfg.LayersString(), cfg.ServedModel()
	if cfg.Shard.Sharded() {
		// The shards share the output dir: this shard checks, adopts and rebuilds only
		// its own range, and leaves the others' files alone.
		span := spanOf(cfg, ds.Len())
		opt.Lo, opt.Hi = span.lo, span.hi
	}

	files, err := outputFiles(cfg.OutputDir)
	if err != nil {
		return res, err
	}
	if _, err := os.Lstat(path); errors.Is(err, fs.ErrNotExist) && len(files) == 0 {
		// No job has written here: a wrong output_dir is likelier than a lost index, and
		// an empty index (or even a state dir) would only hide that. Checked before the
		// lock, which would create the state dir.
		return res, fmt.Errorf("%w: no index at %s and no output files under %s: nothing to verify or rebuild (has a job run with this config?)", ErrRefused, path, cfg.OutputDir)
	}
	if opt.Repair {
		// A rebuild needs somewhere to put the lock and the new index, even when the
		// whole state dir was lost.
		if err := atomicfile.MkdirAll(cfg.StateDir, 0o755); err != nil {
			return res, fmt.Errorf("create state dir %s: %w", cfg.StateDir, err)
		}
	}
	if _, err := os.Stat(cfg.StateDir); err == nil {
		lock, err := AcquireLock(cfg.StateDir, "verify")
		var held *HeldError
		if errors.As(err, &held) {
			return res, fmt.Errorf("%w: %v; verify after it stops (`extract status` shows its progress)", ErrTemporary, held)
		}
		if err != nil {
			return res, err
		}
		defer lock.Release()
	}

	why, exists, err := indexTrouble(path)
	if err != nil {
		return res, err
	}
	if why == "" {
		return verifyIndex(ctx, cfg, ds, path, opt)
	}
	if files, err = outputFiles(cfg.OutputDir); err != nil { // again, under the lock
		return res, err
	}
	if !opt.Repair {
		return res, fmt.Errorf("index %s is %s; the %d output files under %s are self-describing: `extract verify --repair` moves the index aside (never deletes it) and rebuilds it from them",
			path, why, len(files), cfg.OutputDir)
	}
	rb, rep, err := rebuild(ctx, cfg, ds, path, why, exists, files, opt)
	if err != nil {
		// What the unfinished index adopted never reached index.db: nothing is repaired.
		rep.Repaired = 0
	}
	res.VerifyReport, res.Rebuild = rep, rb
	return res, err
}

// indexTrouble says why the index at path cannot be used as it is ("" when it can),
// and whether a file is there at all. A damaged file is never handed to bbolt's
// read-write open, which would try to initialise it.
func indexTrouble(path string) (why string, exists bool, err error) {
	if _, err := os.Lstat(path); errors.Is(err, fs.ErrNotExist) {
		return "missing", false, nil
	} else if err != nil {
		return "", false, fmt.Errorf("index %s: %w", path, err)
	}
	ix, err := checkpoint.Open(path, checkpoint.OpenOptions{ReadOnly: true, Timeout: 2 * time.Second})
	switch {
	case errors.Is(err, checkpoint.ErrDamaged):
		return damaged(err), true, nil
	case errors.Is(err, checkpoint.ErrLocked):
		// A doctor or status reads it right now.
		return "", true, fmt.Errorf("%w: %v", ErrTemporary, err)
	case err != nil:
		return "", true, err
	}
	defer func() { _ = ix.Close() }()
	if _, ok, err := ix.Meta(); errors.Is(err, checkpoint.ErrDamaged) {
		return damaged(err), true, nil
	} else if err != nil {
		return "", true, err
	} else if !ok {
		// Created but never initialised: a run or a rebuild died before its first txn.
		return "empty (created, but no job was ever written to it)", true, nil
	}
	return "", true, nil
}

// damaged is why for a damaged index: what checkpoint found, without the path and the
// sentinel's words, which the caller's message already has.
func damaged(err error) string {
	s := err.Error()
	if _, detail, ok := strings.Cut(s, checkpoint.ErrDamaged.Error()+": "); ok {
		s = detail
	}
	return "damaged (" + s + ")"
}

// verifyIndex verifies a usable index. The dataset is compared only if it is the one
// the index's job was made from, and a repair is refused under another config: it
// would take every good file for a bad one and delete it.
func verifyIndex(ctx context.Context, cfg *configs.Config, ds *dataset.Dataset, path string, opt checkpoint.VerifyOptions) (VerifyResult, error) {
	var res VerifyResult
	ix, err := checkpoint.Open(path, checkpoint.OpenOptions{ReadOnly: !opt.Repair, Timeout: 2 * time.Second})
	if errors.Is(err, checkpoint.ErrLocked) {
		return res, fmt.Errorf("%w: %v", ErrTemporary, err)
	}
	if err != nil {
		return res, err
	}
	defer func() { _ = ix.Close() }() // every commit was synced: Close loses nothing
	meta, _, err := ix.Meta()
	if err != nil {
		return res, err
	}
	switch {
	case meta.ShardIndex != cfg.Shard.Index || meta.ShardCount != cfg.Shard.Count:
		res.Mismatch = fmt.Sprintf("index %s records shard %d of %d (0 of 0: unsharded), but this is shard %d of %d", path, meta.ShardIndex, meta.ShardCount, cfg.Shard.Index, cfg.Shard.Count)
	case meta.DatasetFingerprint != ds.Fingerprint:
		res.Mismatch = fmt.Sprintf("dataset %s (%d samples, sha256 %.12s…) is not the one index %s was made from (%s, %d samples, sha256 %.12s…)",
			ds.Path, ds.Len(), ds.Fingerprint, path, meta.DatasetPath, meta.Total, meta.DatasetFingerprint)
	case meta.ConfigFingerprint != cfg.Fingerprint():
		res.Mismatch = fmt.Sprintf("index %s: %s", path, configChange(meta, cfg))
	default:
		opt.Expect = datasetSource{ds}
	}
	if res.Mismatch != "" && opt.Repair {
		return res, fmt.Errorf("%w: %s: --repair would send every file made under the index's job back to pending and delete it; restore the config the job ran with, or start over with `extract run --fresh`", ErrRefused, res.Mismatch)
	}
	res.VerifyReport, err = checkpoint.Verify(ctx, ix, cfg.OutputDir, meta.Total, opt)
	return res, err
}

// rebuild moves an unusable index aside and builds a new one from the output files.
// The new index is built under a temporary name and renamed into place only when
// complete, so a rebuild that dies leaves no half-adopted index for a run to resume from.
func rebuild(ctx context.Context, cfg *configs.Config, ds *dataset.Dataset, path, why string, exists bool, files []string, opt checkpoint.VerifyOptions) (*Rebuild, checkpoint.VerifyReport, error) {
	rb := &Rebuild{Why: why, Files: len(ownedFiles(files, opt))}
	var rep checkpoint.VerifyReport
	if exists {
		aside, err := checkpoint.MoveAside(path)
		if err != nil {
			return rb, rep, err
		}
		rb.MovedAside = aside
	}
	base, err := attemptsSeen(cfg, files)
	if err != nil {
		return rb, rep, err
	}
	// Attempts that left no trace (a sample whose every attempt of one run failed without
	// a dump) were known only to the lost index: run.max_attempts of headroom covers them.
	rb.AttemptBase = base + cfg.Run.MaxAttempts

	tmp := path + ".rebuild"
	// Only extract writes this name: it is a rebuild that died before its rename.
	if err := os.Remove(tmp); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return rb, rep, fmt.Errorf("remove unfinished rebuild %s: %w", tmp, err)
	}
	ix, err := checkpoint.Open(tmp, checkpoint.OpenOptions{Timeout: 2 * time.Second})
	if err != nil {
		return rb, rep, err
	}
	defer func() {
		if ix != nil {
			_ = ix.Close()
		}
	}()
	err = ix.Init(checkpoint.Meta{
		DatasetFingerprint: ds.Fingerprint, DatasetPath: ds.Path, ConfigFingerprint: cfg.Fingerprint(),
		ConfigFields: strings.Join(cfg.FingerprintFields(), "\n"), Total: ds.Len(), Created: time.Now().UTC(), AttemptBase: rb.AttemptBase,
		OutputFormat: outputLayout(cfg).Name(), ShardIndex: cfg.Shard.Index, ShardCount: cfg.Shard.Count,
	})
	if err != nil {
		return rb, rep, fmt.Errorf("initialise rebuilt index %s: %w", tmp, err)
	}
	opt.Repair, opt.Expect = true, datasetSource{ds}
	rep, err = checkpoint.Verify(ctx, ix, cfg.OutputDir, ds.Len(), opt)
	if err != nil {
		return rb, rep, fmt.Errorf("rebuild index from %s: %w", cfg.OutputDir, err)
	}
	c, err := ix.Counters()
	if err != nil {
		return rb, rep, err
	}
	rb.Adopted = c.Done
	rb.Refused = rb.Files - rb.Adopted
	// In a rebuild every file is an orphan: the count says how many were adopted, and
	// only the refusals need a line each.
	rep.Problems = slices.DeleteFunc(rep.Problems, func(p string) bool { return strings.HasSuffix(p, ": orphan adopted") })
	err = ix.Close()
	ix = nil
	if err != nil {
		return rb, rep, err
	}
	if err := os.Rename(tmp, path); err != nil {
		return rb, rep, fmt.Errorf("put rebuilt index in place: %w", err)
	}
	if err := atomicfile.SyncDir(filepath.Dir(path)); err != nil {
		return rb, rep, fmt.Errorf("put rebuilt index %s in place: %w", path, err)
	}
	return rb, rep, nil
}

// outputFiles lists the output files under outputDir by name (rows_*/data_*.safetensors),
// without reading them.
func outputFiles(outputDir string) ([]string, error) {
	files, err := filepath.Glob(filepath.Join(outputDir, "rows_*", "data_*.safetensors"))
	if err != nil {
		return nil, fmt.Errorf("list output files in %s: %w", outputDir, err)
	}
	return files, nil
}

// ownedFiles are the files of the samples in opt's range (a shard's; every file when
// unsharded): what a rebuild of this index can adopt.
func ownedFiles(files []string, opt checkpoint.VerifyOptions) []string {
	if opt.Hi == 0 {
		return files
	}
	var own []string
	for _, f := range files {
		if s, ok := (checkpoint.Layout{}).SampleOf(filepath.Base(f)); ok && s >= opt.Lo && s < opt.Hi {
			own = append(own, f)
		}
	}
	return own
}

// jobFiles counts the output files of cfg's layout under its output dir whose names
// say a sample of span: what a lost index leaves behind. Names and types only; nothing
// is opened (a directory at an output path is a blocked sample, not a lost file).
func jobFiles(cfg *configs.Config, span shardSpan) (int, error) {
	l := outputLayout(cfg)
	dirs, err := l.DataDirs()
	if err != nil {
		return 0, err
	}
	n := 0
	for _, dir := range dirs {
		entries, err := os.ReadDir(dir)
		if err != nil {
			return 0, fmt.Errorf("list output files in %s: %w", dir, err)
		}
		for _, e := range entries {
			if s, ok := l.SampleOf(e.Name()); ok && e.Type().IsRegular() && span.owns(s) {
				n++
			}
		}
	}
	return n, nil
}

// lostIndex refuses a run that would start a new index over a lost one's files: the
// files describe themselves, and `verify --repair` rebuilds the index from them in
// seconds, where a new job would recompute every sample (and overwrite the files).
func lostIndex(cfg *configs.Config, ds *dataset.Dataset, path string) error {
	n, err := jobFiles(cfg, spanOf(cfg, ds.Len()))
	if err != nil || n == 0 {
		return err
	}
	return fmt.Errorf("%w: index %s has no job, but %d output files of this job's samples are under %s: the index was lost; `extract verify --repair` rebuilds it from the files (they are self-describing), then `extract run --resume` continues; `extract run --fresh` would recompute every sample",
		ErrPreflight, path, n, cfg.OutputDir)
}

// attemptsSeen is the highest attempt any trace of the job shows: the rids in the
// output files' metadata, and the dump names in the staging dirs (complete, partial, or
// held for quarantine) and in the quarantine dir. Names only: nothing in staging is
// opened (invariant 8).
func attemptsSeen(cfg *configs.Config, files []string) (int, error) {
	high := 0
	for _, f := range files {
		info, err := checkpoint.ReadOutput(f, false)
		if err != nil {
			continue // not adoptable either; its rid cannot be trusted
		}
		if r, err := shm.ParseRID(info.RID); err == nil {
			high = max(high, r.Attempt)
		}
	}
	// Every staging dir: shm_dir and each replica's shm_dir/r<k> (server.replicas).
	for _, dir := range append(cfg.StagingDirs(), filepath.Join(cfg.StateDir, "quarantine")) {
		entries, err := os.ReadDir(dir)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("read %s for the attempts it shows: %w", dir, err)
		}
		for _, e := range entries {
			name := strings.TrimPrefix(e.Name(), heldPrefix)
			name = strings.TrimSuffix(name, shm.PartialSuffix)
			if r, ok := shm.ParseDumpName(name); ok {
				high = max(high, r.Attempt)
			}
		}
	}
	return high, nil
}
