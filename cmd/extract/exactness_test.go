package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/extract-dev/extract/internal/testsupport"
	"github.com/extract-dev/extract/shm"
)

// withEnv runs fn with extra EXTRACT_* settings for the job's commands.
func (j *job) withEnv(extra []string, fn func()) {
	saved := j.env
	j.env = append(append([]string{}, saved...), extra...)
	defer func() { j.env = saved }()
	fn()
}

// stagedDumps lists the complete dumps in the staging dir.
func (j *job) stagedDumps() []shm.RID { return dumpsIn(j.shmDir) }

// dumpsIn lists the complete dumps (regular files under a dump name) in dir.
func dumpsIn(dir string) []shm.RID {
	entries, _ := os.ReadDir(dir)
	var rids []shm.RID
	for _, e := range entries {
		if rid, ok := shm.ParseDumpName(e.Name()); ok && e.Type().IsRegular() {
			rids = append(rids, rid)
		}
	}
	return rids
}

// Issue 8, item 1: a run killed with complete dumps in staging. Each of them was a
// prefill of the whole node; the next run must move them, not ask for them again.
func TestLeftoverDumpsOfAKilledRunAreAdoptedAndNeverRequestedAgain(t *testing.T) {
	j := newJob(t, 200, 4000)
	cmd, wait := j.start("run")
	j.waitStatus("progress", func(st map[string]any) bool { return num(st["done"]) > 10 })
	// Frozen, the orchestrator stops moving while the server finishes what it was sent.
	cmd.Process.Signal(syscall.SIGSTOP)
	time.Sleep(1500 * time.Millisecond)
	cmd.Process.Signal(syscall.SIGKILL)
	wait() // the lock is free once the process is gone
	leftovers := j.stagedDumps()
	if len(leftovers) == 0 {
		t.Fatal("the killed run left no complete dump in staging: the test proves nothing")
	}
	before := len(j.requests())
	if r := j.run("run", "--resume"); r.code != 0 {
		t.Fatalf("resume exit %d\n%s", r.code, r.stderr)
	}
	resent := 0
	for _, rid := range j.requests()[before:] {
		r, err := shm.ParseRID(rid)
		if err != nil {
			t.Fatalf("simulator logged rid %q: %v", rid, err)
		}
		for _, l := range leftovers {
			if l.Sample == r.Sample {
				resent++
				t.Errorf("sample %d was left complete in staging as %s, and requested again as %s", l.Sample, l, rid)
			}
		}
	}
	adopted := strings.Count(mustRead(t, filepath.Join(j.state, "logs", "extract.log")), "adopting leftover dump")
	t.Logf("%d leftover dumps, %d adopted, %d requested again", len(leftovers), adopted, resent)
	if adopted < len(leftovers) {
		t.Errorf("%d leftovers adopted, want all %d", adopted, len(leftovers))
	}
	j.requireExact()
}

// Issue 8, item 3: samples that failed in one run and succeed in the next are done,
// not also failed: the counters follow every transition.
func TestAResumeThatRedoesEveryFailedSampleExitsZeroWithExactCounts(t *testing.T) {
	j := newJob(t, 20, 0)
	j.withEnv([]string{"EXTRACT_SERVER_SIMULATOR_CORRUPT_EVERY=1", "EXTRACT_RUN_MAX_ATTEMPTS=1"}, func() {
		r := j.run("run")
		if r.code != 1 || !strings.Contains(r.stderr, "20 samples failed") {
			t.Fatalf("faulty run: exit %d, want 1 with 20 samples failed\n%s", r.code, r.stderr)
		}
	})
	if st := j.status(); num(st["failed"]) != 20 {
		t.Fatalf("after the faulty run: %v; want 20 failed", st)
	}
	r := j.run("run", "--resume")
	if r.code != 0 || strings.Contains(r.stderr, "failed after") {
		t.Fatalf("resume: exit %d, want 0 with nothing failed\n%s", r.code, r.stderr)
	}
	var progress map[string]any
	if err := json.Unmarshal([]byte(mustRead(t, filepath.Join(j.state, "progress.json"))), &progress); err != nil {
		t.Fatal(err)
	}
	if num(progress["done"]) != 20 || num(progress["failed"]) != 0 || num(progress["pending"]) != 0 {
		t.Errorf("progress.json says done %v failed %v pending %v; want 20, 0, 0", progress["done"], progress["failed"], progress["pending"])
	}
	j.requireExact()
}

