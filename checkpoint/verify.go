package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	bolt "go.etcd.io/bbolt"
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
	// Protocol and HookVersion are the dump's: the protocol the hook spoke and its version.
	Protocol, HookVersion string
	// SourceID is the sample's id in the data it came from, where the file names one.
	SourceID string
}

// ReadOutput reads and checks an output's header and metadata; deep also recomputes
// the crc32c of the data section and compares it with the metadata.
func ReadOutput(path string, deep bool) (OutputInfo, error) {
	info, err := readOutput(context.Background(), path, deep, nil, make([]byte, 1<<20))
	if err != nil {
		return OutputInfo{}, fmt.Errorf("output %s: %w", path, err)
	}
	return info, nil
}

// fileWant is what the job says one output must hold. The zero value checks nothing.
type fileWant struct {
	// ids and mask are the dataset's; haveIDs false is a text sample (the file's ids
	// are the truth), and a nil mask means all ones.
	ids, mask []int64
	haveIDs   bool
	// haveSample says ids and mask were read from the dataset at all.
	haveSample bool
	hidden     int
	layers     string
}

// wrong is a file that is valid in itself but not this job's; its reason goes into the
// report as it is.
func wrong(format string, args ...any) error { return fmt.Errorf(format, args...) }

// SampleSource is the dataset as Verify compares files with it: Sample returns the
// sample's input_ids and loss_mask; nil ids mean a text sample (the server tokenised
// it, so the file's ids are the truth), a nil mask all ones.
type SampleSource interface {
	Len() int
	Sample(i int) (ids, mask []int64, err error)
}

// VerifyOptions controls Verify.
type VerifyOptions struct {
	// Deep recomputes every done file's crc32c instead of checking size and header
	// only, and with Expect also compares its tokens with the dataset's.
	Deep bool
	// Repair sends missing and corrupt samples back to pending (removing a corrupt
	// file), adopts orphans that pass every check (deep ones included), and removes
	// the mover's temp files.
	Repair bool
	// Expect is the job's dataset; nil skips the token checks. With it, Deep compares
	// each file's token count, input_ids and loss_mask with the dataset's byte for byte.
	Expect SampleSource
	// HiddenSize and Layers are the job's width and effective layers_to_capture
	// ("2,30,58"); each file must match them. Zero values skip the check.
	HiddenSize int
	Layers     string
	// Model is the job's served model (the dumps' model metadata); empty skips the check.
	Model string
	// Format is the layout's name ("specforge+gzip"); empty means the index's, and
	// an index without one is safetensors.
	Format string
	// Lo and Hi bound the samples the index owns, [Lo, Hi): a shard's range. The files
	// of samples outside it are another shard's (the shards share the output dir) and
	// are neither orphans nor adopted. Hi 0 is every sample.
	Lo, Hi int
}

// owns says whether sample s is the index's to check and adopt.
func (opt VerifyOptions) owns(s int) bool { return opt.Hi == 0 || (s >= opt.Lo && s < opt.Hi) }

// want is what sample s's file must hold under opt; it reads the dataset only when the
// check is deep, since only then are the tokens compared.
func (opt VerifyOptions) want(s int, deep bool) (*fileWant, error) {
	w := &fileWant{hidden: opt.HiddenSize, layers: opt.Layers}
	if !deep || opt.Expect == nil {
		return w, nil
	}
	if s >= opt.Expect.Len() {
		return nil, fmt.Errorf("sample %d: beyond the dataset's %d samples", s, opt.Expect.Len())
	}
	ids, mask, err := opt.Expect.Sample(s)
	if err != nil {
		return nil, fmt.Errorf("verify sample %d: read dataset: %w", s, err)
	}
	w.ids, w.mask, w.haveIDs, w.haveSample = ids, mask, ids != nil, true
	return w, nil
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
	// Unrepaired counts what Repair found and could not fix: a corrupt output or a temp
	// file it may not remove (a directory, an immutable file). Each has a problem line.
	Unrepaired int
	// Problems describes each finding, one line each, capped at maxProblems.
	Problems []string
	// Unlisted counts the findings past the cap, so a listing can say "and N more".
	Unlisted int
}

const maxProblems = 100

