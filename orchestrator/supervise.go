package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"time"

	"github.com/extract-dev/extract/configs"
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

// maxRestartBackoff caps the wait before a restart: past a minute a longer wait buys
// nothing (the budget's window decides when to give up), and an uncapped doubling
// would wait hours by the 13th restart and overflow by the 35th.
const maxRestartBackoff = time.Minute

// restartBackoff is the wait before the n-th restart within the window (n ≥ 1): 1 s,
// doubling, at most maxRestartBackoff.
func restartBackoff(n int) time.Duration {
	if n < 1 {
		n = 1
	}
	if n > 7 { // 2^6 s already exceeds the cap; the shift never overflows
		return maxRestartBackoff
	}
	return min(time.Second<<(n-1), maxRestartBackoff)
}

// replica is one server of the job (server.replicas) and what the coordinator knows of
// it. Its Manager and Client are safe to use from any goroutine; the rest is the
// coordinator's.
type replica struct {
	n         int
	mgr       serverProcess
	spec      sglang.LaunchSpec // what mgr launches
	client    *sglang.Client
	staging   string // the dir its dump hook writes to
	status    ServerStatus
	restarts  restartBudget
	unhealthy int // consecutive failed health probes
}

// serverProcess is one replica's server as the supervisor drives it: an
// *sglang.Manager, or in a test the simulator in this process (RunOptions.newServer).
type serverProcess interface {
	Ensure(ctx context.Context) (*sglang.Server, error)
	Exited() <-chan struct{}
	Stop(ctx context.Context, grace time.Duration) error
	LogPath() string
	TrimLog(max int64) error
}

// supervisor keeps the job's replica set up: each replica with its restart budget and
// capped backoff, its health probes, and the poison rule's deaths per sample. Its
// goroutines report on exits, health and ups; the coordinator settles each report.
type supervisor struct {
	cfg      *configs.Config
	log      *slog.Logger
	replicas []*replica
	poison   poison
	exits    chan serverExit
	health   chan healthResult
	ups      chan upResult // restarts that bringUp finished
	backoff  func(n int) time.Duration
	// windowWarning says once a run, not per replica or restart, that the servers'
	// sort windows are fed short.
	windowWarning sync.Once
}

func newSupervisor(cfg *configs.Config, opt RunOptions) *supervisor {
	backoff := restartBackoff
	if opt.seams.restartBackoff != nil {
		backoff = opt.seams.restartBackoff
	}
	return &supervisor{
		cfg: cfg, log: opt.Log,
		replicas: newReplicas(cfg, opt.Executable, opt.Log, opt.seams.newServer),
		poison:   poison{isolateAfter: max(cfg.Server.IsolateAfterDeaths, 1)},
		exits:    make(chan serverExit),
		health:   make(chan healthResult, cfg.Server.Replicas),
		ups:      make(chan upResult),
		backoff:  backoff,
	}
}

// views is what admission knows of each replica before counting the flights: ready or not.
func (sv *supervisor) views() []replicaView {
	v := make([]replicaView, len(sv.replicas))
	for n, rep := range sv.replicas {
		v[n].ready = rep.status.State == "ready"
	}
	return v
}

// newReplicas makes the job's server.replicas replicas: replica r on GPUs
// gpus[r*tp_size:(r+1)*tp_size], port server.port+r, staging dir cfg.StagingDir(r), and
// its own record, log and restart budget.
func newReplicas(cfg *configs.Config, exe string, log *slog.Logger, newServer func(*sglang.Manager) serverProcess) []*replica {
	reps := make([]*replica, cfg.Server.Replicas)
	for r := range reps {
		spec := launchSpec(cfg, exe)
		spec.Port = cfg.ReplicaPort(r)
		spec.ShmDir = cfg.StagingDir(r)
		if cfg.Server.Replicas > 1 || len(cfg.Server.GPUs) > 0 {
			// One server without server.gpus keeps SGLang's own choice (no
			// CUDA_VISIBLE_DEVICES), as before replicas existed.
			spec.GPUs = cfg.ReplicaGPUs(r)
		}
		m := &sglang.Manager{StateDir: cfg.StateDir, Spec: spec, StartupTimeout: cfg.Server.StartupTimeout, Log: log, Replica: r}
		var mgr serverProcess = m
		if newServer != nil {
			mgr = newServer(m)
		}
		rep := &replica{
			n:        r,
			staging:  spec.ShmDir,
			mgr:      mgr,
			spec:     spec,
			client:   sglang.NewClient(spec.BaseURL(), sglang.ClientOptions{RetryMax: cfg.Run.RequestRetries, AttemptTimeout: cfg.Run.RequestTimeout, MaxConns: cfg.Run.MaxInflight, Logger: log}),
			restarts: restartBudget{max: cfg.Server.MaxRestarts, window: cfg.Server.RestartWindow},
		}
		rep.status = ServerStatus{Replica: r, State: "stopped", Port: spec.Port}
		if cfg.Server.Kind != sglang.KindSimulator {
			rep.status.GPUs = cfg.ReplicaGPUs(r)
		}
		reps[r] = rep
	}
	return reps
}