// Issue 8, items 4 and 5: the staging dir is world-writable. A FIFO or a symlink under a
// dump's name is reported, never opened, never followed, never deleted, and the run
// neither hangs nor leaks what a link points to.
func TestFIFOsAndSymlinksInStagingAreReportedAndNeverOpened(t *testing.T) {
	j := newJob(t, 60, 3000)
	secret := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secret, []byte("private"), 0o600); err != nil {
		t.Fatal(err)
	}
	links := []string{
		filepath.Join(j.shmDir, "s999999996-a1.safetensors"), // no such sample
		// Sample 5's second attempt: a real sample under a rid that no server writes
		// (its first attempt's dump would be renamed over a link named -a1).
		filepath.Join(j.shmDir, "s000000005-a2.safetensors"),
	}
	for _, l := range links {
		if err := os.Symlink(secret, l); err != nil {
			t.Fatal(err)
		}
	}
	_, wait := j.start("run")
	j.waitStatus("progress", func(st map[string]any) bool { return num(st["done"]) > 2 })
	fifo := filepath.Join(j.shmDir, "s999999990-a1.safetensors")
	if err := syscall.Mkfifo(fifo, 0o666); err != nil {
		t.Fatal(err)
	}
	if code, stderr := wait(); code != 0 {
		t.Fatalf("run exit %d\n%s", code, stderr)
	}
	for _, p := range append(links, fifo) {
		if _, err := os.Lstat(p); err != nil {
			t.Errorf("%s was removed: %v", p, err)
		}
	}
	filepath.WalkDir(j.state, func(path string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.Contains(mustRead(t, path), "private") {
			t.Errorf("%s holds the symlink target's contents", path)
		}
		return nil
	})
	var progress struct {
		Rejected map[string]int `json:"rejected"`
	}
	json.Unmarshal([]byte(mustRead(t, filepath.Join(j.state, "progress.json"))), &progress)
	if progress.Rejected["not_regular"] != 3 {
		t.Errorf("rejected %v; want not_regular 3 (two links, one FIFO)", progress.Rejected)
	}
	for _, p := range append(links, fifo) {
		os.Remove(p)
	}
	j.requireExact()
}

