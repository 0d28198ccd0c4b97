package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/extract-dev/extract/internal/testsupport"
	"github.com/extract-dev/extract/shm"
)

// smallDisk mounts a real tmpfs of size as the job's output disk (root only) and keeps
// the index beside it, as an operator might put state on another volume.
func smallDisk(t *testing.T, j *job, size string) string {
	t.Helper()
	mnt := filepath.Join(t.TempDir(), "disk")
	os.MkdirAll(mnt, 0o755)
	testsupport.Require(t, testsupport.Root)
	if err := syscall.Mount("tmpfs", mnt, "tmpfs", 0, "size="+size); err != nil {
		testsupport.Unavailable(t, testsupport.Root, "mount a tmpfs: %v", err)
	}
	t.Cleanup(func() { syscall.Unmount(mnt, syscall.MNT_DETACH) })
	j.out = filepath.Join(mnt, "out")
	j.state = filepath.Join(t.TempDir(), "state")
	j.hidden = 256 // about 2 KiB a token, so the job needs ~30 MiB
	j.env = append(j.env, "EXTRACT_OUTPUT_DIR="+j.out, "EXTRACT_STATE_DIR="+j.state,
		"EXTRACT_SERVER_SIMULATOR_HIDDEN_SIZE="+strconv.Itoa(j.hidden))
	return mnt
}

func remount(t *testing.T, mnt, size string) {
	t.Helper()
	if out, err := exec.Command("mount", "-o", "remount,size="+size, mnt).CombinedOutput(); err != nil {
		t.Fatalf("remount %s size=%s: %v %s", mnt, size, err, out)
	}
}

func paused(st map[string]any, prefix string) bool {
	list, _ := st["paused"].([]any)
	for _, p := range list {
		if s, _ := p.(string); strings.HasPrefix(s, prefix) {
			return true
		}
	}
	return false
}

func TestDiskReservePausesAdmissionUntilTheDiskGrows(t *testing.T) {
	j := newJob(t, 100, 20000)
	mnt := smallDisk(t, j, "12m")
	j.env = append(j.env, "EXTRACT_DISK_RESERVE=4MiB", "EXTRACT_DISK_WHEN_SHORT=warn")
	_, wait := j.start("run")
	st := j.waitStatus("admission paused by the disk reserve", func(st map[string]any) bool {
		return paused(st, "output disk reserve") && num(st["inflight"]) == 0
	})
	if fs, _ := shm.StatFS(mnt); fs.Free < 4<<20 {
		t.Fatalf("the reserve was eaten: %d bytes free", fs.Free)
	}
	t.Logf("paused at %v of %v samples: %v", st["done"], st["total"], st["paused"])
	remount(t, mnt, "64m")
	if code, stderr := wait(); code != 0 {
		t.Fatalf("run exit %d after the disk grew\n%s", code, stderr)
	}
	j.requireExact()
}

func TestDiskFilledBehindOurBackLosesNothingAndResumesByItself(t *testing.T) {
	// Slow enough that the job is still running once the filler has taken the disk, even
	// under -race; small enough (about 25k tokens of 2 KiB) to fit the 64 MiB disk.
	j := newJob(t, 150, 3000)
	mnt := smallDisk(t, j, "64m")
	j.env = append(j.env, "EXTRACT_DISK_RESERVE=1MiB")
	_, wait := j.start("run")
	j.waitStatus("progress", func(st map[string]any) bool { return num(st["done"]) > 10 })

	// Another process takes every free byte: writes now fail with ENOSPC.
	filler := filepath.Join(mnt, "filler")
	f, err := os.Create(filler)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 1<<20)
	for {
		if _, err := f.Write(buf); err != nil {
			break
		}
	}
	for {
		if _, err := f.Write(buf[:4096]); err != nil {
			break
		}
	}
	f.Close()
	st := j.waitStatus("admission paused by failed stores", func(st map[string]any) bool { return paused(st, "cannot store dumps") })
	t.Logf("paused at %v of %v samples: %v", st["done"], st["total"], st["paused"])
	os.Remove(filler)
	if code, stderr := wait(); code != 0 {
		t.Fatalf("run exit %d after room returned\n%s", code, stderr)
	}
	j.requireExact()
}

func TestStagingNeverPassesItsBudget(t *testing.T) {
	j := newJob(t, 100, 0)
	const budget = 400 << 10
	j.env = append(j.env, "EXTRACT_SHM_BUDGET="+strconv.Itoa(budget))
	_, wait := j.start("run")
	done := make(chan int)
	go func() {
		code, _ := wait()
		done <- code
	}()
	var peak int64
	for {
		select {
		case code := <-done:
			if code != 0 {
				t.Fatalf("run exit %d", code)
			}
			t.Logf("staging peak %d bytes, budget %d", peak, budget)
			if peak > budget {
				t.Fatalf("staging reached %d bytes, budget %d", peak, budget)
			}
			if peak == 0 {
				t.Fatal("never saw a dump in staging: the test measured nothing")
			}
			j.requireExact()
			return
		default:
		}
		if u, err := shm.Measure(j.shmDir); err == nil && u.Bytes > peak {
			peak = u.Bytes
		}
	}
}

func TestStartIsRefusedWhenTheRestOfTheJobDoesNotFit(t *testing.T) {
	j := newJob(t, 100, 0)
	smallDisk(t, j, "12m")
	j.env = append(j.env, "EXTRACT_DISK_WHEN_SHORT=refuse")
	r := j.run("run")
	if r.code != 3 || !strings.Contains(r.stderr, "disk.when_short") {
		t.Fatalf("exit %d, stderr %q; want 3 saying how much to free or how to start anyway", r.code, r.stderr)
	}
}