// upResult is a replica's launch or adoption, checked for capture, as bringUp ends it.
type upResult struct {
	r       int
	srv     *sglang.Server
	hook    sglang.HookMarker
	restart bool
	err     error
}

// serverExit says replica r's server pid is gone.
type serverExit struct{ r, pid int }

// healthResult is one probe of replica r's /health_generate.
type healthResult struct {
	r   int
	err error
}

// bringUp launches or adopts replica rep's server and checks it is set up for capture.
// It touches no coordinator state, so a restart runs beside the other replicas' work.
func (sv *supervisor) bringUp(ctx context.Context, rep *replica, restart bool) upResult {
	up := upResult{r: rep.n, restart: restart}
	srv, err := rep.mgr.Ensure(ctx)
	if err != nil {
		switch {
		case ctx.Err() != nil:
			up.err = fmt.Errorf("%w: stopped while server replica %d was starting", ErrTemporary, rep.n)
		case errors.Is(err, sglang.ErrPortTaken):
			up.err = fmt.Errorf("%w: %v", ErrPreflight, err)
		default:
			if line, ok := sglang.HookRefusal(err.Error()); ok {
				// The hook refused this SGLang or its settings before loading weights: a
				// restart would only refuse again.
				up.err = fmt.Errorf("%w: the server exited at start: %s (see %s)", ErrPreflight, line, rep.mgr.LogPath())
			} else {
				up.err = fmt.Errorf("%w: start server%s: %v", ErrTemporary, rep.label(), err)
			}
		}
		return up
	}
	up.srv = srv
	if !srv.Adopted {
		// A freshly launched server never finishes the partials of the one before; each
		// replica has its own staging dir, so only this replica's are discarded.
		if _, err := shm.RemovePartials(rep.staging); err != nil {
			sv.log.Warn("remove partial dumps", "dir", rep.staging, "err", err)
		}
	}
	stop := func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		if err := rep.mgr.Stop(sctx, 30*time.Second); err != nil {
			sv.log.Warn("stopping server", "replica", rep.n, "err", err)
		}
	}
	hook, ok := sglang.ServerHook(rep.staging, srv.PGID)
	if !ok {
		stop()
		up.err = fmt.Errorf("%w: server pid %d is up but its dump hook is not armed (no .hook-<pid>.json marker of its process group in %s); no dumps would come: see %s", ErrPreflight, srv.PID, rep.staging, rep.mgr.LogPath())
		return up
	}
	if hook.Protocol != "1" {
		stop()
		up.err = fmt.Errorf("%w: server pid %d runs dump hook %s speaking protocol %q; this extract reads protocol 1", ErrPreflight, srv.PID, hook.HookVersion, hook.Protocol)
		return up
	}
	up.hook = hook
	info, err := rep.client.ServerInfo(ctx)
	if err != nil {
		up.err = fmt.Errorf("%w: server info%s: %v", ErrTemporary, rep.label(), err)
		return up
	}
	if err := info.CheckCapture(rep.spec); err != nil {
		stop()
		up.err = fmt.Errorf("%w: server %s is not set up for capture: %v", ErrRefused, rep.spec.BaseURL(), err)
		return up
	}
	if want, short := sortWindowShort(info, sv.cfg.Run.MaxInflight, len(sv.replicas)); short {
		sv.windowWarning.Do(func() {
			window, batch, _ := info.SortWindow()
			sv.log.Warn("run.max_inflight leaves the server's sort window short: its batches pad more, and the GPU computes more a token; raise run.max_inflight to want_max_inflight",
				"max_inflight", sv.cfg.Run.MaxInflight, "replicas", len(sv.replicas),
				"window_requests", window, "max_batch_requests", batch, "want_max_inflight", want)
		})
	}
	return up
}

// sortWindowShort says whether maxInflight requests, shared by replicas servers, leave
// a server that sorts its queue in windows (info reports one) windows filled short, and
// what would fill them all.
func sortWindowShort(info sglang.ServerInfo, maxInflight, replicas int) (want int, short bool) {
	window, batch, ok := info.SortWindow()
	if !ok {
		return 0, false
	}
	want = configs.InflightToFill(window, batch) * max(replicas, 1)
	return want, maxInflight < want
}

// label names a replica in messages when the job has several.
func (rep *replica) label() string { return fmt.Sprintf(" (replica %d)", rep.n) }

