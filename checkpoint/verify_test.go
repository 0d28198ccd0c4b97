package checkpoint

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// job is an index of 10 samples whose samples 0..4 were moved and committed done.
type job struct {
	ix  *Index
	out string
	shm string
	m   *Mover
}

func newJob(t *testing.T) *job {
	t.Helper()
	j := &job{ix: newIndex(t, 10), out: t.TempDir(), shm: t.TempDir()}
	j.m = &Mover{OutputDir: j.out}
	for s := range 5 {
		j.commit(t, j.move(t, s))
	}
	return j
}

func (j *job) move(t *testing.T, sample int) Moved {
	t.Helper()
	moved, err := j.m.moveFile(context.Background(), writeDump(t, j.shm, dumpSpec{sample: sample}), expectFor(sample, 5))
	if err != nil {
		t.Fatal(err)
	}
	return moved
}

func (j *job) commit(t *testing.T, moved Moved) {
	t.Helper()
	info, err := ReadOutput(moved.Path, false)
	if err != nil {
		t.Fatal(err)
	}
	err = j.ix.CommitDone(Record{Sample: info.Sample, Attempt: 1, RID: info.RID, Bytes: moved.Bytes, CRC32C: moved.CRC32C, Tokens: moved.Tokens})
	if err != nil {
		t.Fatal(err)
	}
}

