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

	"github.com/extract-dev/extract/sglang"
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

// Holder is what the lock file says about the process that holds the lock: which command
// (a run, or verify, import or export, which take the lock to keep runs out), and what
// proves it is that process: a pid means something only on its host, within its boot and
// in its pid namespace, and only until it exits (its start time tells a later process
// with the same pid).
type Holder struct {
	PID     int    `json:"pid"`
	Command string `json:"command"` // run | verify | import | export; "" in an old pid-only lock
	Host    string `json:"host,omitempty"`
	BootID  string `json:"boot_id,omitempty"`
	// PIDNamespace is the inode of the holder's /proc/self/ns/pid.
	PIDNamespace uint64 `json:"pid_namespace,omitempty"`
	// StartTime is /proc/<pid>/stat field 22 in the holder's namespace.
	StartTime uint64 `json:"start_time,omitempty"`
}

// IsRun says whether the holder is a run (an old lock file names no command, and only
// runs wrote one).
func (h Holder) IsRun() bool { return h.Command == "" || h.Command == "run" }

func (h Holder) String() string {
	cmd := h.Command
	if cmd == "" {
		cmd = "run"
	}
	if h.PID <= 0 {
		return "extract " + cmd + " (pid unknown)"
	}
	return fmt.Sprintf("extract %s (pid %d)", cmd, h.PID)
}

// HeldError says which process holds the lock.
type HeldError struct {
	Holder Holder
	Path   string
}

func (e *HeldError) Error() string {
	return fmt.Sprintf("%s holds %s", e.Holder, e.Path)
}

func lockPath(stateDir string) string { return filepath.Join(stateDir, "lock") }

// wholeFile is an OFD write lock over the whole file.
func wholeFile(typ int16) *unix.Flock_t {
	return &unix.Flock_t{Type: typ, Whence: io.SeekStart, Start: 0, Len: 0}
}

// AcquireLock takes the run lock without waiting and records in it who we are: command
// (run, verify, import, export), pid and what proves the pid is us (Holder).
func AcquireLock(stateDir, command string) (*Lock, error) {
	path := lockPath(stateDir)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open lock %s: %w", path, err)
	}
	if err := unix.FcntlFlock(f.Fd(), unix.F_OFD_SETLK, wholeFile(unix.F_WRLCK)); err != nil {
		_ = f.Close()
		if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EACCES) {
			return nil, &HeldError{Holder: readHolder(path), Path: path}
		}
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("stat lock %s: %w", path, err)
	}
	b, _ := json.Marshal(self(command))
	// The holder record is advisory: a lock without one still locks, and stop refuses to
	// signal a holder it cannot read.
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt(append(b, '\n'), 0)
	}
	return &Lock{f: f, path: path, ino: st.Ino}, nil
}

// self is this process as a Holder of command; what cannot be read stays empty, and a
// stop then refuses to signal rather than guess.
func self(command string) Holder {
	h := Holder{PID: os.Getpid(), Command: command}
	h.Host, _ = os.Hostname()
	h.BootID, _ = sglang.BootID()
	h.PIDNamespace = pidNamespace()
	h.StartTime, _ = sglang.ProcessStartTime(h.PID)
	return h
}

// pidNamespace is the inode of our pid namespace, 0 when /proc does not say.
func pidNamespace() uint64 {
	var st unix.Stat_t
	if err := unix.Stat("/proc/self/ns/pid", &st); err != nil {
		return 0
	}
	return st.Ino
}

// Release drops the lock by closing its file. The kernel drops an OFD lock when its last
// descriptor closes, whatever close reports, and the holder record is advisory: a
// caller has nothing to act on.
func (l *Lock) Release() { _ = l.f.Close() }

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

// LockHolder reports who holds the run lock, and whether anyone does. It asks the kernel
// (F_OFD_GETLK) without taking the lock, so it never disturbs a run that is starting.
func LockHolder(stateDir string) (Holder, bool) {
	path := lockPath(stateDir)
	f, err := os.Open(path)
	if err != nil {
		return Holder{}, false
	}
	defer func() { _ = f.Close() }()
	lk := wholeFile(unix.F_WRLCK)
	if err := unix.FcntlFlock(f.Fd(), unix.F_OFD_GETLK, lk); err != nil || lk.Type == unix.F_UNLCK {
		return Holder{}, false
	}
	return readHolder(path), true
}

// readHolder reads the lock file: JSON (Holder), or a bare pid as older releases wrote.
// The holder writes it just after taking the lock, so an empty or half-written file is
// read again for a moment before its holder is called unknown.
func readHolder(path string) Holder {
	for try := 0; ; try++ {
		b, err := os.ReadFile(path)
		if err != nil {
			return Holder{}
		}
		var h Holder
		if json.Unmarshal(b, &h) == nil && h.PID > 0 {
			return h
		}
		if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && pid > 0 {
			return Holder{PID: pid}
		}
		if try == 10 {
			return Holder{}
		}
		time.Sleep(10 * time.Millisecond)
	}
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
