package main

import (
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/extract-dev/extract/internal/testsupport"
)

// blockWithDir puts a non-empty directory at path: nothing extract does may remove it.
func blockWithDir(t *testing.T, path string) {
	t.Helper()
	if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(path, "keep"), 0o755); err != nil {
		t.Fatal(err)
	}
}

// A directory at a sample's output path is that sample's failure: the run stores every
// other sample, fails this one naming the path, and exits 1 (not a store error retried
// for minutes and then exit 75, which cron would repeat forever).
func TestADirectoryAtAnOutputPathFailsThatSampleAndTheRunFinishesTheRest(t *testing.T) {
	j := newJob(t, 8, 0)
	blocked := filepath.Join(j.out, "rows_0-2000", "data_3.safetensors")
	blockWithDir(t, blocked)
	start := time.Now()
	r := j.run("run", "--resume")
	took := time.Since(start)
	if r.code != 1 || !strings.Contains(r.stderr, "1 samples failed") {
		t.Fatalf("run with a directory at sample 3's path: exit %d, want 1 with 1 failed\n%s", r.code, r.stderr)
	}
	if !strings.Contains(r.stderr, blocked) {
		t.Errorf("the log does not name the blocked path %s:\n%s", blocked, r.stderr)
	}
	if took > 60*time.Second {
		t.Errorf("the run took %s: the blocked sample was retried as a store error", took)
	}
	if st := j.status(); num(st["done"]) != 7 || num(st["failed"]) != 1 {
		t.Fatalf("status after the run: %v; want 7 done, 1 failed", st)
	}
	for i := range 8 {
		if i == 3 {
			continue
		}
		if _, err := os.Stat(filepath.Join(j.out, "rows_0-2000", "data_"+strconv.Itoa(i)+".safetensors")); err != nil {
			t.Errorf("sample %d: %v", i, err)
		}
	}
	if st, err := os.Stat(blocked); err != nil || !st.IsDir() {
		t.Fatalf("the directory at sample 3's path was touched: %v", err)
	}
	// Once the operator clears it, a resume finishes the job.
	if err := os.RemoveAll(blocked); err != nil {
		t.Fatal(err)
	}
	j.mustRun("run", "--resume")
	j.requireExact()
}

// verify --repair repairs every sample it can past an entry it cannot remove, says
// which ones it could not, and exits 1.
func TestVerifyRepairRepairsPastAnEntryItCannotRemoveAndExitsOne(t *testing.T) {
	j := newJob(t, 10, 0)
	j.mustRun("run")
	blockWithDir(t, filepath.Join(j.out, "rows_0-2000", "data_1.safetensors"))
	if err := os.Truncate(filepath.Join(j.out, "rows_0-2000", "data_6.safetensors"), 64); err != nil {
		t.Fatal(err)
	}
	r := j.run("verify", "--repair")
	if r.code != 1 {
		t.Fatalf("verify --repair: exit %d, want 1\n%s%s", r.code, r.stdout, r.stderr)
	}
	if !strings.Contains(r.stdout, "1 repaired, 1 could not be repaired") || !strings.Contains(r.stdout, "sample 1: data_1.safetensors") || !strings.Contains(r.stdout, "cannot be removed") {
		t.Fatalf("verify --repair output:\n%s", r.stdout)
	}
	if _, err := os.Stat(filepath.Join(j.out, "rows_0-2000", "data_6.safetensors")); !os.IsNotExist(err) {
		t.Fatalf("sample 6's corrupt file was not removed: %v", err)
	}
	if st := j.status(); num(st["done"]) != 8 {
		t.Fatalf("after repair: %v; want samples 1 and 6 back to pending", st)
	}
}

// The advice of a deep verify names the command that repairs what it found: a crc32c
// mismatch is invisible to a shallow --repair, which would say "0 repaired".
func TestDeepVerifyAdvisesADeepRepairAndThatRepairFindsIt(t *testing.T) {
	j := newJob(t, 6, 0)
	j.mustRun("run")
	path := filepath.Join(j.out, "rows_0-2000", "data_4.safetensors")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)-10] ^= 0x40 // the data, not the header: only --deep sees it
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	r := j.run("verify", "--deep")
	m := regexp.MustCompile("`(extract verify[^`]*--repair[^`]*)`").FindStringSubmatch(r.stderr)
	if r.code != 1 || m == nil {
		t.Fatalf("verify --deep: exit %d, want 1 with a repair command\n%s", r.code, r.stderr)
	}
	args := strings.Fields(strings.TrimPrefix(m[1], "extract "))
	r = j.mustRun(args...)
	if !strings.Contains(r.stdout, "1 repaired") {
		t.Fatalf("the advised `%s` did not repair sample 4:\n%s", m[1], r.stdout)
	}
	j.mustRun("run", "--resume")
	j.requireExact()
}