func (j *job) verify(t *testing.T, opt VerifyOptions) VerifyReport {
	t.Helper()
	rep, err := Verify(context.Background(), j.ix, j.out, 10, opt)
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

func wantProblem(t *testing.T, rep VerifyReport, substr string) {
	t.Helper()
	for _, p := range rep.Problems {
		if strings.Contains(p, substr) {
			return
		}
	}
	t.Fatalf("no problem mentions %q: %q", substr, rep.Problems)
}

func TestVerifyOfAConsistentJobFindsNothing(t *testing.T) {
	j := newJob(t)
	for _, deep := range []bool{false, true} {
		rep := j.verify(t, VerifyOptions{Deep: deep})
		if rep.Checked != 5 || rep.OK != 5 || len(rep.Problems) != 0 {
			t.Fatalf("deep=%v: %+v", deep, rep)
		}
	}
}

func TestVerifyReportsMissingFileAndRepairSendsItBackToPending(t *testing.T) {
	j := newJob(t)
	if err := os.Remove(OutputPath(j.out, 2)); err != nil {
		t.Fatal(err)
	}
	rep := j.verify(t, VerifyOptions{})
	if rep.Missing != 1 || rep.OK != 4 || rep.Repaired != 0 {
		t.Fatalf("report %+v", rep)
	}
	wantProblem(t, rep, "sample 2: data_2.safetensors: missing")

	rep = j.verify(t, VerifyOptions{Repair: true})
	if rep.Missing != 1 || rep.Repaired != 1 {
		t.Fatalf("repair report %+v", rep)
	}
	if r := mustGet(t, j.ix, 2); r.State != StatePending || r.Attempt != 1 {
		t.Fatalf("sample 2 after repair = %+v", r)
	}
	if c := mustCounters(t, j.ix); c.Done != 4 {
		t.Fatalf("done = %d after repair, want 4", c.Done)
	}
	if rep := j.verify(t, VerifyOptions{}); rep.Checked != 4 || rep.OK != 4 {
		t.Fatalf("verify after repair: %+v", rep)
	}
}

func TestVerifyDeepCatchesACorruptByteThatQuickDoesNot(t *testing.T) {
	j := newJob(t)
	path := OutputPath(j.out, 3)
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	patch(t, path, st.Size()-1, []byte{b[len(b)-1] ^ 0x40})

	if rep := j.verify(t, VerifyOptions{}); rep.OK != 5 || rep.Corrupt != 0 {
		t.Fatalf("quick verify: %+v; it checks size and header only", rep)
	}
	rep := j.verify(t, VerifyOptions{Deep: true})
	if rep.Corrupt != 1 || rep.OK != 4 {
		t.Fatalf("deep verify: %+v", rep)
	}
	wantProblem(t, rep, "sample 3: data_3.safetensors: crc32c mismatch")

	rep = j.verify(t, VerifyOptions{Deep: true, Repair: true})
	if rep.Repaired != 1 {
		t.Fatalf("deep repair: %+v", rep)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("repair left the corrupt file under its final name: %v", err)
	}
	if r := mustGet(t, j.ix, 3); r.State != StatePending {
		t.Fatalf("sample 3 is %s after repair", r.State)
	}
}

func TestVerifyRepairAdoptsAValidOrphan(t *testing.T) {
	j := newJob(t)
	// The orchestrator died between the move and the commit.
	moved := j.move(t, 7)
	rep := j.verify(t, VerifyOptions{})
	if rep.Orphans != 1 || rep.Repaired != 0 {
		t.Fatalf("report %+v", rep)
	}
	if _, ok, _ := j.ix.Get(7); ok {
		t.Fatal("verify without repair wrote the index")
	}
	rep = j.verify(t, VerifyOptions{Repair: true})
	if rep.Orphans != 1 || rep.Repaired != 1 {
		t.Fatalf("repair report %+v", rep)
	}
	r := mustGet(t, j.ix, 7)
	if r.State != StateDone || r.RID != ridOf(7, 1) || r.Attempt != 1 || r.Bytes != moved.Bytes || r.CRC32C != moved.CRC32C || r.Tokens != 5 {
		t.Fatalf("adopted record %+v", r)
	}
	if rep := j.verify(t, VerifyOptions{Deep: true}); rep.Checked != 6 || rep.OK != 6 || rep.Orphans != 0 {
		t.Fatalf("verify after adoption: %+v", rep)
	}
}

// A rebuild reads the sample's source id back from its file, so that status
// --source-id still finds what was done before the index was lost.
func TestVerifyRepairAdoptsAnOrphansSourceIDFromItsFile(t *testing.T) {
	j := newJob(t)
	want := expectFor(7, 5)
	want.SourceID = "conv-ü-7"
	if _, err := j.m.moveFile(context.Background(), writeDump(t, j.shm, dumpSpec{sample: 7}), want); err != nil {
		t.Fatal(err)
	}
	if rep := j.verify(t, VerifyOptions{Repair: true}); rep.Repaired != 1 {
		t.Fatalf("repair report %+v", rep)
	}
	if r := mustGet(t, j.ix, 7); r.State != StateDone || r.SourceID != "conv-ü-7" {
		t.Fatalf("adopted record %+v", r)
	}
	if got, err := j.ix.WithSourceID("conv-ü-7"); err != nil || len(got) != 1 || got[0].Sample != 7 {
		t.Fatalf("WithSourceID after the rebuild: %+v, %v", got, err)
	}
}

func TestVerifyRepairRebuildsTheIndexFromTheFilesAlone(t *testing.T) {
	j := newJob(t)
	want := mustCounters(t, j.ix)
	fresh, err := Open(filepath.Join(t.TempDir(), "index.db"), OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.Close()
	if err := fresh.Init(Meta{DatasetFingerprint: "fp-1", ConfigFingerprint: "cfg-1", Total: 10}); err != nil {
		t.Fatal(err)
	}
	rep, err := Verify(context.Background(), fresh, j.out, 10, VerifyOptions{Repair: true})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Orphans != 5 || rep.Repaired != 5 {
		t.Fatalf("rebuild report %+v", rep)
	}
	if got := mustCounters(t, fresh); got != want {
		t.Fatalf("rebuilt counters %+v, want %+v", got, want)
	}
}

func TestVerifyRepairDoesNotAdoptAnotherDatasetsFile(t *testing.T) {
	j := newJob(t)
	other, err := (&Mover{OutputDir: j.out}).moveFile(context.Background(), writeDump(t, j.shm, dumpSpec{sample: 8}),
		Expect{Sample: 8, RID: ridOf(8, 1), InputIDs: idsOf(8, 5), DatasetFingerprint: "fp-other", HiddenSize: 8, Layers: "2,30,58"})
	if err != nil {
		t.Fatal(err)
	}
	rep := j.verify(t, VerifyOptions{Repair: true})
	if rep.Orphans != 1 || rep.Repaired != 0 {
		t.Fatalf("report %+v", rep)
	}
	wantProblem(t, rep, "orphan not adopted: dataset fingerprint")
	if _, ok, _ := j.ix.Get(8); ok {
		t.Fatal("a foreign file was adopted")
	}
	if _, err := os.Stat(other.Path); err != nil {
		t.Fatalf("repair removed a file it could not adopt: %v", err)
	}
}

func TestVerifyCountsTempLitterAndRepairRemovesIt(t *testing.T) {
	j := newJob(t)
	litter := tempPath(OutputPath(j.out, 6))
	if err := os.WriteFile(litter, []byte("half a file"), 0o644); err != nil {
		t.Fatal(err)
	}
	rep := j.verify(t, VerifyOptions{})
	if rep.TempFiles != 1 || rep.Orphans != 0 || rep.OK != 5 {
		t.Fatalf("report %+v", rep)
	}
	rep = j.verify(t, VerifyOptions{Repair: true})
	if rep.TempFiles != 1 || rep.Repaired != 1 {
		t.Fatalf("repair report %+v", rep)
	}
	if _, err := os.Stat(litter); !os.IsNotExist(err) {
		t.Fatalf("temp file still there: %v", err)
	}
}

func TestVerifyStopsWhenTheContextIsCancelled(t *testing.T) {
	j := newJob(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Verify(ctx, j.ix, j.out, 10, VerifyOptions{Deep: true}); err == nil {
		t.Fatal("Verify ran on a cancelled context")
	}
}

func TestReadOutputRejectsADumpAndNamesTheFile(t *testing.T) {
	path := writeDump(t, t.TempDir(), dumpSpec{sample: 1})
	_, err := ReadOutput(path, false)
	if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "format") {
		t.Fatalf("ReadOutput of a dump = %v, want a format error naming the file", err)
	}
}