// startServers brings every replica up at once and waits for all of them. The first
// failure ends the others' wait (a port taken must not wait out another replica's
// 40-minute model load) and the run; the replicas already up are stopped unless the
// failure is temporary (the next run adopts them then).
func (j *job) startServers(ctx context.Context) error {
	j.sup.stopRetiredReplicas(ctx)
	bringCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	ups := make(chan upResult, len(j.sup.replicas))
	for _, rep := range j.sup.replicas {
		rep.status.State = "starting"
		go func() { ups <- j.sup.bringUp(bringCtx, rep, false) }()
	}
	j.publish()
	var errs []error
	for range j.sup.replicas {
		up := <-ups
		if up.err != nil {
			errs = append(errs, up.err)
			cancel()
			continue
		}
		j.serverUp(up)
	}
	if len(errs) == 0 {
		return nil
	}
	err := errs[0]
	if !errors.Is(err, ErrTemporary) {
		j.stopServers(ctx)
	}
	return err
}

// stopRetiredReplicas stops the servers recorded for replicas this job no longer has
// (server.replicas lowered since they were launched): nobody else would ever stop them,
// and they hold GPUs. Their dumps are in the staging dirs the run scanned already.
func (sv *supervisor) stopRetiredReplicas(ctx context.Context) {
	records, _ := filepath.Glob(filepath.Join(sv.cfg.StateDir, "server-*.json"))
	for _, path := range records {
		var r int
		if _, err := fmt.Sscanf(filepath.Base(path), "server-%d.json", &r); err != nil || r < len(sv.replicas) || sglang.RecordPath(sv.cfg.StateDir, r) != path {
			continue
		}
		sv.log.Info("stopping the server of a replica this job no longer has", "replica", r, "record", path, "replicas", len(sv.replicas))
		m := &sglang.Manager{StateDir: sv.cfg.StateDir, Log: sv.log, Replica: r}
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		if err := m.Stop(sctx, 30*time.Second); err != nil {
			sv.log.Warn("stopping retired replica", "replica", r, "err", err)
		}
		cancel()
	}
}

// serverUp marks a replica ready and watches for its exit.
func (j *job) serverUp(up upResult) {
	rep := j.sup.replicas[up.r]
	rep.status.State, rep.status.PID, rep.status.Adopted = "ready", up.srv.PID, up.srv.Adopted
	rep.status.HookVersion = up.hook.HookVersion
	rep.unhealthy = 0
	j.metrics.serverUp.WithLabelValues(rep.metricLabel()).Set(1)
	exited, pid := rep.mgr.Exited(), up.srv.PID
	j.workers.start(fmt.Sprintf("replica %d exit watch", rep.n), func(ctx context.Context) error {
		select {
		case <-exited:
			select {
			case j.sup.exits <- serverExit{r: rep.n, pid: pid}:
			case <-ctx.Done():
			}
		case <-ctx.Done():
		}
		return nil
	})
	j.log.Info("server ready", "replica", rep.n, "pid", up.srv.PID, "adopted", up.srv.Adopted, "url", rep.spec.BaseURL(), "restart", up.restart, "hook_version", up.hook.HookVersion, "layers", up.hook.Layers)
}

func (rep *replica) metricLabel() string { return fmt.Sprint(rep.n) }

// onUp settles a restart that bringUp finished.
func (j *job) onUp(up upResult) error {
	if up.err != nil {
		return up.err
	}
	j.serverUp(up)
	return nil
}

// stopServers stops every replica's server we launched or adopted. It must outlive the
// operator's signal that ends ctx, so it runs on ctx's values without its cancellation.
func (j *job) stopServers(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	done := make(chan struct{}, len(j.sup.replicas))
	for _, rep := range j.sup.replicas {
		go func() {
			rep.client.CloseIdleConnections()
			if err := rep.mgr.Stop(ctx, 30*time.Second); err != nil {
				j.log.Warn("stopping server", "replica", rep.n, "err", err)
			}
			done <- struct{}{}
		}()
	}
	for _, rep := range j.sup.replicas {
		<-done
		rep.status.State = "stopped"
		j.metrics.serverUp.WithLabelValues(rep.metricLabel()).Set(0)
	}
}

// probeHealth asks rep's /health_generate every health_interval; the coordinator judges.
func (sv *supervisor) probeHealth(ctx context.Context, rep *replica) error {
	t := time.NewTicker(sv.cfg.Server.HealthInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		pctx, cancel := context.WithTimeout(ctx, sv.cfg.Server.HealthTimeout)
		err := rep.client.HealthGenerate(pctx)
		cancel()
		if ctx.Err() != nil {
			return nil
		}
		select {
		case sv.health <- healthResult{r: rep.n, err: err}:
		default: // the coordinator is busy; the next probe will do
		}
	}
}

