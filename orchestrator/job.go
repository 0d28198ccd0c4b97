package orchestrator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/extract-dev/extract/checkpoint"
	"github.com/extract-dev/extract/configs"
	"github.com/extract-dev/extract/internal/atomicfile"
	"github.com/extract-dev/extract/sglang"
	"github.com/extract-dev/extract/shm"
)

// job is one run. Its fields are owned by the coordinator goroutine (loop); senders,
// movers, the watcher and the probes talk to it only through channels. Each concern
// keeps its state in its own value: admission (what to send), ledger (where every
// sample stands), route (what to do with a dump), replica (one server each, with its
// restart budget).
type job struct {
	cfg   *configs.Config
	opt   RunOptions
	log   *slog.Logger
	ds    *Dataset
	ix    *checkpoint.Index
	lock  *Lock
	mover *checkpoint.Mover
	// replicas are the job's servers (server.replicas), fed by the one admission loop.
	replicas []*replica

	ledger    ledger
	admission admission
	budgets   budgets
	inflight  map[int]*flight
	moving    map[string]bool // dump paths handed to a mover, or waiting to be
	moveQueue []moveJob       // routed dumps waiting for a free mover; the coordinator never blocks on movers
	stores    []storeRetry    // dumps whose store failed, tried again when due
	// storeFailing says why storing dumps fails (full disk, I/O error), "" while it works.
	storeFailing string
	storeErrors  int // consecutive failures to store a dump

	rejected map[string]int64
	adopted  int64 // leftover dumps of a crashed run moved instead of recomputed
	draining bool
	sentAny  bool
	started  time.Time
	indexIno uint64
	// attemptBase is the index's attempt base: every new attempt is above it.
	attemptBase int

	workers    workers
	dumps      chan shm.Dump
	sent       chan sendResult
	moved      chan moveResult
	moveJobs   chan moveJob
	movers     atomic.Int32  // movers still running
	moversDone chan struct{} // closed by the last mover to exit
	health     chan healthResult
	exits      chan serverExit
	ups        chan upResult // restarts that bringUp finished
	quarantine *quarantine

	rates rateTracker
	// watchers watch every staging dir: each replica's, and those of earlier runs with
	// another number of replicas.
	watchers []*shm.Watcher
	gpus     atomic.Pointer[[]GPUStatus] // written by sampleGPUs
	metrics  *metrics
	status   *statusServer
}

type flight struct {
	sample   int
	attempt  int
	rid      string
	replica  int   // the replica it was sent to; -1 for a leftover dump adopted
	tokens   int64 // its load on the replica until the dump arrives
	expected int64 // dump bytes we expect, reserved against the budgets
	answered time.Time
	moving   bool
}

type sendResult struct {
	sample, attempt int
	err             error
}

type moveJob struct {
	dump     shm.Dump
	expected int64
}

type moveResult struct {
	dump  shm.Dump
	moved checkpoint.Moved
	took  time.Duration
	err   error
}

type storeRetry struct {
	job moveJob
	due time.Time
}

// workers runs the run's goroutines, and whoever starts one waits for it. Its ctx lives
// until the coordinator is done with senders and movers, past the operator's signal; a
// goroutine that fails reports on failed, which ends the run.
type workers struct {
	ctx    context.Context
	cancel context.CancelFunc
	g      errgroup.Group
	failed chan error
}

func (w *workers) start(name string, fn func(ctx context.Context) error) {
	w.g.Go(func() error {
		err := fn(w.ctx)
		if err != nil && w.ctx.Err() == nil {
			select {
			case w.failed <- fmt.Errorf("%s: %w", name, err):
			default:
			}
		}
		return err
	})
}

// stop cancels every goroutine and waits for all of them.
func (w *workers) stop() error {
	w.cancel()
	return w.g.Wait()
}

// errStateLost means the state dir was deleted or replaced under the run.
var errStateLost = errors.New("state dir lost")

// tick paces admission re-checks, timeouts and status snapshots.
const tick = 250 * time.Millisecond

// storeRetryDelay is how long a dump that could not be stored waits before the next try.
const storeRetryDelay = 2 * time.Second

