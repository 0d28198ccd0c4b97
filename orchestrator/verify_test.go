package orchestrator

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/extract-dev/extract/checkpoint"
	"github.com/extract-dev/extract/configs"
	"github.com/extract-dev/extract/dataset"
	"github.com/extract-dev/extract/internal/safetensors"
	"github.com/extract-dev/extract/shm"
)

// verifyJob is a job of three samples laid out in temp dirs, with outputs made by the
// real mover from dumps the way a run makes them.
type verifyJob struct {
	t   *testing.T
	cfg *configs.Config
	ds  *dataset.Dataset
	ids [][]int64
}

func newVerifyJob(t *testing.T) *verifyJob {
	t.Helper()
	dir := t.TempDir()
	j := &verifyJob{t: t, ids: [][]int64{{1, 2, 3}, {4, 5}, {6, 7, 8, 9}}}
	var lines strings.Builder
	for _, ids := range j.ids {
		lines.WriteString(`{"input_ids": [`)
		for k, id := range ids {
			if k > 0 {
				lines.WriteString(",")
			}
			lines.WriteString(strconv.FormatInt(id, 10))
		}
		lines.WriteString("]}\n")
	}
	j.cfg = &configs.Config{
		Dataset:   writeDataset(t, lines.String()),
		OutputDir: filepath.Join(dir, "out"),
		StateDir:  filepath.Join(dir, "out", ".extract"),
		ShmDir:    filepath.Join(dir, "shm"),
		Server:    configs.Server{Kind: "simulator", Layers: []int{2, 30, 58}, Simulator: configs.Simulator{HiddenSize: 8}},
		Run:       configs.Run{MaxAttempts: 5},
	}
	for _, d := range []string{j.cfg.OutputDir, j.cfg.ShmDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	ds, err := dataset.Open(j.cfg.Dataset)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ds.Close() })
	j.ds = ds
	return j
}

func (j *verifyJob) index() string { return filepath.Join(j.cfg.StateDir, "index.db") }

// output writes sample s's output under attempt a through the mover.
func (j *verifyJob) output(s, a int) {
	j.t.Helper()
	ids := j.ids[s]
	T, H := int64(len(ids)), int64(j.cfg.HiddenSize())
	rid := shm.RID{Sample: s, Attempt: a}.String()
	hdr, _, err := safetensors.EncodeHeader([]safetensors.Spec{
		{Name: "aux_hidden_state", DType: safetensors.BF16, Shape: []int64{T, 3 * H}},
		{Name: "hidden_state", DType: safetensors.BF16, Shape: []int64{T, H}},
		{Name: "input_ids", DType: safetensors.I64, Shape: []int64{T}},
	}, map[string]string{"rid": rid, "protocol": "1", "layers": j.cfg.LayersString(), "model": j.cfg.ServedModel(), "hook_version": "test"})
	if err != nil {
		j.t.Fatal(err)
	}
	body := append(hdr, make([]byte, 2*T*4*H)...)
	for _, id := range ids {
		body = binary.LittleEndian.AppendUint64(body, uint64(id))
	}
	// Made outside staging: the test's staging dir holds only the names it sets up.
	dump := filepath.Join(j.t.TempDir(), rid+shm.DumpSuffix)
	if err := os.WriteFile(dump, body, 0o644); err != nil {
		j.t.Fatal(err)
	}
	f, err := os.Open(dump)
	if err != nil {
		j.t.Fatal(err)
	}
	defer f.Close()
	m := checkpoint.Mover{OutputDir: j.cfg.OutputDir}
	_, err = m.Move(context.Background(), f, dump, checkpoint.Expect{
		Sample: s, RID: rid, InputIDs: ids, DatasetFingerprint: j.ds.Fingerprint, Layers: j.cfg.LayersString(),
		Model: j.cfg.ServedModel(), HiddenSize: j.cfg.HiddenSize(), ConfigFingerprint: j.cfg.Fingerprint(),
	})
	if err != nil {
		j.t.Fatal(err)
	}
}

func (j *verifyJob) touch(path string) {
	j.t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		j.t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte("x"), 0o644); err != nil {
		j.t.Fatal(err)
	}
}

