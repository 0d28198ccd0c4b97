package sglang

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"time"
)

// reapOrphans stops the workers of a server whose leader died: a dead TP worker takes
// the leader down, and survivors would keep their GPU memory from the next launch.
func (m *Manager) reapOrphans(ctx context.Context, rec *record) {
	var orphans []int
	for _, pid := range groupMembers(rec.PGID) {
		if rec.ServerID != "" && hasEnv(pid, serverIDEnv+"="+rec.ServerID) {
			orphans = append(orphans, pid)
		}
	}
	if len(orphans) == 0 {
		return
	}
	m.log().Warn("recorded server is gone but its workers remain; stopping them", "pgid", rec.PGID, "pids", orphans)
	if err := m.stopGroup(ctx, rec.PGID, replaceGrace); err != nil {
		m.log().Error("orphaned workers survive", "pgid", rec.PGID, "error", err)
	}
}

// Stop ends the recorded server if it is ours: SIGTERM to its whole process group, then
// SIGKILL after grace (or as soon as ctx ends). The record is removed once the group is gone.
func (m *Manager) Stop(ctx context.Context, grace time.Duration) error {
	m.op.Lock()
	defer m.op.Unlock()
	rec, err := m.readRecord()
	if err != nil {
		return err
	}
	if rec == nil {
		// server.json is gone (say its state dir was deleted under the run): the server
		// this process launched or adopted is still ours to stop, or it would hold the
		// GPUs with nobody left to stop it.
		if rec = m.currentRecord(); rec == nil {
			return nil
		}
	}
	if rec.Launching {
		m.stopLaunching(ctx, rec)
		return m.removeRecord()
	}
	switch m.identify(rec) {
	case procOurs:
		if err := m.stopGroup(ctx, rec.PGID, grace); err != nil {
			return err
		}
	case procForeign:
		m.log().Warn("recorded pid now belongs to another process; not signalling it", "pid", rec.PID)
	case procGone:
		m.reapOrphans(ctx, rec)
	}
	return m.removeRecord()
}

// stopGroup sends SIGTERM to group pgid, waits up to grace for it to empty, then SIGKILLs it.
func (m *Manager) stopGroup(ctx context.Context, pgid int, grace time.Duration) error {
	log := m.log().With("pgid", pgid)
	log.Info("stopping server process group", "grace", grace)
	if err := syscall.Kill(-pgid, syscall.SIGTERM); errors.Is(err, syscall.ESRCH) {
		return nil
	}
	if waitGroupGone(ctx, pgid, grace) {
		log.Info("server process group stopped")
		return nil
	}
	log.Warn("server process group outlived its grace; killing it", "pids", groupMembers(pgid))
	m.killGroup(pgid)
	if waitGroupGone(context.Background(), pgid, killWait) {
		return nil
	}
	return fmt.Errorf("server process group %d still has pids %v %v after SIGKILL (stuck in the kernel?)", pgid, groupMembers(pgid), killWait)
}

func (m *Manager) killGroup(pgid int) {
	if err := syscall.Kill(-pgid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		m.log().Error("kill server process group", "pgid", pgid, "error", err)
	}
}

// waitGroupGone polls until group pgid has no live member; false if d or ctx ends first.
func waitGroupGone(ctx context.Context, pgid int, d time.Duration) bool {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		if len(groupMembers(pgid)) == 0 {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
		}
	}
}

// stopLaunching stops the process groups of a server whose launch was interrupted before
// its pid was recorded, found by the server id in their environment.
func (m *Manager) stopLaunching(ctx context.Context, rec *record) {
	groups := map[int]bool{}
	for _, pid := range listPIDs() {
		if hasEnv(pid, serverIDEnv+"="+rec.ServerID) {
			if st, err := readStat(pid); err == nil && !st.dead() {
				groups[st.pgid] = true
			}
		}
	}
	for pgid := range groups {
		m.log().Warn("stopping a server whose launch was interrupted before it was recorded", "pgid", pgid, "server_id", rec.ServerID)
		if err := m.stopGroup(ctx, pgid, 5*time.Second); err != nil {
			m.log().Error("interrupted launch survives", "pgid", pgid, "error", err)
		}
	}
}
