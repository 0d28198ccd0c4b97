package orchestrator

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Lock is the run lock in state_dir: one job writer at a time. It is an open file
// description (OFD) lock: the kernel drops it when the process dies, however it dies, so a
// crashed run never blocks the next one; and unlike flock it can be probed (F_OFD_GETLK)
// without being taken, so `status` and `stop` never make a starting run fail.
type Lock struct {
	f    *os.File
	path string
	ino  uint64
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

// wholeFile is an OFD write lock over the whole file.
func wholeFile(typ int16) *unix.Flock_t {
	return &unix.Flock_t{Type: typ, Whence: io.SeekStart, Start: 0, Len: 0}
}

// AcquireLock takes the run lock without waiting and records our pid in it.
func AcquireLock(stateDir string) (*Lock, error) {
	path := lockPath(stateDir)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open lock %s: %w", path, err)
	}
	if err := unix.FcntlFlock(f.Fd(), unix.F_OFD_SETLK, wholeFile(unix.F_WRLCK)); err != nil {
		f.Close()
		if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EACCES) {
			return nil, &HeldError{PID: readLockPID(path), Path: path}
		}
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		f.Close()
		return nil, fmt.Errorf("stat lock %s: %w", path, err)
	}
	if err := f.Truncate(0); err == nil {
		f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return &Lock{f: f, path: path, ino: st.Ino}, nil
}

// Release drops the lock.
func (l *Lock) Release() error { return l.f.Close() }

// Lost reports why the lock no longer guards this run, or "" while it does: its file was
// removed or replaced (the state dir deleted under the run), so another run could take a
// new lock and the index we hold is no longer the one on disk.
func (l *Lock) Lost() string {
	var st unix.Stat_t
	if err := unix.Stat(l.path, &st); err != nil {
		return fmt.Sprintf("lock file %s is gone (%v): was the state dir deleted?", l.path, err)
	}
	if st.Ino != l.ino {
		return fmt.Sprintf("lock file %s was replaced by another file", l.path)
	}
	return ""
}

// LockHolder reports the pid holding the run lock, and whether a run holds it. It asks
// the kernel (F_OFD_GETLK) without taking the lock, so it never disturbs a run that is
// starting.
func LockHolder(stateDir string) (int, bool) {
	path := lockPath(stateDir)
	f, err := os.Open(path)
	if err != nil {
		return 0, false
	}
	defer f.Close()
	lk := wholeFile(unix.F_WRLCK)
	if err := unix.FcntlFlock(f.Fd(), unix.F_OFD_GETLK, lk); err != nil || lk.Type == unix.F_UNLCK {
		return 0, false
	}
	return readLockPID(path), true
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
	PID int `json:"pid"`
	// Host is where the run is: its status address is only reachable from there (a
	// shard on another node is read from its snapshot instead).
	Host       string    `json:"host,omitempty"`
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
