package checkpoint

import (
	"context"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
)

// ExportOptions describe the target of an export.
type ExportOptions struct {
	// ConfigFingerprint is the job's config with the target format: the exported files
	// carry it, so a job configured for that format can adopt them (verify --repair).
	ConfigFingerprint string
	// Layers and Model fill the metadata of samples imported from another tool's files,
	// which carry none.
	Layers, Model string
	// Scratch is a folder for decompressing .gz sources.
	Scratch string
	// Progress, when set, is called after each sample.
	Progress func(seen, total int)
}

// ExportReport counts what Export did.
type ExportReport struct {
	Exported int      `json:"exported"`
	Skipped  int      `json:"skipped"` // already at the target from an earlier export
	Failed   int      `json:"failed"`
	Bytes    int64    `json:"bytes"`
	Problems []string `json:"problems"`
}

// Export writes every done sample of ix from src into dst's format, each through the
// writers' temp-fsync-rename path. A rerun resumes: a target file is kept only when its
// record says this export (config fingerprint with the target format, dataset, sample,
// tokens, the crc32c the index holds) and its tensors hash to that crc32c; any other
// target of this export (a flipped byte, a torn name) is rewritten. A folder that holds
// another job's files, or files extract did not write, is refused before anything is
// written (ErrForeignTarget): export never replaces a name it did not write. Tensor
// bytes, loss_mask included, are copied unchanged. A full target disk stops the export
// (ErrTargetFull); the rerun resumes.
func Export(ctx context.Context, ix *Index, src, dst Layout, opt ExportOptions) (ExportReport, error) {
	rep := ExportReport{Problems: []string{}}
	meta, _, err := ix.Meta()
	if err != nil {
		return rep, err
	}
	done, err := ix.doneRecords()
	if err != nil {
		return rep, err
	}
	mine := exportMarker{ConfigFingerprint: opt.ConfigFingerprint, DatasetFingerprint: meta.DatasetFingerprint, Format: dst.Name()}
	ours, err := claimTarget(dst, mine)
	if err != nil {
		return rep, err
	}
	buf := make([]byte, 1<<20)
	samples := slices.Sorted(maps.Keys(done))
	for i, s := range samples {
		if opt.Progress != nil {
			opt.Progress(i, len(samples))
		}
		if err := ctx.Err(); err != nil {
			return rep, err
		}
		r := done[s]
		to := dst.Path(s)
		if ours[s] {
			if info, err := readOutput(ctx, to, true, nil, buf); err == nil && keepTarget(info, r, mine) {
				rep.Skipped++
				continue
			}
			if ctx.Err() != nil {
				return rep, ctx.Err()
			}
		}
		n, err := exportOne(ctx, src.Path(s), to, dst, r, meta, opt, buf)
		if ctx.Err() != nil {
			return rep, ctx.Err()
		}
		if isNoSpace(err) {
			return rep, fmt.Errorf("%w: %s: %w", ErrTargetFull, dst.Dir, err)
		}
		if err != nil {
			rep.Failed++
			if len(rep.Problems) < maxProblems {
				rep.Problems = append(rep.Problems, err.Error())
			}
			continue
		}
		rep.Exported++
		rep.Bytes += n
	}
	if opt.Progress != nil {
		opt.Progress(len(samples), len(samples))
	}
	return rep, nil
}

// keepTarget says whether a target that reads back sound (its tensors hash to its
// record's crc32c) is this export's copy of r.
func keepTarget(info OutputInfo, r Record, mine exportMarker) bool {
	return info.Sample == r.Sample && info.Tokens == r.Tokens &&
		info.ConfigFingerprint == mine.ConfigFingerprint && info.DatasetFingerprint == mine.DatasetFingerprint &&
		// An imported file without extract's record was hashed as it was (a file
		// without loss_mask has no mask bytes): its export's crc32c may differ.
		(info.CRC32C == r.CRC32C || r.Imported)
}

func exportOne(ctx context.Context, from, to string, dst Layout, r Record, meta Meta, opt ExportOptions, buf []byte) (int64, error) {
	sf, err := openSample(from)
	if err != nil {
		return 0, fmt.Errorf("sample %d: %s: %w", r.Sample, from, err)
	}
	defer sf.Close()
	md := map[string]string{}
	if sf.md != nil {
		maps.Copy(md, sf.md)
	} else {
		md = map[string]string{
			"format": outputFormat, "sample": strconv.Itoa(r.Sample), "rid": r.RID,
			"dataset_fingerprint": meta.DatasetFingerprint, "layers": opt.Layers, "model": opt.Model,
			"protocol": protocolVersion, mdMaskSource: maskFromFile,
		}
	}
	conv := sf
	if sf.gz {
		H, _ := strconv.Atoi(md["hidden_size"])
		plain, err := gunzipBounded(ctx, sf, ImportWant{HiddenSize: H}, opt.Scratch)
		if err != nil {
			return 0, fmt.Errorf("sample %d: %s: %w", r.Sample, from, err)
		}
		defer os.Remove(plain)
		if conv, err = openSample(plain); err != nil {
			return 0, fmt.Errorf("sample %d: %s: %w", r.Sample, from, err)
		}
		defer conv.Close()
	}
	s := conv.source(nil)
	md["config_fingerprint"] = opt.ConfigFingerprint
	md["tokens"] = strconv.FormatInt(s.T, 10)
	md["hidden_size"] = strconv.FormatInt(s.H, 10)
	delete(md, "crc32c")
	s.md = md
	n, _, err := writeSample(ctx, dst, to, s, buf)
	if err != nil {
		return 0, fmt.Errorf("sample %d: export to %s: %w", r.Sample, to, err)
	}
	return n, nil
}
