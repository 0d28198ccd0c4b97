package orchestrator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/extract-dev/extract/checkpoint"
	"github.com/extract-dev/extract/configs"
	"github.com/extract-dev/extract/dataset"
	"github.com/extract-dev/extract/doctor"
	"github.com/extract-dev/extract/internal/atomicfile"
	"github.com/extract-dev/extract/internal/history"
	"github.com/extract-dev/extract/sglang"
	"github.com/extract-dev/extract/shm"
)

// job is one run. Its fields are owned by the coordinator goroutine (loop); senders,
// movers, the watcher and the probes talk to it only through channels. Each concern
// keeps its state in its own value: admission (what to send, deciding over the request
// window), ledger (where every sample stands), route (what to do with a dump), movers
// (the dumps on their way to the output disk), sup (the replicas, their restarts and
// the poison rule), runOutputs (what people see). More than ~15 fields, because what
// is left is what ties those together and no one of them owns: the job's inputs, the
// flights and the counts of the window, the budgets measured, and the channels and
// goroutines of the run.
type job struct {
	cfg  *configs.Config
	opt  RunOptions
	log  *slog.Logger
	ds   *dataset.Dataset
	ix   *checkpoint.Index
	lock *Lock

	ledger    ledger
	admission admission
	budgets   budgets
	movers    *movers
	sup       *supervisor
	inflight  map[int]*flight
	// requestsOpen counts the senders whose result the coordinator has not settled: the
	// requests open at the servers, whatever became of their flight.
	requestsOpen int
	// attemptBase is the index's attempt base: every new attempt is above it.
	attemptBase int
	draining    bool

	workers    workers
	dumps      chan shm.Dump
	sent       chan sendResult
	quarantine *quarantine
	// watchers watch every staging dir: each replica's, and those of earlier runs with
	// another number of replicas.
	watchers []*shm.Watcher
	started  time.Time
	indexIno uint64 // the index file's inode, to see it replaced
	runOutputs
}

// runOutputs is what the run shows of itself to people: status, metrics, history, and
// the counts only they read.
type runOutputs struct {
	rejected map[string]int64
	adopted  int64 // leftover dumps of a crashed run moved instead of recomputed
	sentAny  bool
	rates    rateTracker
	gpus     atomic.Pointer[[]GPUStatus] // written by sampleGPUs
	metrics  *metrics
	status   *statusServer
	history  *history.Writer // nil when the history cannot be written (it is for people, not for the run)
}

type flight struct {
	sample    int
	attempt   int
	rid       string
	replica   int       // the replica it was sent to; -1 for a leftover dump adopted
	tokens    int64     // its load on the replica until the dump arrives
	expected  int64     // dump bytes we expect, reserved against the budgets
	answered  time.Time // when the server answered, the dump not yet arrived
	responded bool      // its request is over
	moving    bool
	abandon   context.CancelFunc // ends its request; nil for an adopted leftover
	alone     bool               // sent alone to its replica (the poison rule)
}

// errStateLost means the state dir (or the staging dir) was deleted or replaced under
// the run: the run stops the servers it started before it exits.
var errStateLost = errors.New("state dir lost")

// tick paces admission re-checks, timeouts and status snapshots.
const tick = 250 * time.Millisecond

func newJob(cfg *configs.Config, opt RunOptions, ds *dataset.Dataset, ix *checkpoint.Index, lock *Lock, started time.Time) (*job, error) {
	prog, err := ix.Load(ds.Len())
	if err != nil {
		return nil, err
	}
	c, err := ix.Counters()
	if err != nil {
		return nil, err
	}
	st, err := os.Stat(ix.Path())
	if err != nil {
		return nil, fmt.Errorf("stat index: %w", err)
	}
	base, err := ix.AttemptBase()
	if err != nil {
		return nil, err
	}
	j := &job{
		cfg: cfg, opt: opt, log: opt.Log, ds: ds, ix: ix, lock: lock,
		ledger:      newLedger(prog, c),
		admission:   admission{failures: map[int]int{}},
		movers:      newMovers(cfg, ds, ix, opt.Log),
		sup:         newSupervisor(cfg, opt),
		inflight:    map[int]*flight{},
		dumps:       make(chan shm.Dump, 64),
		sent:        make(chan sendResult, cfg.Run.MaxInflight),
		quarantine:  newQuarantine(cfg.StagingDirs(), cfg.StateDir, opt.Log),
		started:     started,
		indexIno:    st.Sys().(*syscall.Stat_t).Ino,
		attemptBase: base,
		runOutputs:  runOutputs{rejected: map[string]int64{}, metrics: newMetrics()},
	}
	// A shard admits only its own range; the ledger counts it as the shard's total.
	span := spanOf(cfg, ds.Len())
	j.ledger.owned = span.size()
	for i, s := range prog.State {
		if s != checkpoint.StateDone && span.owns(i) {
			j.admission.queue = append(j.admission.queue, i)
		}
	}
	for _, rep := range j.sup.replicas {
		// Every replica's series exists from the start, at 0: a scrape can tell "no
		// restarts" from "no such replica".
		j.metrics.restarts.WithLabelValues(rep.metricLabel())
		j.metrics.serverDone.WithLabelValues(rep.metricLabel())
		j.metrics.serverUp.WithLabelValues(rep.metricLabel()).Set(0)
	}
	return j, nil
}

