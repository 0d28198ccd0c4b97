package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/extract-dev/extract/checkpoint"
	"github.com/extract-dev/extract/configs"
	"github.com/extract-dev/extract/dataset"
	"github.com/extract-dev/extract/orchestrator/generate"
)

// VerifyAllReport is `extract verify --all`: whether the shards add up to the dataset,
// each sample done exactly once, by the shard that owns it, with its file in place.
type VerifyAllReport struct {
	Shards  int `json:"shards"`
	Samples int `json:"samples"` // the dataset's
	Done    int `json:"done"`    // samples done in exactly one shard
	// Gaps are samples no shard has done; Overlaps are done in more than one shard;
	// Misplaced are done by a shard whose range does not hold them.
	Gaps      int `json:"gaps"`
	Overlaps  int `json:"overlaps"`
	Misplaced int `json:"misplaced"`
	// Missing and Corrupt are done samples whose file is absent, or does not match its
	// record (sample, rid, size, crc32c, fingerprints; with deep, the data's crc32c).
	Missing int `json:"missing"`
	Corrupt int `json:"corrupt"`
	// Orphans are output files of samples no shard has done; TempFiles the mover's
	// leftovers.
	Orphans   int `json:"orphans"`
	TempFiles int `json:"temp_files"`
	// Mismatched are shards whose index is of another plan, dataset or config.
	Mismatched int              `json:"mismatched"`
	PerShard   []VerifyShardRow `json:"per_shard"`
	Problems   []string         `json:"problems"`
	Unlisted   int              `json:"unlisted"` // problems past the cap of the list
	// Generate is each shard's generate index checked against itself and its output,
	// when the job generated (nil otherwise); GenerateProblems counts what is wrong.
	Generate         []generate.VerifyReport `json:"generate,omitempty"`
	GenerateProblems int                     `json:"generate_problems"`
	// GenerateOnly: no shard has extracted yet, only the generate stage is checked.
	GenerateOnly bool `json:"generate_only,omitempty"`
}

// VerifyShardRow is one shard's part of the report.
type VerifyShardRow struct {
	Shard   int    `json:"shard"`
	First   int    `json:"first"`
	End     int    `json:"end"`
	Done    int    `json:"done"`
	Missing int    `json:"missing"`
	Corrupt int    `json:"corrupt"`
	Note    string `json:"note,omitempty"` // not started, or why the index does not fit
}

// OK says the union of the shards is the dataset, exactly once, with every file sound.
func (r VerifyAllReport) OK() bool {
	if r.GenerateOnly {
		return r.GenerateProblems == 0
	}
	return r.Gaps+r.Overlaps+r.Misplaced+r.Missing+r.Corrupt+r.Orphans+r.TempFiles+r.Mismatched+r.GenerateProblems == 0 && r.Done == r.Samples
}

func (r *VerifyAllReport) problem(format string, args ...any) {
	if len(r.Problems) < maxAllProblems {
		r.Problems = append(r.Problems, fmt.Sprintf(format, args...))
	} else {
		r.Unlisted++
	}
}

const maxAllProblems = 100