func (r *VerifyReport) problem(format string, args ...any) {
	if len(r.Problems) < maxProblems {
		r.Problems = append(r.Problems, fmt.Sprintf(format, args...))
	} else {
		r.Unlisted++
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
	name := opt.Format
	if name == "" {
		name = meta.OutputFormat
	}
	l, err := ParseLayout(outputDir, name)
	if err != nil {
		return rep, err
	}

	for _, s := range slices.Sorted(maps.Keys(done)) {
		if err := ctx.Err(); err != nil {
			return rep, fmt.Errorf("verify %s: %w", outputDir, err)
		}
		r := done[s]
		rep.Checked++
		path := l.Path(s)
		reason, missing, err := checkDone(ctx, path, r, total, meta, haveMeta, opt, buf)
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
		// One that cannot be removed (a directory, an immutable file) is reported and
		// left; the other samples are still repaired.
		if !missing {
			if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
				rep.Unrepaired++
				rep.problem("sample %d: %s: %s; back to pending, but it cannot be removed (%v): remove it by hand", s, filepath.Base(path), reason, err)
				continue
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
	dirs := []string{"."}
	if l.grouped() {
		dirs = dirs[:0]
		for _, d := range rows {
			if d.IsDir() && l.isDataDir(d.Name()) {
				dirs = append(dirs, d.Name())
			}
		}
	}
	for _, d := range dirs {
		dir := filepath.Join(outputDir, d)
		files, err := os.ReadDir(dir)
		if err != nil {
			return rep, fmt.Errorf("read output directory: %w", err)
		}
		for _, f := range files {
			if err := ctx.Err(); err != nil {
				return rep, fmt.Errorf("verify %s: %w", outputDir, err)
			}
			name, path := f.Name(), filepath.Join(dir, f.Name())
			rel := filepath.Join(d, name)
			if l.isTemp(name) {
				rep.TempFiles++
				if !opt.Repair {
					rep.problem("%s: leftover temp file", rel)
					continue
				}
				if err := os.Remove(path); err != nil {
					rep.Unrepaired++
					rep.problem("%s: leftover temp file; it cannot be removed (%v): remove it by hand", rel, err)
					continue
				}
				rep.Repaired++
				rep.problem("%s: leftover temp file; removed", rel)
				continue
			}
			s, ok := l.parseName(name)
			if !ok {
				continue
			}
			if _, isDone := done[s]; (isDone && l.Path(s) == path) || !opt.owns(s) {
				continue
			}
			rep.Orphans++
			if !opt.Repair {
				rep.problem("sample %d: %s: orphan, not done in the index", s, rel)
				continue
			}
			r, why, err := adoptable(ctx, path, s, total, done, meta, haveMeta, l, opt, buf)
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
func checkDone(ctx context.Context, path string, r Record, total int, meta Meta, haveMeta bool, opt VerifyOptions, buf []byte) (reason string, missing bool, err error) {
	if r.Sample >= total {
		return fmt.Sprintf("done record beyond the dataset's %d samples", total), false, nil
	}
	if !opt.owns(r.Sample) {
		return fmt.Sprintf("done record outside this shard's samples %d-%d", opt.Lo, opt.Hi), false, nil
	}
	want, err := opt.want(r.Sample, opt.Deep)
	if err != nil {
		return "", false, err
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
	info, err := readOutput(ctx, path, opt.Deep, want, buf)
	if ctx.Err() != nil {
		return "", false, fmt.Errorf("verify sample %d: %w", r.Sample, ctx.Err())
	}
	if errors.Is(err, errForeign) && r.Imported {
		reason, err := checkImported(ctx, path, r, opt.Deep, want, buf)
		return reason, false, err
	}
	switch {
	case err != nil:
		return err.Error(), false, nil
	case info.Sample != r.Sample:
		return fmt.Sprintf("metadata names sample %d", info.Sample), false, nil
	case info.CRC32C != r.CRC32C:
		return fmt.Sprintf("crc32c %08x in metadata, index recorded %08x", info.CRC32C, r.CRC32C), false, nil
	}
	if haveMeta {
		if why := fingerprintsDiffer(info, meta); why != "" {
			return why, false, nil
		}
	}
	if info.RID != r.RID {
		return fmt.Sprintf("rid %q in metadata, index recorded %q", info.RID, r.RID), false, nil
	}
	return provenanceDiffers(info, r.Sample, r.Imported, opt), false, nil
}

// provenanceDiffers says why a file's record of how it was made does not fit the job:
// its rid must name its sample, its protocol be the one this build reads, its model the
// job's, and its hook_version a version. The hook's version is not compared with one
// value: a server adopted across an upgrade of extract legitimately ran an older hook
// of the same protocol. A file import rewrote from another tool's has no rid or hook
// (its record's empty rid is compared all the same).
func provenanceDiffers(info OutputInfo, s int, imported bool, opt VerifyOptions) string {
	switch {
	case !imported && !ridNames(info.RID, s):
		return fmt.Sprintf("rid %q is not an attempt of sample %d", info.RID, s)
	case info.Protocol != protocolVersion:
		return fmt.Sprintf("protocol %q, this build writes %q", info.Protocol, protocolVersion)
	case opt.Model != "" && info.Model != opt.Model:
		return fmt.Sprintf("model %q, the job runs %q", info.Model, opt.Model)
	case !imported && !hookVersionPattern.MatchString(info.HookVersion):
		return fmt.Sprintf("hook_version %q is not a hook version", info.HookVersion)
	}
	return ""
}

// hookVersionPattern is what a dump hook's version looks like ("1.0.0", the simulator's
// "sim-1"): one printable word.
var hookVersionPattern = regexp.MustCompile(`^[0-9A-Za-z][0-9A-Za-z._+-]{0,63}$`)

// ridNames says whether rid is s<sample, 9 digits>-a<attempt> of sample s. It parses
// locally because checkpoint sits below the shm package that owns the format.
func ridNames(rid string, s int) bool {
	rest, ok := strings.CutPrefix(rid, fmt.Sprintf("s%09d-a", s))
	if !ok || rest == "" {
		return false
	}
	n, err := strconv.Atoi(rest)
	return err == nil && n >= 0 && strconv.Itoa(n) == rest
}

// fingerprintsDiffer says why a file was not made by the index's job: another dataset,
// or another config (model, width, layer set). A file without a config fingerprint
// predates them and cannot show it was made under this config, so it fails too.
func fingerprintsDiffer(info OutputInfo, meta Meta) string {
	switch {
	case info.DatasetFingerprint != meta.DatasetFingerprint:
		return fmt.Sprintf("dataset fingerprint %q, index has %q", info.DatasetFingerprint, meta.DatasetFingerprint)
	case info.ConfigFingerprint != meta.ConfigFingerprint:
		return fmt.Sprintf("config fingerprint %q, index has %q (made under another model, width or layer set)", info.ConfigFingerprint, meta.ConfigFingerprint)
	}
	return ""
}

// adoptable decides whether an orphan may become a done record: only a file that passes
// the deep check, sits where its sample belongs, names that sample, comes from this
// index's dataset and config, and (with opt.Expect) holds the dataset's input_ids and
// loss_mask byte for byte. A perfect file of another sample put in this one's place
// fails the last check.
func adoptable(ctx context.Context, path string, s, total int, done map[int]Record, meta Meta, haveMeta bool, l Layout, opt VerifyOptions, buf []byte) (Record, string, error) {
	switch {
	case !haveMeta:
		return Record{}, "index has no job metadata to match its dataset fingerprint", nil
	case s >= total:
		return Record{}, fmt.Sprintf("beyond the dataset's %d samples", total), nil
	case l.Path(s) != path:
		return Record{}, "misplaced; belongs in " + filepath.Dir(l.Path(s)), nil
	}
	if _, isDone := done[s]; isDone {
		return Record{}, "sample already done from its own file", nil
	}
	want, err := opt.want(s, true)
	if err != nil {
		return Record{}, "", err
	}
	info, err := readOutput(ctx, path, true, want, buf)
	if ctx.Err() != nil {
		return Record{}, "", fmt.Errorf("verify sample %d: %w", s, ctx.Err())
	}
	if err != nil {
		return Record{}, err.Error(), nil
	}
	if info.Sample != s {
		return Record{}, fmt.Sprintf("metadata names sample %d", info.Sample), nil
	}
	if why := fingerprintsDiffer(info, meta); why != "" {
		return Record{}, why, nil
	}
	if why := provenanceDiffers(info, s, false, opt); why != "" {
		return Record{}, why, nil
	}
	return Record{
		Sample: s, State: StateDone, Attempt: attemptOf(info.RID), RID: info.RID,
		Bytes: info.Bytes, CRC32C: info.CRC32C, Tokens: info.Tokens, SourceID: info.SourceID,
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