// Issue 8, item 8: the state dir deleted under a running job. The run cannot record
// anything any more: it must stop the server it started (or the server holds the GPUs
// with nobody left to stop it) and exit 75, not report the job done.
func TestDeletingTheStateDirMidRunStopsTheServerAndExitsTempfail(t *testing.T) {
	j := newJob(t, 300, 3000)
	_, wait := j.start("run")
	j.waitStatus("progress", func(st map[string]any) bool { return num(st["done"]) > 5 })
	pid := serverPID(j.state)
	if !alive(pid) {
		t.Fatalf("no live server recorded (pid %d)", pid)
	}
	if err := os.RemoveAll(j.state); err != nil {
		t.Fatal(err)
	}
	code, stderr := wait()
	if code != 75 || !strings.Contains(stderr, "state dir") {
		t.Fatalf("run exit %d, want 75 naming the state dir\n%s", code, stderr)
	}
	deadline := time.Now().Add(10 * time.Second)
	for alive(pid) {
		if time.Now().After(deadline) {
			syscall.Kill(pid, syscall.SIGKILL)
			t.Fatalf("server pid %d outlived the run that started it", pid)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Issue 8, item 11: the server dying while the run drains must end the drain, once,
// without spinning on the dead server's closed channel.
func TestServerDeathDuringADrainEndsTheRunWithoutSpinning(t *testing.T) {
	j := newJob(t, 80, 1500)
	cmd, wait := j.start("run")
	j.waitStatus("progress", func(st map[string]any) bool { return num(st["done"]) > 2 })
	cmd.Process.Signal(syscall.SIGTERM)
	time.Sleep(100 * time.Millisecond)
	stopRecordedServer(j.state)
	if code, stderr := wait(); code != 75 {
		t.Fatalf("run exit %d, want 75\n%s", code, stderr)
	}
	if n := strings.Count(mustRead(t, filepath.Join(j.state, "logs", "extract.log")), `"server exited"`); n > 2 {
		t.Errorf("the log says %d times that the server exited; want once", n)
	}
	if r := j.run("run", "--resume"); r.code != 0 {
		t.Fatalf("resume exit %d\n%s", r.code, r.stderr)
	}
	j.requireExact()
}

// Issue 8, item 12: extract deletes only names it writes itself.
func TestFilesInStagingAndOutputThatExtractDidNotWriteSurvive(t *testing.T) {
	j := newJob(t, 30, 0)
	foreign := filepath.Join(j.shmDir, "model-weights.bin.partial")
	if err := os.WriteFile(foreign, []byte("weights"), 0o644); err != nil {
		t.Fatal(err)
	}
	if r := j.run("run"); r.code != 0 {
		t.Fatalf("run exit %d\n%s", r.code, r.stderr)
	}
	notes := filepath.Join(j.out, "rows_0-2000", ".notes.tmp")
	if err := os.WriteFile(notes, []byte("mine"), 0o644); err != nil {
		t.Fatal(err)
	}
	if r := j.run("verify", "--repair"); r.code != 0 {
		t.Fatalf("verify --repair exit %d\n%s", r.code, r.stderr)
	}
	for path, want := range map[string]string{foreign: "weights", notes: "mine"} {
		if got, err := os.ReadFile(path); err != nil || string(got) != want {
			t.Errorf("%s: %q, %v; want it untouched", path, got, err)
		}
	}
	os.Remove(foreign)
	os.Remove(notes)
	j.requireExact()
}

// Issue 8, item 13: a dataset edited in place during a run (same length) stops the run
// with exit 2 naming it; no output carries the edited ids under the old fingerprint.
func TestADatasetEditedDuringARunStopsItWithExitTwoNamingIt(t *testing.T) {
	j := newJob(t, 200, 2000)
	_, wait := j.start("run")
	j.waitStatus("progress", func(st map[string]any) bool { return num(st["done"]) > 5 })
	b := []byte(mustRead(t, j.dataset))
	last := strings.LastIndex(string(b[:len(b)-1]), "\n") + 1
	for i := last; i < len(b); i++ {
		if b[i] >= '1' && b[i] <= '8' {
			b[i]++ // same length, other ids
			break
		}
	}
	if err := os.WriteFile(j.dataset, b, 0o644); err != nil {
		t.Fatal(err)
	}
	code, stderr := wait()
	if code != 2 || !strings.Contains(stderr, j.dataset) || !strings.Contains(stderr, "changed") {
		t.Fatalf("run exit %d, want 2 naming %s as changed\n%s", code, j.dataset, stderr)
	}
	for i, s := range j.samples {
		path := filepath.Join(j.out, "rows_0-2000", "data_"+strconv.Itoa(i)+".safetensors")
		if _, err := os.Stat(path); err == nil {
			if err := j.checkFile(path, i, s); err != nil {
				t.Errorf("sample %d: %v", i, err)
			}
		}
	}
}

func TestAnEnvVariableTypoIsRefusedNamingTheKeyItMeant(t *testing.T) {
	j := newJob(t, 5, 0)
	j.withEnv([]string{"EXTRACT_RUN_MAX_INFLGHT=4"}, func() {
		r := j.run("run")
		if r.code != 2 || !strings.Contains(r.stderr, "EXTRACT_RUN_MAX_INFLGHT") || !strings.Contains(r.stderr, "EXTRACT_RUN_MAX_INFLIGHT") {
			t.Fatalf("exit %d, want 2 naming the typo and the key\n%s", r.code, r.stderr)
		}
	})
}

// Issue 8 review: the staging dir deleted under a run (a cleanup of /dev/shm) leaves the
// watch on a dead inode. The run must stop (exit 75) rather than time out every sample,
// and the next run finishes exact.
func TestDeletingTheStagingDirMidRunEndsTheRunForCronToResume(t *testing.T) {
	j := newJob(t, 200, 3000)
	_, wait := j.start("run")
	j.waitStatus("progress", func(st map[string]any) bool { return num(st["done"]) > 5 })
	if err := os.RemoveAll(j.shmDir); err != nil {
		t.Fatal(err)
	}
	code, stderr := wait()
	if code != 75 || !strings.Contains(stderr, "staging dir") {
		t.Fatalf("run exit %d, want 75 naming the staging dir\n%s", code, stderr)
	}
	if strings.Contains(stderr, "sample failed") {
		t.Errorf("samples were failed for dumps the run could not see:\n%s", stderr)
	}
	if r := j.run("run", "--resume"); r.code != 0 {
		t.Fatalf("resume exit %d\n%s", r.code, r.stderr)
	}
	j.requireExact()
}

// Issue 8 review: a file another user planted under extract's held-for-quarantine name
// is neither copied nor deleted.
func TestAnotherUsersFileUnderTheQuarantineNameIsLeftAlone(t *testing.T) {
	testsupport.Require(t, testsupport.Root) // to plant a file owned by another user
	j := newJob(t, 20, 0)
	planted := filepath.Join(j.shmDir, ".quarantine-s000000001-a1.safetensors")
	if err := os.WriteFile(planted, []byte("victim-data"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(planted, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	if r := j.run("run"); r.code != 0 {
		t.Fatalf("run exit %d\n%s", r.code, r.stderr)
	}
	if b, err := os.ReadFile(planted); err != nil || string(b) != "victim-data" {
		t.Errorf("planted file: %q, %v; want it untouched", b, err)
	}
	if kept, _ := filepath.Glob(filepath.Join(j.state, "quarantine", "*")); len(kept) > 0 {
		t.Errorf("quarantine holds %v; the planted file is not ours", kept)
	}
	os.Remove(planted)
	j.requireExact()
}
