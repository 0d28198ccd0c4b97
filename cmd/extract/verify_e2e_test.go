package main

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/extract-dev/extract/checkpoint"
)

// crashed reports whether a command died in the Go runtime (a SIGBUS on a mapped page
// is "fatal error: fault" and exit 2) instead of returning an error.
func crashed(r result) bool {
	return strings.Contains(r.stderr, "fatal error") || strings.Contains(r.stderr, "goroutine ") ||
		strings.Contains(r.stderr, "SIGBUS") || strings.Contains(r.stderr, "panic:")
}

// fileID is what a rewrite of an output file would change.
type fileID struct {
	ino   uint64
	mtime time.Time
}

// outputIDs records every output file's inode and mtime, to show a run wrote nothing.
func (j *job) outputIDs() map[int]fileID {
	j.t.Helper()
	ids := map[int]fileID{}
	for i := range j.samples {
		st, err := os.Stat(checkpoint.OutputPath(j.out, i))
		if err != nil {
			j.t.Fatalf("sample %d: %v", i, err)
		}
		ids[i] = fileID{st.Sys().(*syscall.Stat_t).Ino, st.ModTime()}
	}
	return ids
}

func (j *job) index() string { return filepath.Join(j.state, "index.db") }

func (j *job) mustRun(args ...string) result {
	j.t.Helper()
	r := j.run(args...)
	if r.code != 0 {
		j.t.Fatalf("extract %v: exit %d\nstdout %s\nstderr %s", args, r.code, r.stdout, r.stderr)
	}
	return r
}

func TestTruncatedIndexCrashesNoCommandAndRepairRebuildsItFromTheFiles(t *testing.T) {
	j := newJob(t, 120, 0)
	j.mustRun("run")
	if err := os.Truncate(j.index(), 10000); err != nil {
		t.Fatal(err)
	}
	damaged, err := os.ReadFile(j.index())
	if err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"status"}, {"status", "--json"}, {"verify"}, {"verify", "--deep"}, {"run", "--resume"}} {
		r := j.run(args...)
		if crashed(r) || r.code == 0 || !strings.Contains(r.stderr, "index.db") {
			t.Errorf("extract %v on a truncated index: exit %d, stderr %q; want an error naming index.db, no crash", args, r.code, r.stderr)
		}
	}
	// verify says what is wrong and what fixes it, with its "found problems" exit code.
	if r := j.run("verify"); r.code != 1 || !strings.Contains(r.stderr, "truncated") || !strings.Contains(r.stderr, "extract verify --repair") {
		t.Errorf("verify on a truncated index: exit %d, stderr %q; want 1 saying truncated and naming the fix", r.code, r.stderr)
	}

	r := j.mustRun("verify", "--repair")
	if !strings.Contains(r.stdout, "index.db was damaged") || !strings.Contains(r.stdout, "rebuilt from 120 files: 120 adopted, 0 refused") {
		t.Errorf("repair output does not say what happened: %q", r.stdout)
	}
	aside, _ := filepath.Glob(j.index() + ".broken-*")
	if len(aside) != 1 || !strings.Contains(r.stdout, "moved aside to "+aside[0]) {
		t.Fatalf("damaged index not moved aside as reported: %v, stdout %q", aside, r.stdout)
	}
	if kept, err := os.ReadFile(aside[0]); err != nil || !bytes.Equal(kept, damaged) {
		t.Errorf("the moved-aside index is not the damaged file byte for byte (err %v)", err)
	}
	if st := j.status(); num(st["done"]) != 120 || st["state"] != "complete" {
		t.Fatalf("status after the rebuild: %v", st)
	}
	if r := j.mustRun("verify", "--deep"); !strings.Contains(r.stdout, "120 ok") {
		t.Errorf("deep verify after the rebuild: %q", r.stdout)
	}

	// The rebuilt index is complete: a resume sends the simulator nothing and rewrites
	// no file.
	before := j.outputIDs()
	serverLog := mustRead(t, filepath.Join(j.state, "logs", "server.log"))
	if r := j.mustRun("run", "--resume"); !strings.Contains(r.stdout, "complete") {
		t.Errorf("resume after the rebuild: %q", r.stdout)
	}
	if got := mustRead(t, filepath.Join(j.state, "logs", "server.log")); got != serverLog {
		t.Errorf("the simulator ran again after the rebuild:\n%s", strings.TrimPrefix(got, serverLog))
	}
	for i, id := range j.outputIDs() {
		if id != before[i] {
			t.Errorf("sample %d: output rewritten by the resume", i)
		}
	}
	j.requireExact()
}

