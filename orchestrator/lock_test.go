package orchestrator

import (
	"errors"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"
)

// A child process holds the lock, as a second `extract run` would see it.
func TestLockHeldByAnotherProcessNamesItsPID(t *testing.T) {
	if os.Getenv("LOCK_CHILD_DIR") != "" {
		if _, err := AcquireLock(os.Getenv("LOCK_CHILD_DIR"), "verify"); err != nil {
			os.Exit(1)
		}
		os.Stdout.WriteString("locked\n")
		time.Sleep(time.Minute)
		return
	}
	dir := t.TempDir()
	child := exec.Command(os.Args[0], "-test.run=^TestLockHeldByAnotherProcessNamesItsPID$")
	child.Env = append(os.Environ(), "LOCK_CHILD_DIR="+dir)
	out, _ := child.StdoutPipe()
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 7)
	if _, err := out.Read(buf); err != nil || string(buf[:6]) != "locked" {
		t.Fatalf("child did not lock: %q %v", buf, err)
	}

	_, err := AcquireLock(dir, "run")
	var held *HeldError
	if !errors.As(err, &held) || held.Holder.PID != child.Process.Pid || held.Holder.Command != "verify" {
		t.Fatalf("AcquireLock = %v, want HeldError naming verify, pid %d", err, child.Process.Pid)
	}
	if h, ok := LockHolder(dir); !ok || h.PID != child.Process.Pid || h.IsRun() || h.String() != "extract verify (pid "+strconv.Itoa(child.Process.Pid)+")" {
		t.Errorf("LockHolder = %+v, %v; want the verify child", h, ok)
	}

	// SIGKILL releases the flock: the next run must not be blocked by a crashed one.
	child.Process.Kill()
	child.Wait()
	if _, ok := LockHolder(dir); ok {
		t.Fatal("lock still held after its holder was killed")
	}
	l, err := AcquireLock(dir, "run")
	if err != nil {
		t.Fatalf("AcquireLock after the holder died: %v", err)
	}
	defer l.Release()
	if got := readHolder(lockPath(dir)); got.PID != os.Getpid() || got.Command != "run" || got.StartTime == 0 || got.PIDNamespace == 0 || got.BootID == "" {
		t.Errorf("lock file says %+v, want ours (pid %d, run) with what proves it", got, os.Getpid())
	}
}

// A `status --watch` or `stop` probing the lock must never make a starting run fail
// (with flock's LOCK_SH probe, 607 of 2000 acquisitions failed).
func TestProbingTheLockNeverMakesAcquiringItFail(t *testing.T) {
	dir := t.TempDir()
	stop := make(chan struct{})
	probes := make(chan int)
	go func() {
		n := 0
		for {
			select {
			case <-stop:
				probes <- n
				return
			default:
				LockHolder(dir)
				n++
			}
		}
	}()
	failed := 0
	for range 2000 {
		l, err := AcquireLock(dir, "run")
		if err != nil {
			failed++
			continue
		}
		l.Release()
	}
	close(stop)
	n := <-probes
	if n < 100 {
		t.Fatalf("only %d probes ran alongside; the test proves nothing", n)
	}
	if failed > 0 {
		t.Errorf("%d of 2000 acquisitions failed while %d probes ran", failed, n)
	}
}

func TestLockNoticesItsFileRemovedOrReplaced(t *testing.T) {
	dir := t.TempDir()
	l, err := AcquireLock(dir, "run")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release()
	if why := l.Lost(); why != "" {
		t.Fatalf("Lost() = %q on a fresh lock", why)
	}
	os.Remove(lockPath(dir))
	if l.Lost() == "" {
		t.Error("Lost() = \"\" after the lock file was removed")
	}
	os.WriteFile(lockPath(dir), nil, 0o644)
	if l.Lost() == "" {
		t.Error("Lost() = \"\" after the lock file was replaced")
	}
}