// onHealth counts a replica's failed probes in a row; health_failures of them is a hang:
// its whole process group is killed and it is restarted like after a death.
func (j *job) onHealth(ctx context.Context, h healthResult) error {
	rep := j.sup.replicas[h.r]
	if h.err == nil || rep.status.State != "ready" {
		rep.unhealthy = 0
		return nil
	}
	rep.unhealthy++
	j.log.Warn("server health probe failed", "replica", rep.n, "pid", rep.status.PID, "consecutive", rep.unhealthy, "err", h.err)
	if rep.unhealthy < j.cfg.Server.HealthFailures {
		return nil
	}
	rep.unhealthy = 0
	j.log.Error("server hung: killing its process group", "replica", rep.n, "pid", rep.status.PID, "failed_probes", j.cfg.Server.HealthFailures)
	j.reject("server_hang")
	return j.serverGone(ctx, rep, true)
}

// poisonRule settles sample s, in flight at a server death or hang: sent again, alone
// once it was in flight at server.isolate_after_deaths of them, and failed when the
// server died with it alone, so a prompt that kills the server ends as that sample's
// failure (exit 1) instead of a restart loop (exit 75 forever).
func (j *job) poisonRule(s int, wasAlone bool) {
	p := &j.sup.poison
	k := p.isolateAfter
	if p.died(s, wasAlone) {
		j.markFailed(s, fmt.Sprintf("server died with it in flight (sent alone after %d deaths with it in flight)", k), p.deathsOf(s)+1)
		return
	}
	if p.isAlone(s) && p.deathsOf(s) == k {
		j.log.Warn("sample was in flight at every recent server death: sending it alone", "sample", s, "deaths", k)
	}
	j.admission.retryAt(s, time.Now())
}

// killHung stops a hung replica's process group: SIGTERM, and SIGKILL after 5 s.
func killHung(ctx context.Context, rep *replica) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	if err := rep.mgr.Stop(ctx, 5*time.Second); err != nil {
		return fmt.Errorf("%w: kill hung server%s: %v", ErrTemporary, rep.label(), err)
	}
	return nil
}

// onServerExit handles the exit of replica e.r's server pid e.pid, once: a second report,
// or one about a server already replaced, is dropped.
func (j *job) onServerExit(ctx context.Context, e serverExit) error {
	rep := j.sup.replicas[e.r]
	if rep.status.State != "ready" || rep.status.PID != e.pid {
		return nil
	}
	j.log.Error("server exited", "replica", rep.n, "pid", e.pid)
	return j.serverGone(ctx, rep, false)
}

// serverGone sends what the dead (or hung) replica held to the others (or to it once it
// is back) and, unless the run is draining, restarts it within its own restart budget,
// beside the replicas that still work. A hung server is killed first: in the restart's
// worker, so its grace never stalls the others' dumps, or here when no restart follows.
func (j *job) serverGone(ctx context.Context, rep *replica, hung bool) error {
	rep.status.State = "stopped"
	j.metrics.serverUp.WithLabelValues(rep.metricLabel()).Set(0)
	now := time.Now()
	for s, f := range j.inflight {
		if f.replica == rep.n && !f.moving {
			// Its request would retry against the restarted server under the old rid,
			// and hold a window slot the live replicas could use meanwhile.
			f.abandon()
			delete(j.inflight, s)
			j.poisonRule(s, f.alone)
		}
	}
	if j.draining {
		if hung {
			return killHung(ctx, rep)
		}
		return nil
	}
	n, ok := rep.restarts.spend(now)
	if !ok {
		if hung {
			if err := killHung(ctx, rep); err != nil {
				return err
			}
		}
		return fmt.Errorf("%w: server%s died or hung %d times within %s (server.max_restarts %d); see %s", ErrTemporary, rep.label(), n, j.cfg.Server.RestartWindow, j.cfg.Server.MaxRestarts, rep.mgr.LogPath())
	}
	rep.status.Restarts++
	rep.status.State = "restarting"
	j.metrics.restarts.WithLabelValues(rep.metricLabel()).Inc()
	j.publish()
	backoff := j.sup.backoff(n)
	j.workers.start(fmt.Sprintf("replica %d restart", rep.n), func(ctx context.Context) error {
		if hung {
			if err := killHung(ctx, rep); err != nil {
				select {
				case j.sup.ups <- upResult{r: rep.n, restart: true, err: err}:
				case <-ctx.Done():
				}
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(backoff):
		}
		up := j.sup.bringUp(ctx, rep, true)
		if ctx.Err() != nil {
			return nil // the run is ending; a server still loading is adopted next time
		}
		select {
		case j.sup.ups <- up:
		case <-ctx.Done():
		}
		return nil
	})
	return nil
}