func launchSpec(cfg *configs.Config, exe string) sglang.LaunchSpec {
	s := cfg.Server
	return sglang.LaunchSpec{
		Kind: s.Kind, Host: s.Host, Port: s.Port,
		ModelPath: cfg.ServedModel(), TPSize: s.TPSize, GPUs: s.GPUs, MemFraction: s.MemFraction,
		ExtraArgs: s.ExtraArgs, Env: s.Env, Python: s.Python,
		Layers: s.Layers, ShmDir: cfg.ShmDir,
		HookDir:      filepath.Join(cfg.StateDir, sglang.HookDirName()),
		Simulator:    sglang.SimulatorSpec{Executable: exe, NumLayers: s.NumLayers, Simulator: s.Simulator},
		Transformers: transformersSpec(cfg),
	}
}

// run drives the job. ctx is the operator's: its cancellation starts a graceful stop.
func (j *job) run(ctx context.Context) (Result, error) {
	res := Result{OutputDir: j.cfg.OutputDir, Total: j.ledger.size()}

	if j.ledger.c.Done == j.ledger.size() {
		j.log.Info("job already complete", "samples", j.ledger.c.Done, "output_dir", j.cfg.OutputDir)
		j.stopServers(ctx)
		res.Outcome, res.Done, res.Bytes = AlreadyComplete, j.ledger.c.Done, j.ledger.c.BytesWritten
		return res, nil
	}

	status, err := startStatusServer(j.cfg.Status.Listen, j.metrics)
	if err != nil {
		return res, fmt.Errorf("%w: %v (doctor's check \"status port\" names who holds it)", ErrPreflight, err)
	}
	j.status = status
	defer status.close()
	// /sample answers before run.json names the address: a query in between would
	// otherwise get the mux's plain 404, "an older extract".
	serveSamples(status, j.ix, outputLayout(j.cfg))
	host, _ := os.Hostname()
	ri, _ := json.Marshal(runInfo{PID: os.Getpid(), Host: host, StatusAddr: status.addr, StartedAt: j.started.UTC()})
	if err := atomicfile.WriteFile(runInfoPath(j.cfg.StateDir), ri, 0o644); err != nil {
		return res, err
	}
	j.log.Info("status endpoint", "addr", "http://"+status.addr+"/status")
	j.openHistory()
	defer j.closeHistory()

	// Only staging dirs no other user can write are trusted with dumps (invariant 8);
	// made before anything else would create them.
	owner, err := doctor.StagingOwner(j.cfg)
	if err != nil {
		return res, err
	}
	for _, dir := range j.cfg.StagingDirs() {
		if err := shm.PrepareDir(dir, owner); err != nil {
			return res, fmt.Errorf("%w: %w", ErrPreflight, err)
		}
	}
	if err := j.measure(); err != nil {
		// Before any work: the output disk or a staging dir is unusable (a file where a
		// replica's dir belongs). The node's state, exit 3, not a failed sample.
		return res, fmt.Errorf("%w: %w", ErrPreflight, err)
	}

	// Watch before anything can write a dump, then list what is already there: in every
	// staging dir, so leftovers of a run with another number of replicas are adopted too.
	var leftovers []shm.Dump
	for _, dir := range j.cfg.StagingDirs() {
		w, err := shm.NewWatcher(dir, j.log)
		if err != nil {
			return res, err
		}
		defer func() { _ = w.Close() }()
		j.watchers = append(j.watchers, w)
		found, err := w.Scan()
		if err != nil {
			return res, fmt.Errorf("%w: %v", ErrTemporary, err)
		}
		leftovers = append(leftovers, found...)
	}

	work, stopWork := context.WithCancel(context.WithoutCancel(ctx))
	j.workers = workers{ctx: work, cancel: stopWork, failed: make(chan error, 1)}
	defer j.workers.stop()
	j.movers.start(&j.workers)
	// Leftovers are routed before anything is admitted: admission would start new
	// attempts of exactly these samples and make their complete dumps stale (invariant 6).
	for _, d := range leftovers {
		j.onDump(d)
	}
	j.quarantine.queueHeld()
	j.workers.start("quarantine", j.quarantine.run)
	for _, w := range j.watchers {
		j.workers.start("staging watcher", func(ctx context.Context) error { return w.Run(ctx, j.dumps) })
	}

	if err := j.startServers(ctx); err != nil {
		return res, err
	}

	for _, rep := range j.sup.replicas {
		j.workers.start(fmt.Sprintf("replica %d health probe", rep.n), func(ctx context.Context) error { return j.sup.probeHealth(ctx, rep) })
	}
	if j.cfg.Server.Kind == sglang.KindSGLang {
		j.workers.start("gpu sampler", func(ctx context.Context) error {
			sampleGPUs(ctx, sglang.NewGPUInspector(nil), j.cfg.GPUIndices(), 10*time.Second, &j.gpus, j.log)
			return nil
		})
	}
	loopErr := j.loop(ctx)
	j.movers.finish(j.settleMoved)
	j.workers.stop()
	j.countWatcherFindings()
	j.publish()
	j.writeProgress()

	c := j.ledger.c
	res.Done, res.Failed, res.Bytes = c.Done, c.Failed, c.BytesWritten
	res.Rejected, res.QuarantineDir = maps.Clone(j.rejected), j.quarantine.dir
	switch {
	case errors.Is(loopErr, errStateLost):
		// Nobody could stop the servers after us: their records may be gone with the dir.
		j.stopServers(ctx)
		return res, loopErr
	case errors.Is(loopErr, ErrTemporary):
		// A server is gone or unhealthy: the others are left for the next run to adopt.
		return res, loopErr
	}
	j.stopServers(ctx)
	if loopErr != nil {
		return res, loopErr
	}
	if ctx.Err() != nil {
		res.Outcome = Stopped
		return res, nil
	}
	if err := settle(c, j.ledger.size(), j.cfg.Run.MaxAttempts); err != nil {
		return res, err
	}
	res.Outcome = Finished
	return res, nil
}

