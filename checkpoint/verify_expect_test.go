package checkpoint

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

// dataset is the test jobs' dataset as Verify sees it: sample i has idsOf(i, 5) and
// the default all-ones loss mask, unless changed.
type dataset struct {
	n    int
	ids  map[int][]int64
	mask map[int][]int64
	text map[int]bool
}

func (d *dataset) Len() int { return d.n }

func (d *dataset) Sample(i int) ([]int64, []int64, error) {
	if i < 0 || i >= d.n {
		return nil, nil, fmt.Errorf("sample %d out of range", i)
	}
	if d.text[i] {
		return nil, nil, nil
	}
	if ids, ok := d.ids[i]; ok {
		return ids, d.mask[i], nil
	}
	return idsOf(i, 5), d.mask[i], nil
}

// bigJob is an index of total samples with nothing done, a mover and its dataset.
type bigJob struct {
	ix    *Index
	out   string
	shm   string
	m     *Mover
	total int
	ds    *dataset
}

func newBigJob(t *testing.T, total int) *bigJob {
	t.Helper()
	return &bigJob{ix: newIndex(t, total), out: t.TempDir(), shm: t.TempDir(), m: &Mover{OutputDir: t.TempDir()}, total: total, ds: &dataset{n: total}}
}

func (j *bigJob) move(t *testing.T, sample int, mangle func(*Expect)) Moved {
	t.Helper()
	want := expectFor(sample, 5)
	if mangle != nil {
		mangle(&want)
	}
	j.m.OutputDir = j.out
	moved, err := j.m.moveFile(context.Background(), writeDump(t, j.shm, dumpSpec{sample: sample}), want)
	if err != nil {
		t.Fatal(err)
	}
	return moved
}

func (j *bigJob) commit(t *testing.T, moved Moved, sample int) {
	t.Helper()
	err := j.ix.CommitDone(Record{Sample: sample, Attempt: 1, RID: ridOf(sample, 1), Bytes: moved.Bytes, CRC32C: moved.CRC32C, Tokens: moved.Tokens})
	if err != nil {
		t.Fatal(err)
	}
}

func (j *bigJob) opts(deep, repair bool) VerifyOptions {
	return VerifyOptions{Deep: deep, Repair: repair, Expect: j.ds, HiddenSize: 8, Layers: "2,30,58"}
}