// With index.db lost and the job's files on disk, doctor and run see the files and point
// at `verify --repair` (run refuses, exit 3) instead of starting a new job that
// recomputes every sample; the advised repair then makes the job complete.
func TestALostIndexWithItsFilesOnDiskIsRepairedNotRecomputed(t *testing.T) {
	j := newJob(t, 12, 0)
	j.mustRun("run")
	if err := os.Remove(j.index()); err != nil {
		t.Fatal(err)
	}
	sent := len(j.requests())
	r := j.run("doctor")
	if r.code == 0 || !strings.Contains(r.stdout+r.stderr, "12 output files") || !strings.Contains(r.stdout+r.stderr, "verify --repair") {
		t.Fatalf("doctor with the index lost: exit %d, want a failure naming the 12 files and verify --repair\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = j.run("run", "--resume")
	if r.code != 3 || !strings.Contains(r.stderr, "12 output files") || !strings.Contains(r.stderr, "`extract verify --repair`") {
		t.Fatalf("run --resume with the index lost: exit %d, want 3 pointing at verify --repair\n%s", r.code, r.stderr)
	}
	if n := len(j.requests()); n != sent {
		t.Fatalf("the refused run sent %d requests", n-sent)
	}
	r = j.mustRun("verify", "--repair")
	if !strings.Contains(r.stdout, "12 adopted, 0 refused") {
		t.Fatalf("verify --repair: %s", r.stdout)
	}
	r = j.mustRun("run", "--resume")
	if n := len(j.requests()); n != sent {
		t.Fatalf("the run after the rebuild sent %d requests; want none (complete)", n-sent)
	}
	j.requireExact()
}

// A damaged index is a preflight refusal (exit 3) with the repair's hint, not exit 1,
// which a supervisor's Restart=on-failure would loop on.
func TestADamagedIndexRefusesTheRunWithExitThreeAndTheRepairHint(t *testing.T) {
	j := newJob(t, 6, 0)
	j.mustRun("run")
	if err := os.WriteFile(j.index(), make([]byte, 8192), 0o600); err != nil {
		t.Fatal(err)
	}
	r := j.run("run", "--resume")
	if r.code != 3 || !strings.Contains(r.stderr, "verify --repair") || crashed(r) {
		t.Fatalf("run --resume over a damaged index: exit %d, want 3 with the verify --repair hint\n%s", r.code, r.stderr)
	}
}

// A rebuild that runs out of room on the state disk says so and counts nothing as
// repaired: no index was put in place.
func TestARebuildThatFillsTheStateDiskRepairsNothing(t *testing.T) {
	j := newJob(t, 600, 0)
	mnt := filepath.Join(t.TempDir(), "state")
	if err := os.MkdirAll(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", mnt, "tmpfs", 0, "size=16m"); err != nil {
		testsupport.Unavailable(t, testsupport.Root, "cannot mount a tmpfs here: %v", err)
	}
	t.Cleanup(func() { syscall.Unmount(mnt, syscall.MNT_DETACH) })
	j.state = mnt
	j.env = append(j.env, "EXTRACT_STATE_DIR="+mnt)
	j.mustRun("run")
	if err := os.Remove(j.index()); err != nil {
		t.Fatal(err)
	}
	fillDisk(t, mnt, 48<<10)
	r := j.run("verify", "--repair")
	if r.code == 0 || !strings.Contains(r.stdout, "the rebuild from 600 files failed and no index was put in place") {
		t.Fatalf("verify --repair on a full state disk: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if regexp.MustCompile(`[1-9][0-9]* repaired`).MatchString(r.stdout) {
		t.Fatalf("a failed rebuild counts samples as repaired:\n%s", r.stdout)
	}
	if !strings.Contains(r.stderr, "no space left") {
		t.Fatalf("the error does not say the disk is full:\n%s", r.stderr)
	}
}

// fillDisk writes dir/filler until only about left bytes are free (or the disk is
// full: others may be writing to it at the same time).
func fillDisk(t *testing.T, dir string, left int64) {
	t.Helper()
	f, err := os.Create(filepath.Join(dir, "filler"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 64<<10)
	for {
		var st syscall.Statfs_t
		if err := syscall.Statfs(dir, &st); err != nil {
			t.Fatal(err)
		}
		free := int64(st.Bavail) * st.Bsize
		if free <= left {
			return
		}
		if _, err := f.Write(buf[:min(int64(len(buf)), free-left)]); err != nil {
			if errors.Is(err, syscall.ENOSPC) {
				return
			}
			t.Fatal(err)
		}
	}
}

// A regular file where a replica's staging dir belongs is the node's state, a preflight
// refusal (exit 3), not exit 1.
func TestAReplicaStagingDirThatIsAFileRefusesTheRunWithExitThree(t *testing.T) {
	j := newJob(t, 4, 0)
	j.withReplicas(2)
	if err := os.MkdirAll(j.shmDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(j.shmDir, "r1"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	r := j.run("run")
	if r.code != 3 || !strings.Contains(r.stderr, filepath.Join(j.shmDir, "r1")) {
		t.Fatalf("run with a file at replica 1's staging dir: exit %d, want 3 naming it\n%s", r.code, r.stderr)
	}
}

// The end of a run sums up the dumps it rejected and where the malformed ones are kept,
// and `status --json` afterwards says the same counts as the run's last snapshot.
func TestARunEndsWithItsRejectedDumpsAndStatusKeepsTheirCounts(t *testing.T) {
	j := newJob(t, 30, 0)
	j.env = append(j.env, "EXTRACT_SERVER_SIMULATOR_CORRUPT_EVERY=7")
	r := j.mustRun("run")
	m := regexp.MustCompile(`(\d+) dumps rejected this run \(malformed (\d+)\); the malformed ones are kept in (\S+) for inspection`).FindStringSubmatch(r.stdout)
	if m == nil {
		t.Fatalf("the run's summary does not mention the rejected dumps:\n%s", r.stdout)
	}
	if m[3] != filepath.Join(j.state, "quarantine") {
		t.Errorf("the summary names %s as the quarantine", m[3])
	}
	malformed, _ := strconv.Atoi(m[2])
	if malformed < 4 {
		t.Errorf("%d malformed dumps for every 7th of 30+", malformed)
	}
	st := j.status()
	rej, _ := st["rejected"].(map[string]any)
	if num(rej["malformed"]) != malformed {
		t.Fatalf("status after the run: rejected %v, want malformed %d as the run counted", st["rejected"], malformed)
	}
	j.requireExact()
}

// A staging filesystem that others fill below the staging budget pauses admission with
// the reason "staging full" (status, not an empty pause list while nothing moves), and
// the run resumes by itself once room returns.
func TestAStagingDiskFilledByOthersShowsAsStagingFullAndTheRunResumes(t *testing.T) {
	j := newJob(t, 150, 3000)
	mnt := filepath.Join(t.TempDir(), "shm")
	if err := os.MkdirAll(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", mnt, "tmpfs", 0, "size=32m"); err != nil {
		testsupport.Unavailable(t, testsupport.Root, "cannot mount a tmpfs here: %v", err)
	}
	t.Cleanup(func() { syscall.Unmount(mnt, syscall.MNT_DETACH) })
	j.shmDir = filepath.Join(mnt, "staging")
	j.env = append(j.env, "EXTRACT_SHM_DIR="+j.shmDir, "EXTRACT_SHM_BUDGET=16MiB")
	_, wait := j.start("run")
	j.waitStatus("progress", func(st map[string]any) bool { return num(st["done"]) > 5 })
	filler := filepath.Join(mnt, "filler")
	fillDisk(t, mnt, 4<<10)
	st := j.waitStatus("admission paused by a full staging disk", func(st map[string]any) bool { return paused(st, "staging full") })
	t.Logf("paused at %v of %v samples: %v", st["done"], st["total"], st["paused"])
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	if code, stderr := wait(); code != 0 {
		t.Fatalf("run exit %d after room returned\n%s", code, stderr)
	}
	j.requireExact()
}
