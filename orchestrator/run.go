package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/extract-dev/extract/checkpoint"
	"github.com/extract-dev/extract/configs"
	"github.com/extract-dev/extract/dataset"
	"github.com/extract-dev/extract/doctor"
	"github.com/extract-dev/extract/internal/errclass"
	"github.com/extract-dev/extract/sglang"
	"github.com/extract-dev/extract/shm"
)

// Errors that map to the CLI's exit codes.
var (
	// ErrRefused: the job cannot start as asked; the message says what to do (exit 2).
	ErrRefused = errclass.ErrRefused
	// ErrPreflight: the node is not fit to run (exit 3).
	ErrPreflight = errclass.ErrPreflight
	// ErrTemporary: worth a retry later, e.g. by cron (exit 75).
	ErrTemporary = errclass.ErrTemporary
)

// Outcome says how a run ended without error.
type Outcome int

// The outcomes of a run that returns no error.
const (
	Finished Outcome = iota
	AlreadyComplete
	AlreadyRunning
	Stopped
)

// RunOptions are the run command's choices.
type RunOptions struct {
	Resume bool
	Fresh  bool
	// Executable is this binary, launched as the simulator for server.kind simulator.
	Executable string
	// ConfigFile is the config file the job was loaded from, if any; doctor warns when
	// it lives where a reboot wipes it.
	ConfigFile string
	Log        *slog.Logger
	// OnStatus, when set, is called with each status snapshot (about once a second).
	OnStatus func(Status)
	// seams replace parts of the run in in-process tests (run_inprocess_test.go); zero
	// in production.
	seams runSeams
}

// runSeams are what an in-process test of Run replaces.
type runSeams struct {
	// newServer wraps each replica's Manager into the server the run drives: the
	// simulator in this process instead of a child.
	newServer func(*sglang.Manager) serverProcess
	// restartBackoff replaces restartBackoff, so a restart test need not wait a second.
	restartBackoff func(n int) time.Duration
}

// Result describes a finished run.
type Result struct {
	Outcome   Outcome
	HolderPID int // AlreadyRunning: who holds the lock
	Total     int
	Done      int
	Failed    int
	Bytes     int64
	OutputDir string
	Elapsed   time.Duration
	// Rejected counts the dumps this run did not accept, by reason (as status's
	// rejected); the malformed ones are kept in QuarantineDir when room allows.
	Rejected      map[string]int64
	QuarantineDir string
}

