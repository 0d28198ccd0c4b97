package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/extract-dev/extract/configs"
	"github.com/extract-dev/extract/sglang"
	"golang.org/x/sys/unix"
)

// ErrNotHere means the run that holds the lock is not a process this one can prove to be
// it (another host, boot or pid namespace, or a pid reused since): it was not signalled,
// and the message says where it runs and how to stop it there.
var ErrNotHere = errors.New("the run is not here")

// StopRun asks the running job to stop gracefully (SIGTERM: no new samples, drain the
// in-flight ones, commit, stop the server) and waits until it has let go of the lock.
// It returns who holds the lock (PID 0: nobody) and whether it signalled it: only a run,
// and only one provably the holder (stopTarget).
func StopRun(ctx context.Context, cfg *configs.Config) (Holder, bool, error) {
	h, held := LockHolder(cfg.StateDir)
	if !held || !h.IsRun() {
		return h, false, nil // verify, import or export: not a run to stop
	}
	if why := stopTarget(h, self("")); why != "" {
		return h, false, fmt.Errorf("%w: %s: not signalled", ErrNotHere, why)
	}
	if err := signalRun(h); err != nil {
		return h, false, err
	}
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	for {
		if _, held := LockHolder(cfg.StateDir); !held {
			return h, true, nil
		}
		select {
		case <-ctx.Done():
			return h, true, fmt.Errorf("%w: run pid %d is still draining at the timeout; it stops by itself when its in-flight samples are done (`extract status` shows it)", ErrTemporary, h.PID)
		case <-t.C:
		}
	}
}

// stopTarget says why the lock's holder h is not a process that we (me) may signal by
// its pid, or "" when it is: same host, same boot, same pid namespace. Its start time is
// checked against the live pid in signalRun, through a pidfd.
func stopTarget(h, me Holder) string {
	switch {
	case h.PID <= 0:
		return "the lock file names no pid"
	case h.Host == "" || h.BootID == "" || h.PIDNamespace == 0 || h.StartTime == 0:
		return fmt.Sprintf("the lock names pid %d but not its host, boot, pid namespace and start time (an older extract wrote it); check that pid %d is that run (ps -o lstart,args -p %d) and stop it with kill -TERM %d", h.PID, h.PID, h.PID, h.PID)
	case h.Host != me.Host:
		return fmt.Sprintf("the run (pid %d) runs on host %s, not here (%s); run `extract stop` on %s", h.PID, h.Host, me.Host, h.Host)
	case h.BootID != me.BootID:
		return fmt.Sprintf("the run (pid %d on %s) holds the lock from boot %s; this is boot %s of a host with the same name: run `extract stop` where it runs", h.PID, h.Host, h.BootID, me.BootID)
	case h.PIDNamespace != me.PIDNamespace:
		return fmt.Sprintf("the run (pid %d in its own pid namespace %d, a container or `unshare --pid`) is not in ours (%d), where pid %d is another process or none; run `extract stop` inside its namespace (e.g. docker exec, nsenter -t <pid on this host> -p -m), or signal it by the pid it has here (ps -eo pid,args | grep 'extract run')",
			h.PID, h.PIDNamespace, me.PIDNamespace, h.PID)
	}
	return ""
}

// signalRun sends SIGTERM to h through a pidfd: opened first, then the pid's start time
// checked, so the signal reaches the process whose start time matched even if the run
// has exited and its pid been reused meanwhile.
func signalRun(h Holder) error {
	fd, err := unix.PidfdOpen(h.PID, 0)
	if errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("%w: run pid %d has exited (its lock is held by another process now?): not signalled", ErrNotHere, h.PID)
	}
	if err != nil {
		return fmt.Errorf("pidfd_open of run pid %d: %w", h.PID, err)
	}
	defer unix.Close(fd)
	start, err := sglang.ProcessStartTime(h.PID)
	if err != nil {
		return fmt.Errorf("%w: run pid %d: %v: not signalled", ErrNotHere, h.PID, err)
	}
	if start != h.StartTime {
		return fmt.Errorf("%w: pid %d started at tick %d, the run that holds the lock at tick %d: it is another process, not signalled", ErrNotHere, h.PID, start, h.StartTime)
	}
	if err := unix.PidfdSendSignal(fd, unix.SIGTERM, nil, 0); err != nil {
		return fmt.Errorf("signal run pid %d: %w", h.PID, os.NewSyscallError("pidfd_send_signal", err))
	}
	return nil
}
