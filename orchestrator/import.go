package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/extract-dev/extract/checkpoint"
	"github.com/extract-dev/extract/configs"
	"github.com/extract-dev/extract/doctor"
)

// ImportOptions are the import command's choices.
type ImportOptions struct {
	From string
	// Format is auto (every kind), specforge, safetensors, modelopt or extract
	// (extract's own outputs of any format, told by their metadata).
	Format string
	// Copy copies instead of hard-linking files that already are the job's format.
	Copy bool
	Log  *slog.Logger
	// Progress, when set, is called after each file.
	Progress func(seen, total int)
}

// ImportReport is the outcome of an import, the --json summary.
type ImportReport struct {
	From        string           `json:"from"`
	Found       int              `json:"found"`
	Imported    int              `json:"imported"`
	Linked      int              `json:"linked"`
	Copied      int              `json:"copied"`
	Converted   int              `json:"converted"`
	AlreadyDone int              `json:"already_done"`
	Rejected    []ImportRejected `json:"rejected"`
	// Skipped are files of samples another shard owns (import --shard i/n), left alone.
	Skipped []ImportRejected `json:"skipped"`
	Bytes   int64            `json:"bytes"`
	Done    int              `json:"done"`
	// Total is the samples this run owns: the shard's range, or the whole dataset.
	Total int `json:"total"`
}

// ImportRejected is one file left alone, and why.
type ImportRejected struct {
	Path   string `json:"path"`
	Sample int    `json:"sample"`
	Reason string `json:"reason"`
}