func TestRebuildTakesAnAttemptBaseAboveEveryAttemptTheFilesStagingAndQuarantineShow(t *testing.T) {
	j := newVerifyJob(t)
	j.output(0, 3)
	j.output(1, 1)
	j.touch(filepath.Join(j.cfg.ShmDir, "s000000002-a7.safetensors.partial"))
	j.touch(filepath.Join(j.cfg.ShmDir, heldPrefix+"s000000001-a6.safetensors"))
	j.touch(filepath.Join(j.cfg.ShmDir, "s000000002-a900.txt")) // not a dump name
	j.touch(filepath.Join(j.cfg.StateDir, "quarantine", "s000000000-a4.safetensors"))

	res, err := Verify(context.Background(), j.cfg, checkpoint.VerifyOptions{Repair: true})
	if err != nil {
		t.Fatal(err)
	}
	rb := res.Rebuild
	if rb == nil || rb.Why != "missing" || rb.MovedAside != "" || rb.Files != 2 || rb.Adopted != 2 || rb.Refused != 0 {
		t.Fatalf("rebuild = %+v", rb)
	}
	// 7 is the highest attempt shown; run.max_attempts of headroom covers the ones that
	// left no trace.
	if want := 7 + j.cfg.Run.MaxAttempts; rb.AttemptBase != want {
		t.Errorf("attempt base %d, want %d", rb.AttemptBase, want)
	}
	ix, err := checkpoint.Open(j.index(), checkpoint.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer ix.Close()
	// Sample 2 had no file: its next attempt must not repeat the a7 still in staging.
	attempts, err := beginAttempts(ix, []int{2})
	if err != nil {
		t.Fatal(err)
	}
	if attempts[0] <= 7 {
		t.Errorf("sample 2: next attempt %d repeats a rid the job already used", attempts[0])
	}
	if _, err := os.Stat(j.index() + ".rebuild"); !os.IsNotExist(err) {
		t.Errorf("the rebuild's temporary index was left behind: %v", err)
	}
}

func TestVerifyWithoutRepairOnADamagedIndexNamesItWhatIsWrongAndTheFixAndChangesNothing(t *testing.T) {
	j := newVerifyJob(t)
	j.output(0, 1)
	if _, err := Verify(context.Background(), j.cfg, checkpoint.VerifyOptions{Repair: true}); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(j.index(), 5000); err != nil {
		t.Fatal(err)
	}
	before, _ := os.ReadFile(j.index())
	_, err := Verify(context.Background(), j.cfg, checkpoint.VerifyOptions{Deep: true})
	if err == nil || errors.Is(err, ErrRefused) || errors.Is(err, ErrTemporary) {
		t.Fatalf("err = %v; want a plain failure (exit 1)", err)
	}
	for _, want := range []string{j.index(), "damaged", "extract verify --repair", "never deletes"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not say %q: %v", want, err)
		}
	}
	after, _ := os.ReadFile(j.index())
	if !bytes.Equal(before, after) {
		t.Error("verify without --repair changed the damaged index")
	}
	if aside, _ := filepath.Glob(j.index() + ".broken-*"); len(aside) > 0 {
		t.Errorf("verify without --repair moved the index aside: %v", aside)
	}
}

func TestAnIndexNoJobWasEverWrittenToIsMovedAsideAndRebuilt(t *testing.T) {
	j := newVerifyJob(t)
	j.output(2, 2)
	if err := os.MkdirAll(j.cfg.StateDir, 0o755); err != nil {
		t.Fatal(err)
	}
	ix, err := checkpoint.Open(j.index(), checkpoint.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ix.Close()
	// A rebuild that died before its rename left its temporary index.
	j.touch(j.index() + ".rebuild")
	res, err := Verify(context.Background(), j.cfg, checkpoint.VerifyOptions{Repair: true})
	if err != nil {
		t.Fatal(err)
	}
	if rb := res.Rebuild; rb == nil || !strings.HasPrefix(rb.Why, "empty") || rb.MovedAside == "" || rb.Adopted != 1 {
		t.Fatalf("rebuild = %+v", rb)
	}
	if _, err := os.Stat(res.Rebuild.MovedAside); err != nil {
		t.Errorf("the empty index is not kept aside: %v", err)
	}
	if _, err := Verify(context.Background(), j.cfg, checkpoint.VerifyOptions{Deep: true}); err != nil {
		t.Errorf("deep verify of the rebuilt index: %v", err)
	}
}

func TestRepairUnderAnotherLayerSetIsRefusedAndKeepsEveryFile(t *testing.T) {
	j := newVerifyJob(t)
	for s := range j.ids {
		j.output(s, 1)
	}
	if _, err := Verify(context.Background(), j.cfg, checkpoint.VerifyOptions{Repair: true}); err != nil {
		t.Fatal(err)
	}
	j.cfg.Server.Layers = []int{3, 31, 59}
	res, err := Verify(context.Background(), j.cfg, checkpoint.VerifyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Mismatch == "" || res.Corrupt != 3 || res.OK != 0 {
		t.Errorf("verify under other layers: mismatch %q, %d ok, %d corrupt; want every file rejected", res.Mismatch, res.OK, res.Corrupt)
	}
	_, err = Verify(context.Background(), j.cfg, checkpoint.VerifyOptions{Repair: true})
	if !errors.Is(err, ErrRefused) {
		t.Fatalf("repair under other layers: %v; want ErrRefused", err)
	}
	for s := range j.ids {
		if _, err := os.Stat(checkpoint.OutputPath(j.cfg.OutputDir, s)); err != nil {
			t.Errorf("sample %d: %v", s, err)
		}
	}
}

func TestVerifyIsATemporaryFailureWhileARunHoldsTheLock(t *testing.T) {
	j := newVerifyJob(t)
	j.output(0, 1)
	if err := os.MkdirAll(j.cfg.StateDir, 0o755); err != nil {
		t.Fatal(err)
	}
	// An OFD lock conflicts with another open file description in the same process.
	lock, err := AcquireLock(j.cfg.StateDir, "run")
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Release()
	for _, repair := range []bool{false, true} {
		if _, err := Verify(context.Background(), j.cfg, checkpoint.VerifyOptions{Repair: repair}); !errors.Is(err, ErrTemporary) {
			t.Errorf("repair=%v: err = %v, want ErrTemporary", repair, err)
		}
	}
	if _, err := os.Stat(j.index()); !os.IsNotExist(err) {
		t.Errorf("verify built an index under a held lock: %v", err)
	}
}
