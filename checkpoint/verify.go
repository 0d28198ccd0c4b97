package checkpoint

import (
	"context"
	"fmt"
	"hash/crc32"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	bolt "go.etcd.io/bbolt"

	"github.com/extract-dev/extract/internal/safetensors"
)

// OutputInfo is what an output file says about itself.
type OutputInfo struct {
	Sample             int
	RID                string
	DatasetFingerprint string
	Tokens             int
	CRC32C             uint32
	Bytes              int64
	// ConfigFingerprint, Layers and Model are the job config the file was made under;
	// HiddenSize is the width of its hidden_state.
	ConfigFingerprint string
	Layers            string
	Model             string
	HiddenSize        int
}

// ReadOutput reads and checks an output's header and metadata; deep also recomputes
// the crc32c of the data section and compares it with the metadata.
func ReadOutput(path string, deep bool) (OutputInfo, error) {
	info, err := readOutput(context.Background(), path, deep, make([]byte, 1<<20))
	if err != nil {
		return OutputInfo{}, fmt.Errorf("output %s: %w", path, err)
	}
	return info, nil
}

// readOutput is ReadOutput for Verify: it can be cancelled between chunks, reuses one
// buffer, and leaves naming the file to the caller.
func readOutput(ctx context.Context, path string, deep bool, buf []byte) (OutputInfo, error) {
	f, err := os.Open(path)
	if err != nil {
		return OutputInfo{}, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return OutputInfo{}, err
	}
	h, err := safetensors.ReadHeader(f, st.Size())
	if err != nil {
		return OutputInfo{}, err
	}
	md := h.Metadata
	if md["format"] != outputFormat {
		return OutputInfo{}, fmt.Errorf("format %q, want %q", md["format"], outputFormat)
	}
	info := OutputInfo{
		RID: md["rid"], DatasetFingerprint: md["dataset_fingerprint"], Bytes: st.Size(),
		ConfigFingerprint: md["config_fingerprint"], Layers: md["layers"], Model: md["model"],
	}
	if info.Sample, err = strconv.Atoi(md["sample"]); err != nil || info.Sample < 0 {
		return OutputInfo{}, fmt.Errorf("metadata sample %q is not a sample index", md["sample"])
	}
	if info.Tokens, err = strconv.Atoi(md["tokens"]); err != nil || info.Tokens < 1 {
		return OutputInfo{}, fmt.Errorf("metadata tokens %q is not a token count", md["tokens"])
	}
	c := md["crc32c"]
	sum, err := strconv.ParseUint(c, 16, 32)
	if err != nil || len(c) != 8 || strings.ToLower(c) != c {
		return OutputInfo{}, fmt.Errorf("metadata crc32c %q is not 8 lowercase hex digits", c)
	}
	info.CRC32C = uint32(sum)
	if err := checkOutputTensors(h, int64(info.Tokens)); err != nil {
		return OutputInfo{}, err
	}
	hidden, _ := h.Tensor(tensorHidden)
	info.HiddenSize = int(hidden.Shape[1])
	if !deep {
		return info, nil
	}
	got := uint32(0)
	for off := h.DataStart; off < st.Size(); {
		if err := ctx.Err(); err != nil {
			return OutputInfo{}, err
		}
		chunk := buf[:min(st.Size()-off, int64(len(buf)))]
		if _, err := f.ReadAt(chunk, off); err != nil {
			return OutputInfo{}, fmt.Errorf("read data at %d: %w", off, err)
		}
		got = crc32.Update(got, castagnoli, chunk)
		off += int64(len(chunk))
	}
	if got != info.CRC32C {
		return OutputInfo{}, fmt.Errorf("crc32c mismatch: metadata %08x, data %08x", info.CRC32C, got)
	}
	return info, nil
}

// checkOutputTensors requires exactly the four tensors of output layout v1, shaped for T tokens.
func checkOutputTensors(h *safetensors.Header, T int64) error {
	if len(h.Tensors) != 4 {
		return fmt.Errorf("%d tensors, want 4", len(h.Tensors))
	}
	for _, want := range []struct {
		name string
		dt   safetensors.DType
		rank int
	}{
		{tensorInputIDs, safetensors.I64, 1},
		{tensorLossMask, safetensors.I64, 1},
		{tensorHidden, safetensors.BF16, 2},
		{tensorAux, safetensors.BF16, 2},
	} {
		t, err := tensorOf(h, want.name, want.dt, want.rank)
		if err != nil {
			return err
		}
		if t.Shape[0] != T {
			return fmt.Errorf("tensor %s has %d rows, metadata says %d tokens", want.name, t.Shape[0], T)
		}
	}
	hidden, _ := h.Tensor(tensorHidden)
	aux, _ := h.Tensor(tensorAux)
	if hidden.Shape[1] < 1 || aux.Shape[1] != 3*hidden.Shape[1] {
		return fmt.Errorf("tensor %s shape %v does not hold 3 layers of %s shape %v", tensorAux, aux.Shape, tensorHidden, hidden.Shape)
	}
	return nil
}