func TestMissingIndexIsRebuiltFromTheFilesByRepair(t *testing.T) {
	j := newJob(t, 40, 0)
	j.mustRun("run")
	if err := os.Remove(j.index()); err != nil {
		t.Fatal(err)
	}
	if r := j.run("verify"); r.code != 1 || !strings.Contains(r.stderr, "index.db is missing") || !strings.Contains(r.stderr, "--repair") {
		t.Errorf("verify without an index: exit %d, stderr %q; want 1 naming the missing index and the fix", r.code, r.stderr)
	}
	r := j.mustRun("verify", "--repair")
	if !strings.Contains(r.stdout, "index.db was missing; rebuilt from 40 files: 40 adopted, 0 refused") {
		t.Errorf("repair output: %q", r.stdout)
	}
	if st := j.status(); num(st["done"]) != 40 || num(st["total"]) != 40 {
		t.Fatalf("status after the rebuild: %v", st)
	}
	j.mustRun("verify", "--deep")
	j.requireExact()
}

func TestRepairWithNoIndexAndNoFilesRefusesAndCreatesNothing(t *testing.T) {
	j := newJob(t, 5, 0)
	r := j.run("verify", "--repair")
	if r.code != 2 || !strings.Contains(r.stderr, "nothing to verify or rebuild") {
		t.Errorf("verify --repair before any run: exit %d, stderr %q; want 2, nothing to rebuild", r.code, r.stderr)
	}
	if _, err := os.Stat(j.state); !os.IsNotExist(err) {
		t.Errorf("verify --repair with nothing to rebuild created %s (%v)", j.state, err)
	}
}

// relabel returns a copy of an output file whose metadata names another sample, the
// header rewritten in place with the same length: a valid file, of the wrong sample.
func relabel(t *testing.T, path string, from, to string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	old, repl := []byte(`"sample":"`+from+`"`), []byte(`"sample":"`+to+`"`)
	if len(old) != len(repl) || bytes.Count(b, old) != 1 {
		t.Fatalf("%s: cannot relabel %s as %s in place", path, old, repl)
	}
	return bytes.Replace(b, old, repl, 1)
}

// overflowFile is a 656-byte output file whose hidden_state shape [4, 2^61] makes the
// byte count 4·2^61·2 = 2^64 wrap to 0 in unchecked arithmetic, so its empty data range
// looked right.
func overflowFile(t *testing.T, sample string) []byte {
	t.Helper()
	const huge = int64(1) << 61
	hdr := map[string]any{
		"__metadata__": map[string]string{
			"format": "extract/v1", "sample": sample, "rid": "s000000052-a1", "tokens": "4",
			"crc32c": "00000000", "dataset_fingerprint": "x", "config_fingerprint": "x", "layers": "2,30,58",
		},
		"input_ids":        map[string]any{"dtype": "I64", "shape": []int64{4}, "data_offsets": []int64{0, 32}},
		"loss_mask":        map[string]any{"dtype": "I64", "shape": []int64{4}, "data_offsets": []int64{32, 64}},
		"hidden_state":     map[string]any{"dtype": "BF16", "shape": []int64{4, huge}, "data_offsets": []int64{64, 64}},
		"aux_hidden_state": map[string]any{"dtype": "BF16", "shape": []int64{4, 3 * huge}, "data_offsets": []int64{64, 64}},
	}
	js, err := json.Marshal(hdr)
	if err != nil {
		t.Fatal(err)
	}
	const size = 656
	pad := size - 8 - 64 - len(js)
	if pad < 0 {
		t.Fatalf("header of %d bytes does not fit in %d", len(js), size)
	}
	js = append(js, bytes.Repeat([]byte(" "), pad)...)
	out := binary.LittleEndian.AppendUint64(nil, uint64(len(js)))
	out = append(out, js...)
	return append(out, make([]byte, 64)...)
}