// settle says whether a run that ran to its end finished: only when every sample it
// owns is done or failed. One that is neither was dropped by a write the index refused
// (a MarkFailed on a failing state disk): the run must not call itself finished, and
// exit 0 would tell cron there is nothing left to do.
func settle(c checkpoint.Counters, owned, maxAttempts int) error {
	switch {
	case c.Done+c.Failed < owned:
		return fmt.Errorf("%w: the run ended with %d of its %d samples neither done nor failed (%d done, %d failed): the index did not record them (see the log); `extract run --resume` continues",
			ErrTemporary, owned-c.Done-c.Failed, owned, c.Done, c.Failed)
	case c.Failed > 0:
		return fmt.Errorf("%d samples failed, after up to %d attempts each or by killing the server while sent alone (the log and the index say why); `extract run --resume` retries them", c.Failed, maxAttempts)
	}
	return nil
}

// loop is the coordinator: it admits samples, routes dumps to movers and settles results
// until every sample is done or failed, or a graceful stop has drained.
func (j *job) loop(ctx context.Context) error {
	ticker := time.NewTicker(tick)
	defer ticker.Stop()
	var drainUntil time.Time
	lastLog := time.Now()
	stop := ctx.Done()
	for {
		if j.draining && (len(j.inflight) == 0 || time.Now().After(drainUntil)) {
			return nil
		}
		if !j.draining {
			j.admit()
		}
		if len(j.inflight) == 0 && j.admission.empty() {
			return nil
		}
		sendMove, nextMove := j.movers.next()
		select {
		case <-stop:
			stop = nil
			j.draining = true
			drainUntil = time.Now().Add(j.cfg.Run.DrainTimeout)
			j.log.Info("stopping: no new samples; draining in-flight ones", "inflight", len(j.inflight), "timeout", j.cfg.Run.DrainTimeout)
		case err := <-j.workers.failed:
			if errors.Is(err, shm.ErrStagingGone) {
				// The server's dumps and its hook's marker went with the dir: a fresh
				// server is needed, and nobody else would stop this one.
				return fmt.Errorf("%w: %w: %v; stopping the server this run started", ErrTemporary, errStateLost, err)
			}
			return fmt.Errorf("%w: %v", ErrTemporary, err)
		case sendMove <- nextMove:
			j.movers.handed()
		case d := <-j.dumps:
			j.onDump(d)
		case r := <-j.sent:
			if err := j.onSent(r); err != nil {
				return err
			}
		case r := <-j.movers.moved:
			if err := j.onMoved(r); err != nil {
				return err
			}
		case e := <-j.sup.exits:
			if err := j.onServerExit(ctx, e); err != nil {
				return err
			}
		case h := <-j.sup.health:
			if err := j.onHealth(ctx, h); err != nil {
				return err
			}
		case up := <-j.sup.ups:
			if err := j.onUp(up); err != nil {
				return err
			}
		case <-ticker.C:
			if why := j.stateLost(); why != "" {
				return fmt.Errorf("%w: %w: %s; stopping the server this run started", ErrTemporary, errStateLost, why)
			}
			if err := j.measure(); err != nil {
				j.log.Warn("measure disk usage", "err", err)
			}
			j.checkTimeouts()
			j.movers.retryStores(time.Now())
			j.countWatcherFindings()
			j.publish()
			j.recordHistory()
			if time.Since(lastLog) >= 30*time.Second {
				lastLog = time.Now()
				j.logProgress()
				j.writeProgress()
				for _, rep := range j.sup.replicas {
					if err := rep.mgr.TrimLog(int64(j.cfg.Server.LogMaxSize)); err != nil {
						j.log.Warn("trim server log", "replica", rep.n, "err", err)
					}
				}
			}
		}
	}
}