// VerifyOptions controls Verify.
type VerifyOptions struct {
	// Deep recomputes every done file's crc32c instead of checking size and header only.
	Deep bool
	// Repair sends missing and corrupt samples back to pending (removing a corrupt
	// file), adopts valid orphans, and removes temp files.
	Repair bool
}

// VerifyReport counts what Verify found.
type VerifyReport struct {
	// Checked done records; OK of them passed; Missing and Corrupt did not.
	Checked, OK, Missing, Corrupt int
	// Orphans are output files of samples the index does not have done.
	Orphans int
	// TempFiles are leftovers of moves that never finished.
	TempFiles int
	// Repaired counts fixes applied: records reset, orphans adopted, temp files removed.
	Repaired int
	// Problems describes each finding, one line each, capped at maxProblems.
	Problems []string
}

const maxProblems = 100

func (r *VerifyReport) problem(format string, args ...any) {
	if len(r.Problems) < maxProblems {
		r.Problems = append(r.Problems, fmt.Sprintf(format, args...))
	}
}

// adoptBatch bounds the records one adoption txn commits.
const adoptBatch = 1000

// Verify checks the index against the output directory: every done sample's file is
// there with its recorded size and header (Deep: and crc32c); files of samples not done
// are orphans; temp files are leftovers. With Repair it fixes what it finds, and since
// a valid orphan whose dataset fingerprint matches the index is adopted, Init followed by
// Verify with Repair rebuilds an index from the files alone.
func Verify(ctx context.Context, ix *Index, outputDir string, total int, opt VerifyOptions) (VerifyReport, error) {
	var rep VerifyReport
	meta, haveMeta, err := ix.Meta()
	if err != nil {
		return rep, err
	}
	done, err := ix.doneRecords()
	if err != nil {
		return rep, err
	}
	buf := make([]byte, 1<<20)

	for _, s := range slices.Sorted(maps.Keys(done)) {
		if err := ctx.Err(); err != nil {
			return rep, fmt.Errorf("verify %s: %w", outputDir, err)
		}
		r := done[s]
		rep.Checked++
		path := OutputPath(outputDir, s)
		reason, missing, err := checkDone(ctx, path, r, total, meta, haveMeta, opt.Deep, buf)
		if err != nil {
			return rep, err
		}
		if reason == "" {
			rep.OK++
			continue
		}
		if missing {
			rep.Missing++
		} else {
			rep.Corrupt++
		}
		if !opt.Repair {
			rep.problem("sample %d: %s: %s", s, filepath.Base(path), reason)
			continue
		}
		if err := ix.MarkPending(s, "verify: "+reason); err != nil {
			return rep, err
		}
		// A corrupt file must not stay under a final name, which promises a complete file.
		if !missing {
			if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
				return rep, fmt.Errorf("sample %d: remove corrupt output: %w", s, err)
			}
		}
		rep.Repaired++
		rep.problem("sample %d: %s: %s; back to pending", s, filepath.Base(path), reason)
	}

	rows, err := os.ReadDir(outputDir)
	if os.IsNotExist(err) {
		return rep, nil
	}
	if err != nil {
		return rep, fmt.Errorf("read output directory: %w", err)
	}
	var adopt []Record
	for _, d := range rows {
		if !d.IsDir() || !strings.HasPrefix(d.Name(), rowsPrefix) {
			continue
		}
		dir := filepath.Join(outputDir, d.Name())
		files, err := os.ReadDir(dir)
		if err != nil {
			return rep, fmt.Errorf("read output directory: %w", err)
		}
		for _, f := range files {
			if err := ctx.Err(); err != nil {
				return rep, fmt.Errorf("verify %s: %w", outputDir, err)
			}
			name, path := f.Name(), filepath.Join(dir, f.Name())
			rel := filepath.Join(d.Name(), name)
			if isTempName(name) {
				rep.TempFiles++
				if !opt.Repair {
					rep.problem("%s: leftover temp file", rel)
					continue
				}
				if err := os.Remove(path); err != nil {
					return rep, fmt.Errorf("remove temp file: %w", err)
				}
				rep.Repaired++
				rep.problem("%s: leftover temp file; removed", rel)
				continue
			}
			s, ok := parseDataName(name)
			if !ok {
				continue
			}
			if _, isDone := done[s]; isDone && OutputPath(outputDir, s) == path {
				continue
			}
			rep.Orphans++
			if !opt.Repair {
				rep.problem("sample %d: %s: orphan, not done in the index", s, rel)
				continue
			}
			r, why, err := adoptable(ctx, path, s, total, done, meta, haveMeta, outputDir, buf)
			if err != nil {
				return rep, err
			}
			if why != "" {
				rep.problem("sample %d: %s: orphan not adopted: %s", s, rel, why)
				continue
			}
			adopt = append(adopt, r)
			rep.Repaired++
			rep.problem("sample %d: %s: orphan adopted", s, rel)
			if len(adopt) == adoptBatch {
				if err := ix.commitDoneMany(adopt); err != nil {
					return rep, err
				}
				adopt = adopt[:0]
			}
		}
	}
	if len(adopt) > 0 {
		if err := ix.commitDoneMany(adopt); err != nil {
			return rep, err
		}
	}
	return rep, nil
}