// VerifyAll checks every shard of the job's plan against the dataset and the one
// output dir they share. It takes each shard's run lock, so it never races a running
// shard (a held one is ErrTemporary), and changes nothing.
func VerifyAll(ctx context.Context, cfg *configs.Config, deep bool) (VerifyAllReport, error) {
	var rep VerifyAllReport
	base := cfg.JobStateDir()
	plans, err := planDirs(base)
	if err != nil {
		return rep, err
	}
	n := 0
	switch len(plans) {
	case 0:
		return rep, fmt.Errorf("%w: no shard state under %s (shard-<i>-of-<n> dirs): nothing to verify across shards (`extract verify` checks an unsharded job)", ErrRefused, base)
	case 1:
		for m := range plans {
			n = m
		}
	default:
		var ns []int
		for m := range plans {
			ns = append(ns, m)
		}
		slices.Sort(ns)
		return rep, fmt.Errorf("%w: state dir %s holds more than one plan (%v shards): move the old one aside", ErrRefused, base, ns)
	}
	if done, err := verifyGenerateAll(base, n, &rep); err != nil || done {
		return rep, err // generate_job.go; done: only the generate stage ran
	}
	ds, err := openExtractedDataset(ctx, cfg)
	if err != nil {
		return rep, err
	}
	defer func() { _ = ds.Close() }()
	total := ds.Len()
	rep.Shards, rep.Samples = n, total

	// owner[s] is the shard that has s done, -1 none, -2 more than one.
	owner := make([]int32, total)
	for s := range owner {
		owner[s] = -1
	}
	type doneSample struct {
		s, shard int
		rec      checkpoint.Record
	}
	work := make([][]doneSample, n)
	metas := make([]checkpoint.Meta, n)
	for i := range n {
		lo, hi := ShardRange(total, i, n)
		row := VerifyShardRow{Shard: i, First: lo, End: hi}
		dir := filepath.Join(base, configs.ShardDirName(i, n))
		if _, err := os.Stat(filepath.Join(dir, "index.db")); os.IsNotExist(err) {
			row.Note = "not started"
			rep.PerShard = append(rep.PerShard, row)
			continue
		}
		lock, err := AcquireLock(dir, "verify")
		var held *HeldError
		if errors.As(err, &held) {
			return rep, fmt.Errorf("%w: shard %d/%d is running (%v); verify --all after every shard stops (`extract status --all` shows them)", ErrTemporary, i, n, held)
		}
		if err != nil {
			return rep, err
		}
		defer lock.Release()
		recs, meta, note, err := loadShard(filepath.Join(dir, "index.db"), ds, cfg, i, n)
		if err != nil {
			return rep, fmt.Errorf("shard %d/%d: %w", i, n, err)
		}
		metas[i] = meta
		if note != "" {
			rep.Mismatched++
			row.Note = note
			rep.problem("shard %d/%d: %s", i, n, note)
		}
		for _, r := range recs {
			row.Done++
			switch owner[r.Sample] {
			case -1:
				owner[r.Sample] = int32(i)
			case -2:
			default:
				rep.problem("sample %d: done in shard %d and in shard %d", r.Sample, owner[r.Sample], i)
				owner[r.Sample] = -2
			}
			if r.Sample < lo || r.Sample >= hi {
				rep.Misplaced++
				rep.problem("sample %d: done by shard %d/%d, but shard %d owns it", r.Sample, i, n, ShardOf(r.Sample, total, n))
			}
			work[i] = append(work[i], doneSample{r.Sample, i, r})
		}
		rep.PerShard = append(rep.PerShard, row)
	}
	for s, o := range owner {
		switch o {
		case -1:
			rep.Gaps++
			if rep.Gaps <= 10 {
				rep.problem("sample %d: done in no shard (shard %d/%d owns it)", s, ShardOf(s, total, n), n)
			}
		case -2:
			rep.Overlaps++
		default:
			rep.Done++
		}
	}
	if rep.Gaps > 10 {
		rep.problem("... %d samples done in no shard in all", rep.Gaps)
	}

	// Each done sample's file, checked in parallel: reading headers (or, deep, whole
	// files) is what takes the time.
	var mu sync.Mutex
	jobs := make(chan doneSample, 256)
	var wg sync.WaitGroup
	for range runtime.GOMAXPROCS(0) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for d := range jobs {
				i := d.shard
				reason, missing := checkOutput(cfg.OutputDir, d.s, d.rec, metas[i], deep)
				if reason == "" {
					continue
				}
				mu.Lock()
				row := &rep.PerShard[i]
				if missing {
					rep.Missing++
					row.Missing++
				} else {
					rep.Corrupt++
					row.Corrupt++
				}
				rep.problem("sample %d (shard %d/%d): %s", d.s, i, n, reason)
				mu.Unlock()
			}
		}()
	}
	for _, ws := range work {
		for _, d := range ws {
			if ctx.Err() != nil {
				break
			}
			jobs <- d
		}
	}
	close(jobs)
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return rep, fmt.Errorf("verify --all: %w", err)
	}
	if err := findStrays(outputLayout(cfg), owner, &rep); err != nil {
		return rep, err
	}
	return rep, nil
}