// Run runs the job to completion or until ctx is cancelled (a graceful stop).
func Run(ctx context.Context, cfg *configs.Config, opt RunOptions) (Result, error) {
	started := time.Now()
	res := Result{OutputDir: cfg.OutputDir}
	if opt.Resume && opt.Fresh {
		return res, fmt.Errorf("%w: --resume and --fresh exclude each other", ErrRefused)
	}
	if opt.Log == nil {
		opt.Log = slog.Default()
	}
	// A cron-started run must leave at once when another holds the lock, before it reads
	// a large dataset.
	if h, held := LockHolder(cfg.StateDir); held {
		return alreadyHeld(cfg, h)
	}
	// Before the dataset is read: a changed split is a usage error whatever the data.
	if err := checkShardPlan(cfg); err != nil {
		return res, err
	}
	// A conversation file is prepared first (conversations.go); the run reads the result.
	dsPath, err := runDataset(ctx, cfg, opt)
	var prepHeld errPrepareHeld
	if errors.As(err, &prepHeld) {
		return Result{Outcome: AlreadyRunning, HolderPID: prepHeld.pid, OutputDir: cfg.OutputDir}, nil
	}
	if err != nil {
		return res, err
	}
	dsCfg := *cfg // the prepared file, when the dataset is a conversation file
	dsCfg.Dataset = dsPath
	ds, err := dataset.OpenCached(ctx, &dsCfg)
	if err != nil {
		return res, err
	}
	defer func() { _ = ds.Close() }()
	res.Total = spanOf(cfg, ds.Len()).size()
	if err := doctor.MakeJobDirs(cfg); err != nil {
		return res, err // ErrPreflight: exit 3, as doctor reports the same dir
	}
	lock, err := AcquireLock(cfg.StateDir, "run")
	var held *HeldError
	if errors.As(err, &held) {
		return alreadyHeld(cfg, held.Holder)
	}
	if err != nil {
		return res, err
	}
	defer lock.Release()

	indexPath := filepath.Join(cfg.StateDir, "index.db")
	if _, err := os.Lstat(indexPath); errors.Is(err, fs.ErrNotExist) && !opt.Fresh {
		if err := lostIndex(cfg, ds, indexPath); err != nil {
			return res, err
		}
	}
	ix, err := checkpoint.Open(indexPath, checkpoint.OpenOptions{Timeout: 2 * time.Second})
	if errors.Is(err, checkpoint.ErrLocked) {
		// Someone (verify, a doctor) reads the index right now: cron should try again.
		return res, fmt.Errorf("%w: %w", ErrTemporary, err)
	}
	if err != nil {
		return res, damagedIndex(err)
	}
	defer func() { _ = ix.Close() }() // every commit was synced: Close loses nothing
	if err := prepareIndex(ix, ds, cfg, opt); err != nil {
		return res, damagedIndex(err)
	}
	if err := doctor.CheckReplicaFit(cfg, nil); err != nil {
		return res, err // exit 2: replicas × tp_size is more GPUs than the node has
	}
	// The same triage as `extract doctor`, before any GPU time is spent.
	rep, err := Doctor(ctx, cfg, doctor.Options{Dataset: ds, Index: ix, Log: opt.Log, Executable: opt.Executable, ConfigFile: opt.ConfigFile})
	if err != nil {
		return res, err
	}
	if err := rep.Err(); err != nil {
		return res, err
	}
	if opt.Fresh {
		// The old job's dumps must not reach the new job's outputs (invariant 7).
		for _, dir := range cfg.StagingDirs() {
			if n, err := shm.RemoveDumps(dir); err != nil {
				return res, err
			} else if n > 0 {
				opt.Log.Info("--fresh: removed the old job's dumps from staging", "dumps", n, "dir", dir)
			}
		}
	}
	j, err := newJob(cfg, opt, ds, ix, lock, started)
	if err != nil {
		return res, damagedIndex(err) // newJob loads every record
	}
	res, err = j.run(ctx)
	if err == nil && dsPath != cfg.Dataset {
		err = jobVocab(cfg, ds, ix, res.Outcome, opt.Log) // vocab_job.go
	}
	res.Elapsed = time.Since(j.started)
	return res, err
}

// fieldNames are the config keys behind FingerprintFields' names, for messages.
var fieldNames = map[string]string{
	"kind": "server.kind", "model": "server.model_path", "hidden": "hidden size",
	"layers": "server.layers", "format": "output.format",
}

// configChange says which settings of the config fingerprint differ from the ones the
// index's job was made with, e.g. `server.layers was [2 30 58], now [3 31 59]`. An index
// from before the fields were stored can only show the fingerprints.
func configChange(meta checkpoint.Meta, cfg *configs.Config) string {
	if meta.ConfigFields == "" {
		return fmt.Sprintf("the model, hidden size, captured layers or output format differ from the ones this job was started with (config fingerprint %s, now %s; this index predates recording which)",
			meta.ConfigFingerprint, cfg.Fingerprint())
	}
	old := strings.Split(meta.ConfigFields, "\n")
	was, now := fieldMap(old), fieldMap(cfg.FingerprintFields())
	var diffs []string
	for _, f := range append(old, cfg.FingerprintFields()...) {
		name, _, _ := strings.Cut(f, "=")
		w, hadW := was[name]
		n, hadN := now[name]
		if w == n && hadW == hadN {
			continue
		}
		label := fieldNames[name]
		if label == "" {
			label = name
		}
		if !hadW {
			w = "(default)"
		}
		if !hadN {
			n = "(default)"
		}
		diffs = append(diffs, fmt.Sprintf("%s was %s, now %s", label, w, n))
		delete(was, name)
		delete(now, name)
	}
	return "the config differs from the one this job was started with: " + strings.Join(diffs, "; ")
}

func fieldMap(fields []string) map[string]string {
	m := map[string]string{}
	for _, f := range fields {
		k, v, _ := strings.Cut(f, "=")
		m[k] = v
	}
	return m
}

// damagedIndex makes a damaged index a preflight refusal (exit 3) with its fix: exit 1
// ("samples failed, resume retries") would have a supervisor restart into it forever.
func damagedIndex(err error) error {
	if !errors.Is(err, checkpoint.ErrDamaged) {
		return err
	}
	return fmt.Errorf("%w: %w; %s, then `extract run --resume`", ErrPreflight, err, doctor.RepairFix)
}

