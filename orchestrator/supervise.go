package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/extract-dev/extract/sglang"
	"github.com/extract-dev/extract/shm"
)

// restartBudget allows max server restarts within window; more means the server cannot
// stay up, and the run gives up with exit 75 for cron to try later.
type restartBudget struct {
	max    int
	window time.Duration
	times  []time.Time
}

// spend records a restart at now and says how many fall in the window, and whether
// that is still within the budget.
func (b *restartBudget) spend(now time.Time) (int, bool) {
	recent := b.times[:0]
	for _, t := range b.times {
		if now.Sub(t) < b.window {
			recent = append(recent, t)
		}
	}
	b.times = append(recent, now)
	return len(b.times), len(b.times) <= b.max
}

// startServer launches or adopts the server, then checks it is set up for capture.
func (j *job) startServer(ctx context.Context, restart bool) error {
	srv, err := j.mgr.Ensure(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("%w: stopped while the server was starting", ErrTemporary)
		}
		if errors.Is(err, sglang.ErrPortTaken) {
			return fmt.Errorf("%w: %v", ErrPreflight, err)
		}
		if line, ok := sglang.HookRefusal(err.Error()); ok {
			// The hook refused this SGLang or its settings before loading weights: a
			// restart would only refuse again.
			return fmt.Errorf("%w: the server exited at start: %s (see %s)", ErrPreflight, line, j.mgr.LogPath())
		}
		return fmt.Errorf("%w: start server: %v", ErrTemporary, err)
	}
	j.server = ServerStatus{State: "ready", PID: srv.PID, Adopted: srv.Adopted, Restarts: j.server.Restarts, HookVersion: j.server.HookVersion}
	j.unhealthy = 0
	if !srv.Adopted {
		// A freshly launched server never finishes the partials of the one before.
		if _, err := shm.RemovePartials(j.cfg.ShmDir); err != nil {
			j.log.Warn("remove partial dumps", "err", err)
		}
	}
	stop := func() { j.stopServer(ctx) }
	hook, ok := sglang.ServerHook(j.cfg.ShmDir, srv.PGID)
	if !ok {
		stop()
		return fmt.Errorf("%w: server pid %d is up but its dump hook is not armed (no .hook-<pid>.json marker of its process group in %s); no dumps would come: see %s", ErrPreflight, srv.PID, j.cfg.ShmDir, j.mgr.LogPath())
	}
	if hook.Protocol != "1" {
		stop()
		return fmt.Errorf("%w: server pid %d runs dump hook %s speaking protocol %q; this extract reads protocol 1", ErrPreflight, srv.PID, hook.HookVersion, hook.Protocol)
	}
	j.server.HookVersion = hook.HookVersion
	info, err := j.client.ServerInfo(ctx)
	if err != nil {
		return fmt.Errorf("%w: server info: %v", ErrTemporary, err)
	}
	if err := info.CheckCapture(j.mgr.Spec); err != nil {
		stop()
		return fmt.Errorf("%w: server %s is not set up for capture: %v", ErrRefused, j.mgr.Spec.BaseURL(), err)
	}
	j.log.Info("server ready", "pid", srv.PID, "adopted", srv.Adopted, "url", j.mgr.Spec.BaseURL(), "restart", restart, "hook_version", hook.HookVersion, "layers", hook.Layers)
	return nil
}

// stopServer stops the server we launched or adopted. It must outlive the operator's
// signal that ends ctx, so it runs on ctx's values without its cancellation.
func (j *job) stopServer(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	if err := j.mgr.Stop(ctx, 30*time.Second); err != nil {
		j.log.Warn("stopping server", "err", err)
	}
	j.server.State = "stopped"
}

// probeHealth asks /health_generate every health_interval; the coordinator judges.
func (j *job) probeHealth(ctx context.Context) error {
	t := time.NewTicker(j.cfg.Server.HealthInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		pctx, cancel := context.WithTimeout(ctx, j.cfg.Server.HealthTimeout)
		err := j.client.HealthGenerate(pctx)
		cancel()
		if ctx.Err() != nil {
			return nil
		}
		select {
		case j.health <- err:
		default: // the coordinator is busy (restarting); the next probe will do
		}
	}
}

// onHealth counts failed probes in a row; health_failures of them is a hang: the whole
// process group is killed and the server restarted like after a death.
func (j *job) onHealth(ctx context.Context, err error) error {
	if err == nil || j.server.State != "ready" {
		j.unhealthy = 0
		return nil
	}
	j.unhealthy++
	j.log.Warn("server health probe failed", "pid", j.server.PID, "consecutive", j.unhealthy, "err", err)
	if j.unhealthy < j.cfg.Server.HealthFailures {
		return nil
	}
	j.unhealthy = 0
	j.log.Error("server hung: killing its process group", "pid", j.server.PID, "failed_probes", j.cfg.Server.HealthFailures)
	j.reject("server_hang")
	stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	if err := j.mgr.Stop(stopCtx, 5*time.Second); err != nil {
		return fmt.Errorf("%w: kill hung server: %v", ErrTemporary, err)
	}
	return j.onServerExit(ctx)
}

// onServerExit requeues what the dead server held and, unless the run is draining,
// starts a new one within the restart budget.
func (j *job) onServerExit(ctx context.Context) error {
	j.log.Error("server exited", "pid", j.server.PID)
	j.server.State = "stopped"
	now := time.Now()
	for s, f := range j.inflight {
		if !f.moving {
			delete(j.inflight, s)
			j.admission.retryAt(s, now)
		}
	}
	if j.draining {
		return nil
	}
	n, ok := j.restarts.spend(now)
	if !ok {
		return fmt.Errorf("%w: server died or hung %d times within %s (server.max_restarts %d); see %s", ErrTemporary, n, j.cfg.Server.RestartWindow, j.cfg.Server.MaxRestarts, j.mgr.LogPath())
	}
	j.server.Restarts++
	j.server.State = "restarting"
	j.metrics.restarts.Inc()
	j.publish()
	select {
	case <-ctx.Done():
		return nil
	case <-time.After(time.Second << (n - 1)):
	}
	return j.startServer(ctx, true)
}
