package orchestrator

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Lock is the run lock in state_dir: one job writer at a time. The kernel drops the flock
// when the process dies, however it dies, so a crashed run never blocks the next one.
type Lock struct {
	f *os.File
}

// HeldError says which process holds the lock.
type HeldError struct {
	PID  int
	Path string
}

func (e *HeldError) Error() string {
	if e.PID > 0 {
		return fmt.Sprintf("another extract run (pid %d) holds %s", e.PID, e.Path)
	}
	return fmt.Sprintf("another extract run holds %s", e.Path)
}

func lockPath(stateDir string) string { return filepath.Join(stateDir, "lock") }

// AcquireLock takes the run lock without waiting and records our pid in it.
func AcquireLock(stateDir string) (*Lock, error) {
	path := lockPath(stateDir)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open lock %s: %w", path, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, &HeldError{PID: readLockPID(path), Path: path}
		}
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	if err := f.Truncate(0); err == nil {
		f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return &Lock{f: f}, nil
}

// Release drops the lock.
func (l *Lock) Release() error { return l.f.Close() }

// LockHolder reports the pid holding the run lock, or 0 when no run holds it. It takes a
// shared lock for an instant to ask, so it never blocks.
func LockHolder(stateDir string) (int, bool) {
	path := lockPath(stateDir)
	f, err := os.Open(path)
	if err != nil {
		return 0, false
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_SH|unix.LOCK_NB); err != nil {
		return readLockPID(path), true
	}
	unix.Flock(int(f.Fd()), unix.LOCK_UN)
	return 0, false
}

func readLockPID(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return pid
}

// runInfo is state_dir/run.json: how `extract status` and `extract stop` reach the live run.
type runInfo struct {
	PID        int       `json:"pid"`
	StatusAddr string    `json:"status_addr"`
	StartedAt  time.Time `json:"started_at"`
}

func runInfoPath(stateDir string) string { return filepath.Join(stateDir, "run.json") }

func readRunInfo(stateDir string) (runInfo, error) {
	var ri runInfo
	b, err := os.ReadFile(runInfoPath(stateDir))
	if err != nil {
		return ri, err
	}
	return ri, json.Unmarshal(b, &ri)
}