func (j *bigJob) verify(t *testing.T, opt VerifyOptions) VerifyReport {
	t.Helper()
	rep, err := Verify(context.Background(), j.ix, j.out, j.total, opt)
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

// relabel copies sample from's output to sample to's place and rewrites its metadata
// sample (same width, so no offset moves and the crc32c of the data still holds): the
// file is perfect in itself and wrong for its place.
func relabel(t *testing.T, out string, from, to int) string {
	t.Helper()
	b, err := os.ReadFile(OutputPath(out, from))
	if err != nil {
		t.Fatal(err)
	}
	old, repl := []byte(`"sample":"`+strconv.Itoa(from)+`"`), []byte(`"sample":"`+strconv.Itoa(to)+`"`)
	if len(old) != len(repl) || bytes.Count(b, old) != 1 {
		t.Fatalf("cannot relabel %d as %d", from, to)
	}
	b = bytes.Replace(b, old, repl, 1)
	b = bytes.Replace(b, []byte(`"rid":"`+ridOf(from, 1)+`"`), []byte(`"rid":"`+ridOf(to, 1)+`"`), 1)
	dst := OutputPath(out, to)
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return dst
}

func TestVerifyRepairDoesNotAdoptACopyOfSample60RelabelledAsSample51(t *testing.T) {
	j := newBigJob(t, 100)
	j.move(t, 60, nil) // an orphan of its own: the control
	relabel(t, j.out, 60, 51)
	if _, err := ReadOutput(OutputPath(j.out, 51), true); err != nil {
		t.Fatalf("the relabelled file must be valid in itself: %v", err)
	}
	rep := j.verify(t, j.opts(false, true))
	if rep.Orphans != 2 || rep.Repaired != 1 {
		t.Fatalf("report %+v", rep)
	}
	wantProblem(t, rep, "sample 51: rows_0-2000/data_51.safetensors: orphan not adopted: input_ids differ from the dataset")
	if _, ok, _ := j.ix.Get(51); ok {
		t.Fatal("sample 60's data was adopted as sample 51")
	}
	if r := mustGet(t, j.ix, 60); r.State != StateDone {
		t.Fatalf("sample 60's own file was not adopted: %+v", r)
	}
}

// overflowOutput writes a 656-byte-class output whose hidden_state is [4, 2^61] BF16:
// 4·2^61·2 bytes wrap to 0 in int64, as 4·3·2^61·2 do for aux_hidden_state, so the
// file holds only its ids and mask and passed for a 4-token sample of width 2^61.
func overflowOutput(t *testing.T, out string, sample int) string {
	t.Helper()
	ids, mask := int64sLE(idsOf(sample, 4)), int64sLE([]int64{1, 1, 1, 1})
	data := append(ids, mask...)
	sum := crc32.Checksum(data, castagnoli)
	hdr := fmt.Sprintf(`{"input_ids":{"dtype":"I64","shape":[4],"data_offsets":[0,32]},`+
		`"loss_mask":{"dtype":"I64","shape":[4],"data_offsets":[32,64]},`+
		`"hidden_state":{"dtype":"BF16","shape":[4,2305843009213693952],"data_offsets":[64,64]},`+
		`"aux_hidden_state":{"dtype":"BF16","shape":[4,6917529027641081856],"data_offsets":[64,64]},`+
		`"__metadata__":{"format":"extract/v1","sample":"%d","rid":"%s","dataset_fingerprint":"fp-1","config_fingerprint":"cfg-1",`+
		`"layers":"2,30,58","model":"kimi-k2.5","hook_version":"0.3.1","protocol":"1","tokens":"4","crc32c":"%08x"}}`,
		sample, ridOf(sample, 1), sum)
	for len(hdr)%8 != 0 {
		hdr += " "
	}
	file := binary.LittleEndian.AppendUint64(nil, uint64(len(hdr)))
	file = append(append(file, hdr...), data...)
	path := OutputPath(out, sample)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, file, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func int64sLE(vs []int64) []byte {
	var b []byte
	for _, v := range vs {
		b = binary.LittleEndian.AppendUint64(b, uint64(v))
	}
	return b
}

func TestVerifyRepairDoesNotAdoptAFileShaped4By2To61(t *testing.T) {
	j := newBigJob(t, 10)
	j.ds.ids = map[int][]int64{7: idsOf(7, 4)}
	path := overflowOutput(t, j.out, 7)
	// Also without a dataset to compare with: the shape alone must sink it.
	for _, opt := range []VerifyOptions{j.opts(true, true), {Repair: true}} {
		rep := j.verify(t, opt)
		if rep.Orphans != 1 || rep.Repaired != 0 {
			t.Fatalf("report %+v", rep)
		}
		if _, ok, _ := j.ix.Get(7); ok {
			t.Fatal("a file of shape [4, 2^61] was adopted")
		}
	}
	if _, err := ReadOutput(path, true); err == nil {
		t.Fatal("ReadOutput accepted shape [4, 2^61]")
	}
}

func TestVerifyCountsAFileOfAnotherConfigAsCorruptAndNeverAdoptsOne(t *testing.T) {
	j := newBigJob(t, 10)
	other := func(e *Expect) { e.ConfigFingerprint = "cfg-old-layers" }
	j.commit(t, j.move(t, 1, other), 1)
	j.commit(t, j.move(t, 2, nil), 2)
	j.move(t, 3, other) // an orphan of the old config
	rep := j.verify(t, VerifyOptions{})
	if rep.Checked != 2 || rep.OK != 1 || rep.Corrupt != 1 {
		t.Fatalf("report %+v", rep)
	}
	wantProblem(t, rep, `sample 1: data_1.safetensors: config fingerprint "cfg-old-layers", index has "cfg-1"`)
	rep = j.verify(t, VerifyOptions{Repair: true})
	wantProblem(t, rep, `sample 3: rows_0-2000/data_3.safetensors: orphan not adopted: config fingerprint "cfg-old-layers"`)
	if r := mustGet(t, j.ix, 1); r.State != StatePending {
		t.Fatalf("sample 1 of another config is %s after repair", r.State)
	}
	if _, ok, _ := j.ix.Get(3); ok {
		t.Fatal("an orphan of another config was adopted")
	}
}

func TestVerifyDeepComparesTokensMaskWidthAndLayersWithTheJob(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(j *bigJob, o *VerifyOptions)
		reason string
	}{
		{"input_ids edited", func(j *bigJob, o *VerifyOptions) { ids := idsOf(2, 5); ids[4]++; j.ds.ids = map[int][]int64{2: ids} }, "input_ids differ from the dataset at position 4"},
		{"token count differs", func(j *bigJob, o *VerifyOptions) { j.ds.ids = map[int][]int64{2: idsOf(2, 6)} }, "5 tokens, the dataset's sample has 6"},
		{"loss mask differs", func(j *bigJob, o *VerifyOptions) { j.ds.mask = map[int][]int64{2: {1, 1, 0, 1, 1}} }, "loss_mask differ from the dataset at position 2"},
		{"hidden size differs", func(j *bigJob, o *VerifyOptions) { o.HiddenSize = 16 }, "hidden size 8, the job's is 16"},
		{"layers differ", func(j *bigJob, o *VerifyOptions) { o.Layers = "3,31,59" }, `layers "2,30,58", the job captures "3,31,59"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j := newBigJob(t, 10)
			for s := range 4 {
				j.commit(t, j.move(t, s, nil), s)
			}
			opt := j.opts(true, false)
			if rep := j.verify(t, opt); rep.OK != 4 || len(rep.Problems) != 0 {
				t.Fatalf("before the change: %+v", rep)
			}
			tc.change(j, &opt)
			rep := j.verify(t, opt)
			if rep.Corrupt == 0 {
				t.Fatalf("deep verify missed it: %+v", rep)
			}
			wantProblem(t, rep, tc.reason)
		})
	}
}

func TestVerifyAcceptsATextSampleWhoseIDsTheDatasetDoesNotHave(t *testing.T) {
	j := newBigJob(t, 10)
	j.ds.text = map[int]bool{4: true}
	j.commit(t, j.move(t, 4, func(e *Expect) { e.InputIDs = nil }), 4)
	if rep := j.verify(t, j.opts(true, false)); rep.OK != 1 || len(rep.Problems) != 0 {
		t.Fatalf("report %+v", rep)
	}
}

func TestVerifyRepairRemovesOnlyTheTempNamesTheMoverWrites(t *testing.T) {
	j := newBigJob(t, 10)
	j.commit(t, j.move(t, 1, nil), 1)
	dir := filepath.Dir(OutputPath(j.out, 1))
	mine := tempPath(OutputPath(j.out, 6))
	theirs := []string{".notes.tmp", ".data_6.safetensors.tmp.tmp", ".data_06.safetensors.tmp", ".data_x.safetensors.tmp", ".vimrc.swp.tmp"}
	for _, name := range append([]string{filepath.Base(mine)}, theirs...) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	rep := j.verify(t, j.opts(false, true))
	if rep.TempFiles != 1 || rep.Repaired != 1 {
		t.Fatalf("report %+v", rep)
	}
	if _, err := os.Stat(mine); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the mover's temp file survived: %v", err)
	}
	for _, name := range theirs {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			t.Fatalf("repair removed %s, which extract never writes: %v", name, err)
		}
	}
}

func TestARebuildFromTheFilesAfterTheIndexBrokeAdoptsExactlyTheGoodFiles(t *testing.T) {
	if !isolated(t) {
		return
	}
	const N = 20
	j := newBigJob(t, N)
	var want Counters
	for s := range N {
		moved := j.move(t, s, nil)
		j.commit(t, moved, s)
		want.Done++
		want.BytesWritten += moved.Bytes
		want.Tokens += int64(moved.Tokens)
	}
	if got := mustCounters(t, j.ix); got != want {
		t.Fatalf("counters %+v, want %+v", got, want)
	}
	path := j.ix.Path()
	if err := j.ix.Close(); err != nil {
		t.Fatal(err)
	}
	// The power went out with the index half written; sample 5's file is meanwhile a
	// relabelled copy of sample 6's.
	if err := os.Truncate(path, 10000); err != nil {
		t.Fatal(err)
	}
	relabel(t, j.out, 6, 5)
	_, err := Open(path, OpenOptions{})
	if !errors.Is(err, ErrDamaged) {
		t.Fatalf("Open of the broken index = %v, want ErrDamaged", err)
	}

	aside, err := MoveAside(path)
	if err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(aside); err != nil || st.Size() != 10000 || filepath.Dir(aside) != filepath.Dir(path) {
		t.Fatalf("the broken index is not kept aside: %v, %v", aside, err)
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("MoveAside left %s: %v", path, err)
	}
	ix, err := Open(path, OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer ix.Close()
	if err := ix.Init(Meta{DatasetFingerprint: "fp-1", ConfigFingerprint: "cfg-1", Total: N}); err != nil {
		t.Fatal(err)
	}
	j.ix = ix
	rep := j.verify(t, j.opts(true, true))
	if rep.Orphans != N || rep.Repaired != N-1 {
		t.Fatalf("rebuild report %+v", rep)
	}
	wantProblem(t, rep, "sample 5: rows_0-2000/data_5.safetensors: orphan not adopted: input_ids differ")
	bad, _ := os.Stat(OutputPath(j.out, 5))
	want.Done--
	want.BytesWritten -= bad.Size()
	want.Tokens -= 5
	if got := mustCounters(t, ix); got != want {
		t.Fatalf("rebuilt counters %+v, want %+v", got, want)
	}
	if _, ok, _ := ix.Get(5); ok {
		t.Fatal("the relabelled file was adopted")
	}
	if rep := j.verify(t, j.opts(true, false)); rep.Checked != N-1 || rep.OK != N-1 || rep.Orphans != 1 {
		t.Fatalf("verify after the rebuild: %+v", rep)
	}
	// A second MoveAside never overwrites the first.
	if err := ix.Close(); err != nil {
		t.Fatal(err)
	}
	second, err := MoveAside(path)
	if err != nil || second == aside {
		t.Fatalf("second MoveAside = %q, %v", second, err)
	}
	if _, err := os.Stat(aside); err != nil {
		t.Fatal(err)
	}
}

// rewriteMeta replaces old by repl (of the same length, so no offset moves and the
// crc32c of the data still holds) in the file's header: a file perfect in itself whose
// record of how it was made is wrong.
func rewriteMeta(t *testing.T, path, old, repl string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(old) != len(repl) || bytes.Count(b, []byte(old)) != 1 {
		t.Fatalf("cannot rewrite %s as %s in %s", old, repl, path)
	}
	if err := os.WriteFile(path, bytes.Replace(b, []byte(old), []byte(repl), 1), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestVerifyDeepComparesModelRidProtocolAndHookVersionWithTheIndexAndConfig(t *testing.T) {
	for _, tc := range []struct {
		name, old, repl, reason string
	}{
		{"model", `"model":"kimi-k2.5"`, `"model":"kimi-k2.6"`, `model "kimi-k2.6", the job runs "kimi-k2.5"`},
		{"rid of another attempt", `"rid":"s000000002-a1"`, `"rid":"s000000002-a7"`, `rid "s000000002-a7" in metadata, index recorded "s000000002-a1"`},
		{"protocol", `"protocol":"1"`, `"protocol":"2"`, `protocol "2", this build writes "1"`},
		{"hook_version", `"hook_version":"0.3.1"`, `"hook_version":"0 3 1"`, `hook_version "0 3 1" is not a hook version`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j := newBigJob(t, 10)
			for s := range 4 {
				j.commit(t, j.move(t, s, nil), s)
			}
			opt := j.opts(true, false)
			opt.Model = "kimi-k2.5"
			if rep := j.verify(t, opt); rep.OK != 4 || len(rep.Problems) != 0 {
				t.Fatalf("before the change: %+v", rep)
			}
			rewriteMeta(t, OutputPath(j.out, 2), tc.old, tc.repl)
			rep := j.verify(t, opt)
			if rep.Corrupt != 1 || rep.OK != 3 {
				t.Fatalf("deep verify missed it: %+v", rep)
			}
			wantProblem(t, rep, "sample 2: data_2.safetensors: "+tc.reason)
		})
	}
}

// An orphan whose rid names another sample is not adopted, even when everything else
// (its sample metadata, tokens, crc32c) fits its place.
func TestVerifyRepairDoesNotAdoptAnOrphanWhoseRidNamesAnotherSample(t *testing.T) {
	j := newBigJob(t, 10)
	j.move(t, 3, nil)
	rewriteMeta(t, OutputPath(j.out, 3), `"rid":"s000000003-a1"`, `"rid":"s000000004-a1"`)
	rep := j.verify(t, j.opts(true, true))
	wantProblem(t, rep, `sample 3: rows_0-2000/data_3.safetensors: orphan not adopted: rid "s000000004-a1" is not an attempt of sample 3`)
	if _, ok, _ := j.ix.Get(3); ok {
		t.Fatal("an orphan with another sample's rid was adopted")
	}
}

// blockOutput puts a non-empty directory at path, which no remove takes away.
func blockOutput(t *testing.T, path string) {
	t.Helper()
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(path, "inside"), 0o755); err != nil {
		t.Fatal(err)
	}
}

// verify --repair repairs every sample it can past an entry it cannot remove (a
// directory at a done sample's path, a directory under the mover's temp name) and
// reports those as unrepaired instead of stopping at the first.
func TestVerifyRepairRepairsWhatItCanPastAnEntryItCannotRemove(t *testing.T) {
	j := newBigJob(t, 10)
	for s := range 5 {
		j.commit(t, j.move(t, s, nil), s)
	}
	blockOutput(t, OutputPath(j.out, 1))
	blockOutput(t, tempPath(OutputPath(j.out, 6)))
	if err := os.Truncate(OutputPath(j.out, 3), 100); err != nil {
		t.Fatal(err)
	}
	rep, err := Verify(context.Background(), j.ix, j.out, j.total, j.opts(false, true))
	if err != nil {
		t.Fatalf("Verify --repair stopped: %v", err)
	}
	if rep.Corrupt != 2 || rep.Repaired != 1 || rep.Unrepaired != 2 || rep.TempFiles != 1 {
		t.Fatalf("report %+v, want 2 corrupt (1 repaired, 1 not), 1 temp file not removed", rep)
	}
	wantProblem(t, rep, "sample 1: data_1.safetensors: ")
	wantProblem(t, rep, "cannot be removed")
	wantProblem(t, rep, "sample 3: data_3.safetensors: size 100, index recorded")
	if _, err := os.Stat(OutputPath(j.out, 3)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("sample 3's corrupt file is still there: %v", err)
	}
	for _, s := range []int{1, 3} {
		if r := mustGet(t, j.ix, s); r.State != StatePending {
			t.Fatalf("sample %d is %s after repair, want pending", s, r.State)
		}
	}
	if r := mustGet(t, j.ix, 4); r.State != StateDone {
		t.Fatalf("sample 4 is %s after repair", r.State)
	}
}