// checkDone checks one done record's file. It returns why the file fails, and whether
// it is missing; err is reserved for cancellation.
func checkDone(ctx context.Context, path string, r Record, total int, meta Meta, haveMeta, deep bool, buf []byte) (reason string, missing bool, err error) {
	if r.Sample >= total {
		return fmt.Sprintf("done record beyond the dataset's %d samples", total), false, nil
	}
	st, err := os.Stat(path)
	if os.IsNotExist(err) {
		return "missing", true, nil
	}
	if err != nil {
		return err.Error(), false, nil
	}
	if st.Size() != r.Bytes {
		return fmt.Sprintf("size %d, index recorded %d", st.Size(), r.Bytes), false, nil
	}
	info, err := readOutput(ctx, path, deep, buf)
	if ctx.Err() != nil {
		return "", false, fmt.Errorf("verify sample %d: %w", r.Sample, ctx.Err())
	}
	switch {
	case err != nil:
		return err.Error(), false, nil
	case info.Sample != r.Sample:
		return fmt.Sprintf("metadata names sample %d", info.Sample), false, nil
	case info.CRC32C != r.CRC32C:
		return fmt.Sprintf("crc32c %08x in metadata, index recorded %08x", info.CRC32C, r.CRC32C), false, nil
	case haveMeta && info.DatasetFingerprint != meta.DatasetFingerprint:
		return fmt.Sprintf("dataset fingerprint %q, index has %q", info.DatasetFingerprint, meta.DatasetFingerprint), false, nil
	}
	return "", false, nil
}

// adoptable decides whether an orphan may become a done record: only a file that passes
// the deep check, sits where its sample belongs and comes from this index's dataset.
func adoptable(ctx context.Context, path string, s, total int, done map[int]Record, meta Meta, haveMeta bool, outputDir string, buf []byte) (Record, string, error) {
	switch {
	case !haveMeta:
		return Record{}, "index has no job metadata to match its dataset fingerprint", nil
	case s >= total:
		return Record{}, fmt.Sprintf("beyond the dataset's %d samples", total), nil
	case OutputPath(outputDir, s) != path:
		return Record{}, "misplaced; belongs in " + filepath.Dir(OutputPath(outputDir, s)), nil
	}
	if _, isDone := done[s]; isDone {
		return Record{}, "sample already done from its own file", nil
	}
	info, err := readOutput(ctx, path, true, buf)
	if ctx.Err() != nil {
		return Record{}, "", fmt.Errorf("verify sample %d: %w", s, ctx.Err())
	}
	switch {
	case err != nil:
		return Record{}, err.Error(), nil
	case info.Sample != s:
		return Record{}, fmt.Sprintf("metadata names sample %d", info.Sample), nil
	case info.DatasetFingerprint != meta.DatasetFingerprint:
		return Record{}, fmt.Sprintf("dataset fingerprint %q, index has %q", info.DatasetFingerprint, meta.DatasetFingerprint), nil
	}
	return Record{
		Sample: s, State: StateDone, Attempt: attemptOf(info.RID), RID: info.RID,
		Bytes: info.Bytes, CRC32C: info.CRC32C, Tokens: info.Tokens,
	}, "", nil
}

// attemptOf reads the attempt from a rid "s<sample>-a<attempt>" so that an adopted
// sample's next attempt, should it need one, gets a rid never used before. It parses
// locally because checkpoint sits below the shm package that owns the format.
func attemptOf(rid string) int {
	i := strings.LastIndex(rid, "-a")
	if i < 0 {
		return 0
	}
	n, err := strconv.Atoi(rid[i+2:])
	if err != nil || n < 0 {
		return 0
	}
	return n
}

// doneRecords reads every done record in one read txn, closed before Verify touches
// the disk: a long read txn would block the repairs' writes from growing the file.
func (ix *Index) doneRecords() (map[int]Record, error) {
	done := map[int]Record{}
	err := ix.view(func(tx *bolt.Tx) error {
		return eachRecord(tx, func(s uint64, v []byte) error {
			if len(v) < 2 || State(v[1]) != StateDone {
				return nil
			}
			r, err := decodeRecord(int(s), v)
			if err != nil {
				return err
			}
			done[int(s)] = r
			return nil
		})
	})
	if err != nil {
		return nil, err
	}
	return done, nil
}