// Import adopts the sample files another tool wrote under opt.From: each is checked
// against the dataset and the config, then brought into the output layout and
// committed done, one by one (the file durable before its record), so a kill anywhere
// loses nothing and a rerun finishes the rest: samples already done are skipped.
// It takes the run lock, and initialises the index as a run would.
func Import(ctx context.Context, cfg *configs.Config, opt ImportOptions) (ImportReport, error) {
	rep := ImportReport{From: opt.From, Rejected: []ImportRejected{}, Skipped: []ImportRejected{}}
	if opt.Log == nil {
		opt.Log = slog.Default()
	}
	kinds, err := importKinds(opt.Format)
	if err != nil {
		return rep, err
	}
	if st, err := os.Stat(opt.From); err != nil || !st.IsDir() {
		return rep, fmt.Errorf("%w: --from %s is not a directory", ErrRefused, opt.From)
	}
	if abs, _ := filepath.Abs(opt.From); abs == cfg.OutputDir {
		return rep, fmt.Errorf("%w: --from is the output dir itself; `extract verify --repair` adopts extract's own files there", ErrRefused)
	}
	// A changed split is refused as run refuses it: the index of one plan must not
	// take samples another plan's shard owns.
	if err := checkShardPlan(cfg); err != nil {
		return rep, err
	}
	ds, err := openExtractedDataset(ctx, cfg)
	if err != nil {
		return rep, err
	}
	defer func() { _ = ds.Close() }()
	if err := doctor.MakeJobDirs(cfg); err != nil {
		return rep, err
	}
	lock, err := AcquireLock(cfg.StateDir, "import")
	var held *HeldError
	if errors.As(err, &held) {
		return rep, fmt.Errorf("%w: %v; import after it stops", ErrTemporary, held)
	}
	if err != nil {
		return rep, err
	}
	defer lock.Release()
	ix, err := checkpoint.Open(filepath.Join(cfg.StateDir, "index.db"), checkpoint.OpenOptions{Timeout: 2 * time.Second})
	if errors.Is(err, checkpoint.ErrLocked) {
		return rep, fmt.Errorf("%w: %w", ErrTemporary, err)
	}
	if err != nil {
		return rep, err
	}
	defer func() { _ = ix.Close() }() // every commit was synced: Close loses nothing
	// Import continues a job as --resume does: same dataset and config, or refused.
	if err := prepareIndex(ix, ds, cfg, RunOptions{Resume: true, Log: opt.Log}); err != nil {
		return rep, err
	}
	files, err := checkpoint.FindImportFiles(opt.From, kinds)
	if err != nil {
		return rep, err
	}
	span := spanOf(cfg, ds.Len())
	rep.Found, rep.Total = len(files), span.size()
	l := outputLayout(cfg)
	// Scratch for decompressing a .gz to convert: on the output disk, emptied each time.
	scratch := filepath.Join(cfg.StateDir, "import-scratch")
	if err := os.RemoveAll(scratch); err != nil {
		return rep, fmt.Errorf("clear %s: %w", scratch, err)
	}
	defer func() { _ = os.RemoveAll(scratch) }()
	onlyExtract := opt.Format == "extract"
	for i, f := range files {
		if opt.Progress != nil {
			opt.Progress(i, len(files))
		}
		if err := ctx.Err(); err != nil {
			return rep, err
		}
		reject := func(reason string) {
			rep.Rejected = append(rep.Rejected, ImportRejected{Path: f.Path, Sample: f.Sample, Reason: reason})
			opt.Log.Warn("import: file left alone", "file", f.Path, "sample", f.Sample, "reason", reason)
		}
		if f.Sample >= ds.Len() {
			reject(fmt.Sprintf("beyond the dataset's %d samples", ds.Len()))
			continue
		}
		if !span.owns(f.Sample) {
			// Another shard's sample: its own `import --shard` takes it.
			rep.Skipped = append(rep.Skipped, ImportRejected{Path: f.Path, Sample: f.Sample,
				Reason: fmt.Sprintf("shard %d of %d owns it", ShardOf(f.Sample, ds.Len(), cfg.Shard.Count), cfg.Shard.Count)})
			continue
		}
		r, ok, err := ix.Get(f.Sample)
		if err != nil {
			return rep, err
		}
		if ok && r.State == checkpoint.StateDone {
			rep.AlreadyDone++
			continue
		}
		s, err := ds.Sample(f.Sample)
		if err != nil {
			return rep, err
		}
		want := checkpoint.ImportWant{
			Sample: f.Sample, InputIDs: s.InputIDs, LossMask: s.LossMask, HiddenSize: cfg.HiddenSize(),
			Layers: cfg.LayersString(), Model: cfg.ServedModel(),
			DatasetFingerprint: ds.Fingerprint, ConfigFingerprint: cfg.Fingerprint(),
			RequireExtract: onlyExtract, ScratchKeep: int64(cfg.Disk.Reserve),
		}
		res, err := checkpoint.Import(ctx, f, l, want, opt.Copy, scratch)
		if rj, bad := errors.AsType[*checkpoint.RejectError](err); bad {
			reject(rj.Reason)
			continue
		}
		if errors.Is(err, checkpoint.ErrScratchFull) {
			return rep, fmt.Errorf("%w: %w", ErrTemporary, err) // exit 75: the disk, not the file
		}
		if err != nil {
			return rep, err
		}
		if err := ix.CommitDone(checkpoint.Record{
			Sample: f.Sample, State: checkpoint.StateDone, Attempt: attemptOf(res.RID), RID: res.RID,
			Bytes: res.Bytes, CRC32C: res.CRC32C, Tokens: res.Tokens, Updated: time.Now().UTC(), Imported: true,
			SourceID: s.SourceID,
		}); err != nil {
			return rep, fmt.Errorf("index sample %d: %w", f.Sample, err)
		}
		rep.Imported++
		rep.Bytes += res.Bytes
		switch res.How {
		case "link":
			rep.Linked++
		case "copy":
			rep.Copied++
		default:
			rep.Converted++
		}
	}
	if opt.Progress != nil {
		opt.Progress(len(files), len(files))
	}
	c, err := ix.Counters()
	if err != nil {
		return rep, err
	}
	rep.Done = c.Done
	return rep, nil
}

func importKinds(format string) ([]checkpoint.Format, error) {
	switch format {
	case "", "auto":
		return nil, nil
	case "specforge":
		return []checkpoint.Format{checkpoint.FormatSpecForge}, nil
	case "modelopt":
		return []checkpoint.Format{checkpoint.FormatModelOpt}, nil
	case "safetensors":
		return []checkpoint.Format{checkpoint.FormatSafetensors}, nil
	case "extract":
		return nil, nil // every kind, but only files with extract's metadata
	}
	return nil, fmt.Errorf("%w: --format %q: want auto, specforge, safetensors, modelopt or extract", ErrRefused, format)
}

// attemptOf reads the attempt of a rid s<sample>-a<attempt>, 0 for none: an imported
// sample redone later gets a rid above it.
func attemptOf(rid string) int {
	var s, a int
	if _, err := fmt.Sscanf(rid, "s%d-a%d", &s, &a); err != nil || a < 0 {
		return 0
	}
	return a
}