func newJob(cfg *configs.Config, opt RunOptions, ds *Dataset, ix *checkpoint.Index, lock *Lock, started time.Time) (*job, error) {
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
		mover:       &checkpoint.Mover{OutputDir: cfg.OutputDir, Layout: outputLayout(cfg)},
		ledger:      newLedger(prog, c),
		admission:   admission{failures: map[int]int{}},
		inflight:    map[int]*flight{},
		moving:      map[string]bool{},
		rejected:    map[string]int64{},
		metrics:     newMetrics(),
		dumps:       make(chan shm.Dump, 64),
		sent:        make(chan sendResult, cfg.Run.MaxInflight),
		moved:       make(chan moveResult, cfg.Run.MaxInflight+cfg.Run.Movers),
		moveJobs:    make(chan moveJob),
		moversDone:  make(chan struct{}),
		health:      make(chan healthResult, cfg.Server.Replicas),
		exits:       make(chan serverExit),
		ups:         make(chan upResult),
		quarantine:  newQuarantine(cfg.StagingDirs(), cfg.StateDir, opt.Log),
		started:     started,
		indexIno:    st.Sys().(*syscall.Stat_t).Ino,
		attemptBase: base,
	}
	// A shard admits only its own range; the ledger counts it as the shard's total.
	span := spanOf(cfg, ds.Len())
	j.ledger.owned = span.size()
	for i, s := range prog.State {
		if s != checkpoint.StateDone && span.owns(i) {
			j.admission.queue = append(j.admission.queue, i)
		}
	}
	j.replicas = newReplicas(cfg, opt.Executable, j.log)
	for _, rep := range j.replicas {
		// Every replica's series exists from the start, at 0: a scrape can tell "no
		// restarts" from "no such replica".
		j.metrics.restarts.WithLabelValues(rep.metricLabel())
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
		HookDir: filepath.Join(cfg.StateDir, sglang.HookDirName()),
		Simulator: sglang.SimulatorSpec{
			Executable:      exe,
			TokensPerSecond: s.Simulator.TokensPerSecond,
			HiddenSize:      s.Simulator.HiddenSize,
			NumLayers:       s.NumLayers,
			StartupDelay:    s.Simulator.StartupDelay,
			ExitAfter:       s.Simulator.ExitAfter,
			HangAfter:       s.Simulator.HangAfter,
			Fail503Every:    s.Simulator.Fail503Every,
			CorruptEvery:    s.Simulator.CorruptEvery,
			LateDumpDelay:   s.Simulator.LateDumpDelay,
			RequestLog:      s.Simulator.RequestLog,
		},
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
		return res, fmt.Errorf("%w: %v", ErrRefused, err)
	}
	j.status = status
	defer status.close()
	host, _ := os.Hostname()
	ri, _ := json.Marshal(runInfo{PID: os.Getpid(), Host: host, StatusAddr: status.addr, StartedAt: j.started.UTC()})
	if err := atomicfile.WriteFile(runInfoPath(j.cfg.StateDir), ri, 0o644); err != nil {
		return res, err
	}
	j.log.Info("status endpoint", "addr", "http://"+status.addr+"/status")

	if err := j.measure(); err != nil {
		return res, err
	}

	// Watch before anything can write a dump, then list what is already there: in every
	// staging dir, so leftovers of a run with another number of replicas are adopted too.
	var leftovers []shm.Dump
	for _, dir := range j.cfg.StagingDirs() {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return res, fmt.Errorf("create staging dir %s: %w", dir, err)
		}
		w, err := shm.NewWatcher(dir, j.log)
		if err != nil {
			return res, err
		}
		defer w.Close()
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
	j.movers.Store(int32(j.cfg.Run.Movers))
	for range j.cfg.Run.Movers {
		j.workers.start("mover", j.moverLoop)
	}
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

	for _, rep := range j.replicas {
		j.workers.start(fmt.Sprintf("replica %d health probe", rep.n), func(ctx context.Context) error { return j.probeHealth(ctx, rep) })
	}
	if j.cfg.Server.Kind == sglang.KindSGLang {
		j.workers.start("gpu sampler", func(ctx context.Context) error {
			sampleGPUs(ctx, sglang.NewGPUInspector(nil), j.cfg.GPUIndices(), 10*time.Second, &j.gpus, j.log)
			return nil
		})
	}
	loopErr := j.loop(ctx)
	j.finishMoves()
	j.workers.stop()
	j.countWatcherFindings()
	j.publish()
	j.writeProgress()

	c := j.ledger.c
	res.Done, res.Failed, res.Bytes = c.Done, c.Failed, c.BytesWritten
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
	if c.Failed > 0 {
		return res, fmt.Errorf("%d samples failed after %d attempts each (see the log for why); `extract run --resume` retries them", c.Failed, j.cfg.Run.MaxAttempts)
	}
	res.Outcome = Finished
	return res, nil
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
			if err := j.admit(); err != nil {
				return err
			}
		}
		if len(j.inflight) == 0 && j.admission.empty() {
			return nil
		}
		var sendMove chan<- moveJob
		var nextMove moveJob
		if len(j.moveQueue) > 0 {
			sendMove, nextMove = j.moveJobs, j.moveQueue[0]
		}
		select {
		case <-stop:
			stop = nil
			j.draining = true
			drainUntil = time.Now().Add(j.cfg.Run.DrainTimeout)
			j.log.Info("stopping: no new samples; draining in-flight ones", "inflight", len(j.inflight), "timeout", j.cfg.Run.DrainTimeout)
		case err := <-j.workers.failed:
			return fmt.Errorf("%w: %v", ErrTemporary, err)
		case sendMove <- nextMove:
			j.moveQueue = j.moveQueue[1:]
		case d := <-j.dumps:
			j.onDump(d)
		case r := <-j.sent:
			if err := j.onSent(r); err != nil {
				return err
			}
		case r := <-j.moved:
			if err := j.onMoved(r); err != nil {
				return err
			}
		case e := <-j.exits:
			if err := j.onServerExit(ctx, e); err != nil {
				return err
			}
		case h := <-j.health:
			if err := j.onHealth(ctx, h); err != nil {
				return err
			}
		case up := <-j.ups:
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
			j.retryStores()
			j.countWatcherFindings()
			j.publish()
			if time.Since(lastLog) >= 30*time.Second {
				lastLog = time.Now()
				j.logProgress()
				j.writeProgress()
				for _, rep := range j.replicas {
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

// expectedBytes is what a sample will take, in staging and then on the output disk.
func (j *job) expectedBytes(sample int) int64 { return sampleBytes(j.cfg, j.ds.Tokens(sample)) }

// sampleBytes is what admission reserves for a sample of tokens: the output file's size
// (a dump plus the loss mask), plus room for header, page rounding and directory blocks.
func sampleBytes(cfg *configs.Config, tokens int) int64 {
	return int64(tokens)*cfg.OutputBytesPerToken() + 16<<10
}

// pauseReasons are the metric labels of admission's pauses, by the prefix of the reason.
var pauseReasons = []string{"output disk reserve", "staging budget", "cannot store dumps", "no server ready"}

// admit sends samples while the window and the budgets allow (invariant 5).
func (j *job) admit() error {
	a := &j.admission
	a.paused = a.paused[:0]
	defer j.setPausedMetrics()
	if j.storeFailing != "" {
		// Storing is failing (a full disk behind our back, an I/O error): admitting more
		// would only pile dumps up in staging.
		a.paused = append(a.paused, "cannot store dumps: "+j.storeFailing)
		return nil
	}
	// Every flight counts until its move lands, and a landed move is taken off diskFree
	// at once (onMoved): between two measurements the estimate never runs behind the disk.
	var reserved int64
	for _, f := range j.inflight {
		reserved += f.expected
	}
	skip := func(s int) bool {
		_, busy := j.inflight[s]
		return busy || j.ledger.done(s)
	}
	// Each sample goes to the ready replica with the fewest tokens in flight.
	load := j.replicaLoad()
	var batch []int
	var to []*replica
	now := time.Now()
	for len(j.inflight)+len(batch) < j.cfg.Run.MaxInflight {
		s, fromRetry := a.next(now, skip)
		if s < 0 {
			break
		}
		target := leastLoaded(j.replicas, load)
		if target == nil {
			a.paused = append(a.paused, "no server ready: every replica is restarting")
			break
		}
		want := j.expectedBytes(s)
		if reason := j.budgets.blocked(reserved, want, len(j.inflight)+len(batch) == 0); reason != "" {
			a.paused = append(a.paused, reason)
			break
		}
		a.take(fromRetry)
		batch = append(batch, s)
		to = append(to, target)
		load[target.n] += int64(j.ds.Tokens(s))
		reserved += want
	}
	if len(batch) == 0 {
		return nil
	}
	if !j.sentAny {
		j.sentAny = true
		j.log.Info("first request sent", "sample", batch[0], "since_start", time.Since(j.started).Round(time.Millisecond))
	}
	for i, s := range batch {
		// The number is picked here; the sender records it durably before the request
		// leaves (send), sharing fsyncs with the other senders and the movers. A run
		// killed in between never sent that rid, so the next run may pick it again.
		attempt := checkpoint.NextAttempt(int(j.ledger.attempt[s]), j.attemptBase)
		rid := shm.RID{Sample: s, Attempt: attempt}
		j.ledger.attempt[s] = uint32(attempt)
		j.ledger.set(s, checkpoint.StateInflight, 0, 0)
		rep := to[i]
		j.inflight[s] = &flight{sample: s, attempt: attempt, rid: rid.String(), replica: rep.n, tokens: int64(j.ds.Tokens(s)), expected: j.expectedBytes(s)}
		j.workers.start("sender", func(ctx context.Context) error {
			j.send(ctx, rep.client, s, rid)
			return nil
		})
	}
	return nil
}

func (j *job) setPausedMetrics() {
	for _, r := range pauseReasons {
		v := 0.0
		for _, p := range j.admission.paused {
			if len(p) >= len(r) && p[:len(r)] == r {
				v = 1
			}
		}
		j.metrics.paused.WithLabelValues(r).Set(v)
	}
}

func (j *job) send(ctx context.Context, client *sglang.Client, sample int, rid shm.RID) {
	// The attempt is durable before the request leaves, so a dump can always be matched
	// to the attempt the index knows, whatever crashes when.
	err := j.ix.RecordAttempt(sample, rid.Attempt)
	if err != nil {
		err = &indexError{fmt.Errorf("record attempt %s: %w", rid, err)}
	}
	var s Sample
	if err == nil {
		s, err = j.ds.Sample(sample)
	}
	if err == nil {
		_, err = client.Generate(ctx, sglang.GenerateRequest{RID: rid.String(), InputIDs: s.InputIDs, Text: s.Text, MaxNewTokens: j.cfg.Server.MaxNewTokens})
	}
	select {
	case j.sent <- sendResult{sample: sample, attempt: rid.Attempt, err: err}:
	case <-ctx.Done():
	}
}

func (j *job) onSent(r sendResult) error {
	if errors.Is(r.err, ErrBadDataset) {
		return r.err // the dataset changed under the run: nothing more it says can be trusted
	}
	if _, ok := errors.AsType[*indexError](r.err); ok {
		return r.err // the index cannot record attempts: nothing can be sent safely
	}
	f := j.inflight[r.sample]
	if f == nil || f.attempt != r.attempt || f.moving {
		return nil // already done, or superseded, or its dump is being moved
	}
	if r.err != nil {
		if j.draining {
			delete(j.inflight, r.sample)
			return nil
		}
		j.log.Warn("request failed", "sample", r.sample, "rid", f.rid, "err", r.err)
		j.requeue(r.sample, "request failed: "+r.err.Error())
		return nil
	}
	f.answered = time.Now()
	return nil
}

// onDump routes a dump: the current attempt of an unfinished sample goes to a mover;
// anything else is rejected (invariant 4).
func (j *job) onDump(d shm.Dump) {
	v, why := route(d, &j.ledger, j.moving[d.Path])
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
	j.moving[d.Path] = true
	j.moveQueue = append(j.moveQueue, moveJob{dump: d, expected: f.expected})
}

// moverLoop moves dumps and commits them: file durable, then index, then the staging
// file removed (invariant 1).
func (j *job) moverLoop(ctx context.Context) error {
	defer func() {
		if j.movers.Add(-1) == 0 {
			close(j.moversDone)
		}
	}()
	for {
		var mj moveJob
		select {
		case <-ctx.Done():
			return nil // an early end of the run: moveJobs is never closed
		case next, ok := <-j.moveJobs:
			if !ok {
				return nil
			}
			mj = next
		}
		start := time.Now()
		moved, err := j.moveOne(ctx, mj.dump)
		select {
		case j.moved <- moveResult{dump: mj.dump, moved: moved, took: time.Since(start), err: err}:
		case <-ctx.Done():
		}
	}
}

// indexError is a failure to commit to the index (state_dir), not to write the output.
type indexError struct{ err error }

func (e *indexError) Error() string { return e.err.Error() }
func (e *indexError) Unwrap() error { return e.err }

func (j *job) moveOne(ctx context.Context, d shm.Dump) (checkpoint.Moved, error) {
	if ctx.Err() != nil {
		return checkpoint.Moved{}, ctx.Err()
	}
	s, err := j.ds.Sample(d.RID.Sample)
	if err != nil {
		return checkpoint.Moved{}, err
	}
	src, err := shm.OpenDump(d.Path)
	if err != nil {
		return checkpoint.Moved{}, err
	}
	defer src.Close()
	moved, err := j.mover.Move(ctx, src, d.Path, checkpoint.Expect{
		Sample: s.Index, RID: d.RID.String(), InputIDs: s.InputIDs, LossMask: s.LossMask,
		DatasetFingerprint: j.ds.Fingerprint, ConfigFingerprint: j.cfg.Fingerprint(),
		HiddenSize: j.cfg.HiddenSize(), Layers: j.cfg.LayersString(), Model: j.cfg.ServedModel(),
	})
	if err != nil {
		return moved, err
	}
	err = j.ix.CommitDone(checkpoint.Record{
		Sample: s.Index, State: checkpoint.StateDone, Attempt: d.RID.Attempt, RID: d.RID.String(),
		Bytes: moved.Bytes, CRC32C: moved.CRC32C, Tokens: moved.Tokens, Updated: time.Now().UTC(),
	})
	if err != nil {
		return moved, &indexError{fmt.Errorf("index sample %d: %w", s.Index, err)}
	}
	if err := os.Remove(d.Path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		j.log.Warn("remove moved dump", "file", d.Path, "err", err)
	}
	return moved, nil
}

// finishMoves lets the moves under way finish (each saves a resend) and settles their
// results; queued ones stay in staging for the next run to adopt.
func (j *job) finishMoves() {
	close(j.moveJobs)
	for {
		select {
		case r := <-j.moved:
			j.onMoved(r)
		case <-j.moversDone:
			for {
				select {
				case r := <-j.moved:
					j.onMoved(r)
				default:
					return
				}
			}
		}
	}
}

func (j *job) onMoved(r moveResult) error {
	s := r.dump.RID.Sample
	f := j.inflight[s]
	var dumpErr *checkpoint.DumpError
	switch {
	case r.err == nil:
		delete(j.moving, r.dump.Path)
		j.storeErrors, j.storeFailing = 0, ""
		if !j.ledger.done(s) {
			j.ledger.set(s, checkpoint.StateDone, r.moved.Bytes, r.moved.Tokens)
			// Charge what was reserved (block rounding included) until the next measurement.
			used := r.moved.Bytes
			if f != nil {
				used = max(used, f.expected)
			}
			j.budgets.diskFree -= used
		}
		delete(j.inflight, s)
		j.metrics.moveSeconds.Observe(r.took.Seconds())
		if f != nil && f.replica >= 0 {
			if rep := j.replicas[f.replica]; r.moved.HookVersion != rep.status.HookVersion {
				j.log.Info("server dump hook", "replica", rep.n, "hook_version", r.moved.HookVersion, "protocol", r.moved.Protocol, "layers", r.moved.Layers)
				rep.status.HookVersion = r.moved.HookVersion
			}
		}
		return nil
	case errors.Is(r.err, ErrBadDataset):
		return r.err
	case errors.Is(r.err, context.Canceled):
		return nil // stopping; the dump stays in staging for the next run
	}
	delete(j.moving, r.dump.Path)
	if f != nil {
		f.moving = false
	}
	switch {
	case errors.Is(r.err, shm.ErrNotRegular):
		// Swapped for a FIFO or a symlink after it was seen: not ours to read or delete.
		j.reject("not_regular")
		j.log.Warn("dump rejected", "file", r.dump.Path, "reason", "not_regular", "err", r.err)
	case errors.Is(r.err, fs.ErrNotExist):
		j.log.Warn("dump vanished from staging before it was moved", "file", r.dump.Path)
	case errors.As(r.err, &dumpErr):
		j.reject("malformed")
		j.log.Error("dump rejected", "sample", s, "rid", r.dump.RID.String(), "err", r.err)
		j.quarantine.hold(r.dump.Path)
	default:
		return j.storeFailed(r, f)
	}
	if f != nil && !j.draining {
		j.requeue(s, r.err.Error())
	}
	return nil
}

// storeFailed handles a good dump that could not be stored (disk full, I/O error): it
// stays in staging and is tried again, while admission pauses (invariant 5).
func (j *job) storeFailed(r moveResult, f *flight) error {
	j.storeErrors++
	where, dir := "output disk", j.cfg.OutputDir
	if _, ok := errors.AsType[*indexError](r.err); ok {
		where, dir = "state disk", j.cfg.StateDir
	}
	j.storeFailing = fmt.Sprintf("%s (%s): %v", where, dir, r.err)
	if errors.Is(r.err, syscall.ENOSPC) {
		j.storeFailing = fmt.Sprintf("%s full (%s)", where, dir)
	}
	j.log.Warn("could not store dump; keeping it in staging and retrying", "sample", r.dump.RID.Sample, "file", r.dump.Path, "err", r.err, "consecutive", j.storeErrors)
	if !errors.Is(r.err, syscall.ENOSPC) && j.storeErrors > 50 {
		return fmt.Errorf("%w: storing dumps keeps failing (%d in a row), last: %v", ErrTemporary, j.storeErrors, r.err)
	}
	if f != nil {
		f.moving = true
	}
	j.moving[r.dump.Path] = true
	expected := j.expectedBytes(r.dump.RID.Sample)
	j.stores = append(j.stores, storeRetry{job: moveJob{dump: r.dump, expected: expected}, due: time.Now().Add(storeRetryDelay)})
	return nil
}

// retryStores queues the dumps whose store failed once their wait is over.
func (j *job) retryStores() {
	now := time.Now()
	kept := j.stores[:0]
	for _, s := range j.stores {
		if s.due.After(now) {
			kept = append(kept, s)
			continue
		}
		j.moveQueue = append(j.moveQueue, s.job)
	}
	j.stores = kept
}

// requeue gives up on a sample's current attempt: it is sent again with a new rid after a
// backoff, or marked failed once it has failed max_attempts times in this run.
func (j *job) requeue(sample int, reason string) {
	delete(j.inflight, sample)
	final, n := j.admission.fail(sample, j.cfg.Run.MaxAttempts, time.Now())
	if !final {
		return
	}
	if err := j.ix.MarkFailed(sample, int(j.ledger.attempt[sample]), reason); err != nil {
		j.log.Error("mark failed", "sample", sample, "err", err)
		return
	}
	j.ledger.set(sample, checkpoint.StateFailed, 0, 0)
	j.log.Error("sample failed", "sample", sample, "attempts", n, "reason", reason)
}

// checkTimeouts re-sends samples whose request was answered but whose dump never came.
func (j *job) checkTimeouts() {
	now := time.Now()
	for s, f := range j.inflight {
		if f.moving || f.answered.IsZero() || now.Sub(f.answered) < j.cfg.Run.DumpTimeout {
			continue
		}
		j.reject("dump_timeout")
		j.log.Warn("no dump arrived; sending again", "sample", s, "rid", f.rid, "waited", now.Sub(f.answered).Round(time.Second))
		j.requeue(s, "dump never arrived")
	}
}