func TestRepairAdoptsNeitherARelabelledFileNorAnOverflowingShapeAndDeepVerifyCatchesTheRelabel(t *testing.T) {
	j := newJob(t, 120, 0)
	j.mustRun("run")
	p51, p52 := checkpoint.OutputPath(j.out, 51), checkpoint.OutputPath(j.out, 52)
	fake51 := relabel(t, checkpoint.OutputPath(j.out, 60), "60", "51")
	huge52 := overflowFile(t, "52")
	if len(huge52) != 656 {
		t.Fatalf("overflow file is %d bytes", len(huge52))
	}

	// Samples 51 and 52 lose their files and go back to pending; then the impostors
	// appear where they belong.
	os.Remove(p51)
	os.Remove(p52)
	j.mustRun("verify", "--repair")
	if st := j.status(); num(st["done"]) != 118 {
		t.Fatalf("after sending 51 and 52 back: %v", st)
	}
	if err := os.WriteFile(p51, fake51, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p52, huge52, 0o644); err != nil {
		t.Fatal(err)
	}
	r := j.mustRun("verify", "--repair")
	for _, s := range []string{"sample 51: rows_0-2000/data_51.safetensors: orphan not adopted", "sample 52: rows_0-2000/data_52.safetensors: orphan not adopted"} {
		if !strings.Contains(r.stdout, s) {
			t.Errorf("repair does not say %q:\n%s", s, r.stdout)
		}
	}
	if st := j.status(); num(st["done"]) != 118 {
		t.Fatalf("repair adopted an impostor: %v", st)
	}
	// A rebuild from the files refuses them too.
	os.Remove(j.index())
	if r := j.mustRun("verify", "--repair"); !strings.Contains(r.stdout, "rebuilt from 120 files: 118 adopted, 2 refused") {
		t.Errorf("rebuild: %q", r.stdout)
	}
	j.mustRun("run", "--resume")
	j.requireExact()

	// The relabelled copy indexed as done (its own size and crc32c, so nothing but the
	// tokens tell it apart): a quick verify cannot see it, a deep one must.
	if err := os.WriteFile(p51, fake51, 0o644); err != nil {
		t.Fatal(err)
	}
	fi, err := checkpoint.ReadOutput(p51, true)
	if err != nil {
		t.Fatal(err)
	}
	ix, err := checkpoint.Open(j.index(), checkpoint.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	err = ix.CommitDone(checkpoint.Record{Sample: 51, Attempt: 9, RID: fi.RID, Bytes: fi.Bytes, CRC32C: fi.CRC32C, Tokens: fi.Tokens})
	ix.Close()
	if err != nil {
		t.Fatal(err)
	}
	// Even the quick verify, which reads headers only, sees that its rid is sample 60's.
	if r := j.run("verify"); r.code != 1 || !strings.Contains(r.stdout, `sample 51: data_51.safetensors: rid "s000000060-a1" is not an attempt of sample 51`) {
		t.Fatalf("quick verify of the impostor: exit %d %q; want 1 naming its rid", r.code, r.stdout)
	}
	r = j.run("verify", "--deep")
	if r.code != 1 || !strings.Contains(r.stdout, "sample 51") || !strings.Contains(r.stdout, "the dataset") {
		t.Fatalf("deep verify of a relabelled file: exit %d, stdout %q; want 1 naming sample 51 against the dataset", r.code, r.stdout)
	}
	j.mustRun("verify", "--deep", "--repair")
	j.mustRun("run", "--resume")
	j.requireExact()
}

func TestFreshRunAfterChangingLayersRewritesEveryFileAndVerifyUnderTheOldLayersRejectsThem(t *testing.T) {
	j := newJob(t, 40, 0)
	j.mustRun("run")
	oldEnv := j.env
	j.env = append(append([]string{}, oldEnv...), "EXTRACT_SERVER_LAYERS=3,31,59")
	j.mustRun("run", "--fresh")
	for i := range j.samples {
		info, err := checkpoint.ReadOutput(checkpoint.OutputPath(j.out, i), true)
		if err != nil {
			t.Fatal(err)
		}
		if info.Layers != "3,31,59" {
			t.Errorf("sample %d: layers %q after --fresh with layers 3,31,59", i, info.Layers)
		}
	}
	if r := j.mustRun("verify", "--deep"); !strings.Contains(r.stdout, "40 ok") {
		t.Errorf("deep verify under the new layers: %q", r.stdout)
	}

	j.env = oldEnv
	r := j.run("verify")
	if r.code != 1 || !strings.Contains(r.stdout, "0 ok") || !strings.Contains(r.stdout, "40 corrupt") || !strings.Contains(r.stdout, `layers "3,31,59", the job captures "2,30,58"`) {
		t.Errorf("verify under the old layers: exit %d, stdout %q; want every file rejected for its layers", r.code, r.stdout)
	}
	// Repair under the wrong config would throw every good file away: refused, naming
	// the setting that changed.
	if r := j.run("verify", "--repair"); r.code != 2 || !strings.Contains(r.stderr, "server.layers was [3 31 59], now [2 30 58]") {
		t.Errorf("verify --repair under the old layers: exit %d, stderr %q; want 2, refused naming server.layers", r.code, r.stderr)
	}
	if r := j.run("run", "--resume"); r.code != 2 || !strings.Contains(r.stderr, "server.layers was [3 31 59], now [2 30 58]") {
		t.Errorf("run --resume under the old layers: exit %d, stderr %q; want 2, refused naming server.layers", r.code, r.stderr)
	}
	if n, _ := filepath.Glob(filepath.Join(j.out, "rows_*", "data_*.safetensors")); len(n) != 40 {
		t.Errorf("%d output files left, want 40", len(n))
	}
}

func TestVerifyWhileARunHoldsTheLockIsATemporaryFailure(t *testing.T) {
	j := newJob(t, 200, 2000)
	_, wait := j.start("run")
	j.waitStatus("the run to start", func(st map[string]any) bool { return st["state"] == "running" })
	if r := j.run("verify"); r.code != 75 || !strings.Contains(r.stderr, "holds") {
		t.Errorf("verify during a run: exit %d, stderr %q; want 75 naming the holder", r.code, r.stderr)
	}
	j.mustRun("stop")
	if code, stderr := wait(); code != 75 {
		t.Fatalf("stopped run exit %d, want 75 after a drain\n%s", code, stderr)
	}
}