// alreadyHeld is a run's answer to a lock another process holds: another run is the job
// going already (exit 0); verify, import or export end soon, and the run is worth a
// retry then (exit 75).
func alreadyHeld(cfg *configs.Config, h Holder) (Result, error) {
	if !h.IsRun() {
		return Result{OutputDir: cfg.OutputDir}, fmt.Errorf("%w: %s holds %s; run again after it ends", ErrTemporary, h, lockPath(cfg.StateDir))
	}
	return Result{Outcome: AlreadyRunning, HolderPID: h.PID, OutputDir: cfg.OutputDir}, nil
}

// prepareIndex makes the index describe this job: a new index is initialised; one with
// progress is continued only with --resume and only for the same dataset and config.
func prepareIndex(ix *checkpoint.Index, ds *dataset.Dataset, cfg *configs.Config, opt RunOptions) error {
	want := checkpoint.Meta{
		DatasetFingerprint: ds.Fingerprint,
		DatasetPath:        ds.Path,
		ConfigFingerprint:  cfg.Fingerprint(),
		ConfigFields:       strings.Join(cfg.FingerprintFields(), "\n"),
		Total:              ds.Len(),
		Created:            time.Now().UTC(),
		OutputFormat:       outputLayout(cfg).Name(),
		ShardIndex:         cfg.Shard.Index,
		ShardCount:         cfg.Shard.Count,
	}
	meta, ok, err := ix.Meta()
	if err != nil {
		return err
	}
	if !ok {
		if !opt.Fresh {
			// Created but never initialised (a run refused or killed before its first
			// txn) over the files of a lost index.
			if err := lostIndex(cfg, ds, ix.Path()); err != nil {
				return err
			}
		}
		return ix.Init(want)
	}
	// The dir name says the plan too, but a renamed or copied dir must not run another
	// shard's range against this index's records.
	if ok && (meta.ShardIndex != cfg.Shard.Index || meta.ShardCount != cfg.Shard.Count) {
		return fmt.Errorf("%w: index %s records shard %d of %d (0 of 0: unsharded) but this run is shard %d of %d: was the state dir renamed? run the shard it records, or start over with --fresh",
			ErrRefused, ix.Path(), meta.ShardIndex, meta.ShardCount, cfg.Shard.Index, cfg.Shard.Count)
	}
	if opt.Fresh {
		opt.Log.Warn("starting over (--fresh): index reset; existing output files will be overwritten", "index", ix.Path())
		return ix.Reset(want)
	}
	c, err := ix.Counters()
	if err != nil {
		return err
	}
	progress := c.Done+c.Failed > 0
	same := meta.DatasetFingerprint == ds.Fingerprint && meta.ConfigFingerprint == cfg.Fingerprint()
	if same && meta.ConfigFields == "" {
		// An index from before the fields were stored: record them now that they are
		// known to be the job's, so that a later mismatch can name what changed.
		if err := ix.SetConfigFields(strings.Join(cfg.FingerprintFields(), "\n")); err != nil {
			return err
		}
	}
	if !progress {
		if same {
			return nil // keep the attempt numbers: a rid is never reused
		}
		// Nothing done under the old definition: adopt the new one.
		return ix.Reset(want)
	}
	if !opt.Resume && !(same && c.Done == meta.Total) {
		// A complete job of the same definition is not at risk: the run says so and exits 0.
		return fmt.Errorf("%w: %s already has progress (%d of %d samples done); run `extract run --resume` to continue it, or `extract run --fresh` to start over", ErrRefused, ix.Path(), c.Done, meta.Total)
	}
	if meta.DatasetFingerprint != ds.Fingerprint {
		return fmt.Errorf("%w: dataset %s is not the one this job was started with (%s, %d samples, sha256 %.12s…; now %d samples, sha256 %.12s…): resuming would mix outputs; point `dataset` back at the original, or start over with --fresh",
			ErrRefused, ds.Path, meta.DatasetPath, meta.Total, meta.DatasetFingerprint, ds.Len(), ds.Fingerprint)
	}
	if meta.ConfigFingerprint != cfg.Fingerprint() {
		if old, _ := checkpoint.ParseLayout("", meta.OutputFormat); old.Name() != outputLayout(cfg).Name() {
			return fmt.Errorf("%w: output.format is %s, this job was started with %s: resuming would mix formats; restore it, convert the outputs with `extract export`, or start over with --fresh",
				ErrRefused, outputLayout(cfg).Name(), old.Name())
		}
		return fmt.Errorf("%w: %s: resuming would mix outputs; restore them, or start over with --fresh",
			ErrRefused, configChange(meta, cfg))
	}
	return nil
}