// loadShard reads a shard's done records; note says why its index is not this plan's
// shard of this job (another plan, dataset or config), "" when it is.
func loadShard(path string, ds *dataset.Dataset, cfg *configs.Config, i, n int) ([]checkpoint.Record, checkpoint.Meta, string, error) {
	ix, err := checkpoint.Open(path, checkpoint.OpenOptions{ReadOnly: true, Timeout: 2 * time.Second})
	if err != nil {
		return nil, checkpoint.Meta{}, "", err
	}
	defer func() { _ = ix.Close() }()
	meta, ok, err := ix.Meta()
	if err != nil {
		return nil, meta, "", err
	}
	if !ok {
		return nil, meta, "", nil // created, never initialised: nothing done
	}
	var notes []string
	if meta.ShardIndex != i || meta.ShardCount != n {
		notes = append(notes, fmt.Sprintf("its index records shard %d of %d", meta.ShardIndex, meta.ShardCount))
	}
	if meta.DatasetFingerprint != ds.Fingerprint || meta.Total != ds.Len() {
		notes = append(notes, fmt.Sprintf("its index is of dataset %s (%d samples, sha256 %.12s…), not %s", meta.DatasetPath, meta.Total, meta.DatasetFingerprint, ds.Path))
	}
	if meta.ConfigFingerprint != cfg.Fingerprint() {
		notes = append(notes, fmt.Sprintf("its index is of config %s, not %s (model, width or layers differ)", meta.ConfigFingerprint, cfg.Fingerprint()))
	}
	if len(notes) > 0 {
		// Its records index another sample space: counting them would be noise.
		return nil, meta, strings.Join(notes, "; "), nil
	}
	prog, err := ix.Load(meta.Total)
	if err != nil {
		return nil, meta, "", err
	}
	var recs []checkpoint.Record
	for s, st := range prog.State {
		if st != checkpoint.StateDone {
			continue
		}
		r, ok, err := ix.Get(s)
		if err != nil {
			return nil, meta, "", err
		}
		if ok {
			recs = append(recs, r)
		}
	}
	return recs, meta, "", nil
}

// checkOutput says why sample s's file does not hold what its record says ("" when it
// does), and whether it is missing.
func checkOutput(outputDir string, s int, r checkpoint.Record, meta checkpoint.Meta, deep bool) (string, bool) {
	layout, err := checkpoint.ParseLayout(outputDir, meta.OutputFormat)
	if err != nil {
		return err.Error(), false
	}
	path := layout.Path(s)
	info, err := checkpoint.ReadOutput(path, deep)
	if errors.Is(err, os.ErrNotExist) {
		return "file missing: " + path, true
	}
	if err != nil {
		return err.Error(), false
	}
	var bad []string
	if info.Sample != s {
		bad = append(bad, fmt.Sprintf("file says sample %d", info.Sample))
	}
	if info.RID != r.RID {
		bad = append(bad, fmt.Sprintf("rid %s, index %s", info.RID, r.RID))
	}
	if info.Bytes != r.Bytes || info.CRC32C != r.CRC32C {
		bad = append(bad, fmt.Sprintf("%d bytes crc32c %08x, index %d bytes crc32c %08x", info.Bytes, info.CRC32C, r.Bytes, r.CRC32C))
	}
	if info.DatasetFingerprint != meta.DatasetFingerprint || info.ConfigFingerprint != meta.ConfigFingerprint {
		bad = append(bad, "made under another dataset or config")
	}
	if len(bad) > 0 {
		return filepath.Base(path) + ": " + strings.Join(bad, "; "), false
	}
	return "", false
}

// findStrays walks the job's data folders for files no shard accounts for: data files
// of samples done nowhere (or beyond the dataset), and the writer's temp files.
func findStrays(layout checkpoint.Layout, owner []int32, rep *VerifyAllReport) error {
	dirs, err := layout.DataDirs()
	if err != nil {
		return err
	}
	for _, dir := range dirs {
		files, err := os.ReadDir(dir)
		if err != nil {
			return fmt.Errorf("read output directory: %w", err)
		}
		for _, f := range files {
			name := f.Name()
			rel, _ := filepath.Rel(layout.Dir, filepath.Join(dir, name))
			if layout.IsTemp(name) {
				rep.TempFiles++
				rep.problem("%s: leftover temp file", rel)
				continue
			}
			s, ok := layout.SampleOf(name)
			if !ok {
				continue
			}
			if s < len(owner) && owner[s] != -1 && layout.Path(s) == filepath.Join(dir, name) {
				continue
			}
			rep.Orphans++
			rep.problem("%s: sample %d's file, but no shard has it done", rel, s)
		}
	}
	return nil
}
