package orchestrator

import (
	"context"
	"fmt"
	"syscall"
	"time"

	"github.com/extract-dev/extract/configs"
)

// StopRun asks the running job to stop gracefully (SIGTERM: no new samples, drain the
// in-flight ones, commit, stop the server) and waits until it has let go of the lock.
// It returns the pid it stopped, or 0 when no run was going.
func StopRun(ctx context.Context, cfg *configs.Config) (int, error) {
	pid, held := LockHolder(cfg.StateDir)
	if !held {
		return 0, nil
	}
	if pid <= 0 {
		return 0, fmt.Errorf("a run holds %s but its pid is unreadable", lockPath(cfg.StateDir))
	}
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		return pid, fmt.Errorf("signal run pid %d: %w", pid, err)
	}
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	for {
		if _, held := LockHolder(cfg.StateDir); !held {
			return pid, nil
		}
		select {
		case <-ctx.Done():
			return pid, fmt.Errorf("run pid %d is still draining: %w", pid, ctx.Err())
		case <-t.C:
		}
	}
}