// stateLost says why the state dir no longer belongs to this run, or "": the lock file
// or the index was removed or replaced, so what the run commits would reach no one.
func (j *job) stateLost() string {
	if why := j.lock.Lost(); why != "" {
		return why
	}
	st, err := os.Stat(j.ix.Path())
	if err != nil {
		return fmt.Sprintf("index %s is gone (%v)", j.ix.Path(), err)
	}
	if st.Sys().(*syscall.Stat_t).Ino != j.indexIno {
		return fmt.Sprintf("index %s was replaced by another file", j.ix.Path())
	}
	return ""
}

// onDump routes a dump: the current attempt of an unfinished sample goes to a mover;
// anything else is rejected (invariant 4).
func (j *job) onDump(d shm.Dump) {
	v, why := route(d, &j.ledger, j.movers.moving[d.Path])
	switch v {
	case alreadyOn:
		return
	case unexplained:
		j.reject(v.rejectReason())
		j.log.Warn("dump rejected", "file", d.Path, "reason", v.rejectReason(), "detail", why)
		j.quarantine.hold(d.Path)
		return
	case duplicate, stale:
		if _, err := os.Lstat(d.Path); err != nil {
			return // reported twice (scan and event) and already handled
		}
		j.reject(v.rejectReason())
		j.log.Info("dump rejected", "file", d.Path, "reason", v.rejectReason(), "detail", why)
		if err := os.Remove(d.Path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			j.log.Warn("remove rejected dump", "file", d.Path, "err", err)
		}
		return
	}
	s := d.RID.Sample
	f := j.inflight[s]
	if f == nil {
		// A complete dump of the current attempt left by a crashed run: adopt it (invariant 6).
		f = &flight{sample: s, attempt: d.RID.Attempt, rid: d.RID.String(), replica: -1, expected: j.expectedBytes(s)}
		j.inflight[s] = f
		j.adopted++
		j.log.Info("adopting leftover dump", "sample", s, "rid", f.rid)
	}
	if f.moving {
		return
	}
	f.moving = true
	j.movers.add(d)
}
