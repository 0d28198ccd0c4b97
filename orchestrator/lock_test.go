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
		if _, err := AcquireLock(os.Getenv("LOCK_CHILD_DIR")); err != nil {
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

	_, err := AcquireLock(dir)
	var held *HeldError
	if !errors.As(err, &held) || held.PID != child.Process.Pid {
		t.Fatalf("AcquireLock = %v, want HeldError naming pid %d", err, child.Process.Pid)
	}
	if pid, ok := LockHolder(dir); !ok || pid != child.Process.Pid {
		t.Errorf("LockHolder = %d, %v", pid, ok)
	}

	// SIGKILL releases the flock: the next run must not be blocked by a crashed one.
	child.Process.Kill()
	child.Wait()
	if _, ok := LockHolder(dir); ok {
		t.Fatal("lock still held after its holder was killed")
	}
	l, err := AcquireLock(dir)
	if err != nil {
		t.Fatalf("AcquireLock after the holder died: %v", err)
	}
	defer l.Release()
	if got := readLockPID(lockPath(dir)); got != os.Getpid() {
		t.Errorf("lock file says pid %d, want ours %s", got, strconv.Itoa(os.Getpid()))
	}
}
