package orchestrator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/extract-dev/extract/checkpoint"
	"github.com/extract-dev/extract/configs"
	"github.com/extract-dev/extract/internal/atomicfile"
	"github.com/extract-dev/extract/sglang"
	"github.com/extract-dev/extract/shm"
)

// job is one run's state. Its fields are owned by the coordinator goroutine (loop);
// senders and movers talk to it only through channels.
type job struct {
	cfg   *configs.Config
	opt   RunOptions
	log   *slog.Logger
	ds    *Dataset
	ix    *checkpoint.Index
	mover *checkpoint.Mover
	mgr   *sglang.Manager

	prog     *checkpoint.Progress
	inflight map[int]*flight
	moving   map[string]bool // dump paths handed to a mover
	queue    []int           // never-sent samples, ascending
	retries  []retry         // samples to send again, by due time
	failures map[int]int     // failed attempts per sample in this run

	counters     checkpoint.Counters
	rejected     map[string]int64
	paused       []string
	shmBudget    int64
	shmUsage     shm.Usage
	diskFree     int64
	moveErrors   int // consecutive failures to store a dump
	lastMoveErr  string
	server       ServerStatus
	restartTimes []time.Time
	draining     bool
	sentAny      bool
	started      time.Time
	work         context.Context // senders' and movers' context: outlives a graceful stop's signal

	dumps     chan shm.Dump
	sent      chan sendResult
	moved     chan moveResult
	moveJobs  chan moveJob
	moveQueue []moveJob // routed dumps waiting for a free mover; the coordinator never blocks on movers
	health    chan error
	unhealthy int // consecutive failed health probes

	rates   rateTracker
	watcher *shm.Watcher
	gpus    atomic.Pointer[[]GPUStatus] // written by sampleGPUs
	metrics *metrics
	status  *statusServer
	client  *sglang.Client
}

type flight struct {
	sample   int
	attempt  int
	rid      string
	expected int64 // dump bytes we expect, reserved against the budgets
	answered time.Time
	moving   bool
}

type retry struct {
	sample int
	due    time.Time
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

// tick paces admission re-checks, timeouts and status snapshots.
const tick = 250 * time.Millisecond

func newJob(cfg *configs.Config, opt RunOptions, ds *Dataset, ix *checkpoint.Index, started time.Time) (*job, error) {
	prog, err := ix.Load(ds.Len())
	if err != nil {
		return nil, err
	}
	c, err := ix.Counters()
	if err != nil {
		return nil, err
	}
	j := &job{
		cfg: cfg, opt: opt, log: opt.Log, ds: ds, ix: ix,
		mover:    &checkpoint.Mover{OutputDir: cfg.OutputDir},
		prog:     prog,
		inflight: map[int]*flight{},
		moving:   map[string]bool{},
		failures: map[int]int{},
		counters: c,
		rejected: map[string]int64{},
		metrics:  newMetrics(),
		dumps:    make(chan shm.Dump, 64),
		sent:     make(chan sendResult, cfg.Run.MaxInflight),
		moved:    make(chan moveResult, cfg.Run.MaxInflight+cfg.Run.Movers),
		moveJobs: make(chan moveJob),
		health:   make(chan error, 1),
		started:  started,
	}
	for i, s := range prog.State {
		if s != checkpoint.StateDone {
			j.queue = append(j.queue, i)
		}
	}
	spec := launchSpec(cfg, opt.Executable)
	j.mgr = &sglang.Manager{StateDir: cfg.StateDir, Spec: spec, StartupTimeout: cfg.Server.StartupTimeout, Log: j.log}
	j.client = sglang.NewClient(spec.BaseURL(), sglang.ClientOptions{RetryMax: cfg.Run.RequestRetries, AttemptTimeout: cfg.Run.RequestTimeout, Logger: j.log})
	return j, nil
}

func launchSpec(cfg *configs.Config, exe string) sglang.LaunchSpec {
	s := cfg.Server
	model := s.ModelPath
	if s.Kind == "simulator" && model == "" {
		model = "simulator"
	}
	return sglang.LaunchSpec{
		Kind: s.Kind, Host: s.Host, Port: s.Port,
		ModelPath: model, TPSize: s.TPSize, GPUs: s.GPUs, MemFraction: s.MemFraction,
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
		},
	}
}

// run drives the job. ctx is the operator's: its cancellation starts a graceful stop.
func (j *job) run(ctx context.Context) (Result, error) {
	res := Result{OutputDir: j.cfg.OutputDir, Total: j.ds.Len()}

	if j.counters.Done == j.ds.Len() {
		j.log.Info("job already complete", "samples", j.counters.Done, "output_dir", j.cfg.OutputDir)
		j.stopServer()
		res.Outcome, res.Done, res.Bytes = AlreadyComplete, j.counters.Done, j.counters.BytesWritten
		return res, nil
	}

	status, err := startStatusServer(j.cfg.Status.Listen, j.metrics)
	if err != nil {
		return res, fmt.Errorf("%w: %v", ErrRefused, err)
	}
	j.status = status
	defer status.close()
	ri, _ := json.Marshal(runInfo{PID: os.Getpid(), StatusAddr: status.addr, StartedAt: j.started.UTC()})
	if err := atomicfile.WriteFile(runInfoPath(j.cfg.StateDir), ri, 0o644); err != nil {
		return res, err
	}
	j.log.Info("status endpoint", "addr", "http://"+status.addr+"/status")

	if err := j.measure(); err != nil {
		return res, err
	}

	// Watch before anything can write a dump; the watcher's first scan adopts leftovers.
	w, err := shm.NewWatcher(j.cfg.ShmDir, j.log)
	if err != nil {
		return res, err
	}
	defer w.Close()
	j.watcher = w
	// work lives until the coordinator is done with senders and movers, past ctx.
	work, stopWork := context.WithCancel(context.Background())
	defer stopWork()
	j.work = work
	go w.Run(work, j.dumps)
	done := make(chan struct{})
	for i := 0; i < j.cfg.Run.Movers; i++ {
		go j.moverLoop(work, done)
	}

	j.server.State = "starting"
	j.publish()
	if err := j.startServer(ctx, false); err != nil {
		return res, err
	}

	go j.probeHealth(work)
	if j.cfg.Server.Kind == sglang.KindSGLang {
		go sampleGPUs(work, sglang.NewGPUInspector(nil), j.cfg.GPUIndices(), 10*time.Second, &j.gpus, j.log)
	}
	loopErr := j.loop(ctx)
	// Moves under way finish (each saves a resend); queued ones stay in shm for the next
	// run to adopt.
	close(j.moveJobs)
	for i := 0; i < j.cfg.Run.Movers; i++ {
		<-done
	}
	stopWork()
	j.drainResults()
	j.publish()
	j.writeProgress()

	res.Done, res.Failed, res.Bytes = j.counters.Done, j.counters.Failed, j.counters.BytesWritten
	if errors.Is(loopErr, ErrTemporary) {
		// The server is gone or unhealthy; nothing of ours to keep alive.
		return res, loopErr
	}
	j.stopServer()
	if loopErr != nil {
		return res, loopErr
	}
	if ctx.Err() != nil {
		res.Outcome = Stopped
		return res, nil
	}
	if j.counters.Failed > 0 {
		return res, fmt.Errorf("%d samples failed after %d attempts each (see the log for why); `extract run --resume` retries them", j.counters.Failed, j.cfg.Run.MaxAttempts)
	}
	res.Outcome = Finished
	return res, nil
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
		return fmt.Errorf("%w: start server: %v", ErrTemporary, err)
	}
	j.server = ServerStatus{State: "ready", PID: srv.PID, Adopted: srv.Adopted, Restarts: j.server.Restarts, HookVersion: j.server.HookVersion}
	j.unhealthy = 0
	if !srv.Adopted {
		j.removePartials()
	}
	hook, ok := sglang.ServerHook(j.cfg.ShmDir, srv.PGID)
	if !ok {
		j.mgr.Stop(context.Background(), 30*time.Second)
		return fmt.Errorf("%w: server pid %d is up but its dump hook is not armed (no .hook-<pid>.json marker of its process group in %s); no dumps would come: see %s", ErrPreflight, srv.PID, j.cfg.ShmDir, j.mgr.LogPath())
	}
	if hook.Protocol != "1" {
		j.mgr.Stop(context.Background(), 30*time.Second)
		return fmt.Errorf("%w: server pid %d runs dump hook %s speaking protocol %q; this extract reads protocol 1", ErrPreflight, srv.PID, hook.HookVersion, hook.Protocol)
	}
	j.server.HookVersion = hook.HookVersion
	info, err := j.client.ServerInfo(ctx)
	if err != nil {
		return fmt.Errorf("%w: server info: %v", ErrTemporary, err)
	}
	if err := info.CheckCapture(j.mgr.Spec); err != nil {
		j.mgr.Stop(context.Background(), 30*time.Second)
		return fmt.Errorf("%w: server %s is not set up for capture: %v", ErrRefused, j.mgr.Spec.BaseURL(), err)
	}
	j.log.Info("server ready", "pid", srv.PID, "adopted", srv.Adopted, "url", j.mgr.Spec.BaseURL(), "restart", restart, "hook_version", hook.HookVersion, "layers", hook.Layers)
	return nil
}

// removePartials drops half-written dumps of a server that is no longer running; a
// freshly launched server never finishes them.
func (j *job) removePartials() {
	entries, _ := os.ReadDir(j.cfg.ShmDir)
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), shm.PartialSuffix) {
			os.Remove(filepath.Join(j.cfg.ShmDir, e.Name()))
		}
	}
}

func (j *job) stopServer() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := j.mgr.Stop(ctx, 30*time.Second); err != nil {
		j.log.Warn("stopping server", "err", err)
	}
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
		if len(j.inflight) == 0 && len(j.queue) == 0 && len(j.retries) == 0 {
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
			ctx = context.Background() // a restart during the drain must not see the signal
			j.log.Info("stopping: no new samples; draining in-flight ones", "inflight", len(j.inflight), "timeout", j.cfg.Run.DrainTimeout)
		case sendMove <- nextMove:
			j.moveQueue = j.moveQueue[1:]
		case d := <-j.dumps:
			j.onDump(d)
		case r := <-j.sent:
			j.onSent(r)
		case r := <-j.moved:
			if err := j.onMoved(r); err != nil {
				return err
			}
		case <-j.mgr.Exited():
			if err := j.onServerExit(ctx); err != nil {
				return err
			}
		case err := <-j.health:
			if err := j.onHealth(ctx, err); err != nil {
				return err
			}
		case <-ticker.C:
			if err := j.measure(); err != nil {
				j.log.Warn("measure disk usage", "err", err)
			}
			j.checkTimeouts()
			j.countForeignNames()
			j.publish()
			if time.Since(lastLog) >= 30*time.Second {
				lastLog = time.Now()
				j.logProgress()
				j.writeProgress()
				if err := j.mgr.TrimLog(int64(j.cfg.Server.LogMaxSize)); err != nil {
					j.log.Warn("trim server log", "err", err)
				}
			}
		}
	}
}

// expectedBytes is what a sample will take, in staging and then on the output disk.
func (j *job) expectedBytes(sample int) int64 { return sampleBytes(j.cfg, j.ds.Tokens(sample)) }

// sampleBytes is what admission reserves for a sample of tokens: the output file's size
// (a dump plus the loss mask), plus room for header, page rounding and directory blocks.
func sampleBytes(cfg *configs.Config, tokens int) int64 {
	return int64(tokens)*cfg.OutputBytesPerToken() + 16<<10
}

// admit sends samples while the window and the budgets allow (invariant 5).
func (j *job) admit() error {
	var batch []int
	var reserved int64
	// Every flight counts until its move lands, and a landed move is taken off diskFree
	// at once (onMoved): between two measurements the estimate never runs behind the disk.
	for _, f := range j.inflight {
		reserved += f.expected
	}
	j.paused = j.paused[:0]
	if j.moveErrors > 0 {
		// Storing is failing (a full disk behind our back, an I/O error): admitting more
		// would only pile dumps up in staging.
		j.paused = append(j.paused, "cannot store dumps: "+j.lastMoveErr)
		return nil
	}
	now := time.Now()
	for len(j.inflight)+len(batch) < j.cfg.Run.MaxInflight {
		s, fromRetry := j.next(now)
		if s < 0 {
			break
		}
		want := j.expectedBytes(s)
		alone := len(j.inflight)+len(batch) == 0
		if reason := j.blocked(reserved, want, alone); reason != "" {
			j.paused = append(j.paused, reason)
			break
		}
		j.take(fromRetry)
		batch = append(batch, s)
		reserved += want
	}
	for _, r := range []string{"output disk reserve", "staging budget"} {
		v := 0.0
		for _, p := range j.paused {
			if strings.HasPrefix(p, r) {
				v = 1
			}
		}
		j.metrics.paused.WithLabelValues(r).Set(v)
	}
	if len(batch) == 0 {
		return nil
	}
	// The attempt is durable before the request leaves, so a dump can always be matched
	// to the attempt the index knows, whatever crashes when.
	attempts, err := j.ix.BeginAttempts(batch)
	if err != nil {
		return fmt.Errorf("record attempts: %w", err)
	}
	if !j.sentAny {
		j.sentAny = true
		j.log.Info("first request sent", "sample", batch[0], "since_start", time.Since(j.started).Round(time.Millisecond))
	}
	for i, s := range batch {
		rid := shm.RID{Sample: s, Attempt: attempts[i]}
		j.prog.Attempt[s] = uint32(attempts[i])
		j.prog.State[s] = checkpoint.StateInflight
		j.inflight[s] = &flight{sample: s, attempt: attempts[i], rid: rid.String(), expected: j.expectedBytes(s)}
		go j.send(j.work, s, rid)
	}
	return nil
}

// next peeks at the sample to send next: a due retry first, then the queue.
func (j *job) next(now time.Time) (int, bool) {
	for len(j.retries) > 0 && !j.retries[0].due.After(now) {
		s := j.retries[0].sample
		if _, busy := j.inflight[s]; busy || j.prog.State[s] == checkpoint.StateDone {
			j.retries = j.retries[1:] // its dump came after all
			continue
		}
		return s, true
	}
	for len(j.queue) > 0 {
		s := j.queue[0]
		if _, busy := j.inflight[s]; busy || j.prog.State[s] == checkpoint.StateDone {
			j.queue = j.queue[1:] // adopted from a leftover dump meanwhile
			continue
		}
		return s, false
	}
	return -1, false
}

func (j *job) take(fromRetry bool) {
	if fromRetry {
		j.retries = j.retries[1:]
	} else {
		j.queue = j.queue[1:]
	}
}

// blocked says why a dump of want bytes cannot be admitted now, or "" when it can. A
// sample that is alone may pass the staging budget, or a dump larger than the budget
// would never run.
func (j *job) blocked(reserved, want int64, alone bool) string {
	reserve := int64(j.cfg.Disk.Reserve)
	if j.diskFree-reserved-want < reserve {
		return fmt.Sprintf("output disk reserve: %s free on %s, %s kept in reserve, %s in flight", configs.ByteSize(j.diskFree), j.cfg.OutputDir, configs.ByteSize(reserve), configs.ByteSize(reserved+want))
	}
	if !alone && j.shmUsage.Bytes+reserved+want > j.shmBudget {
		return fmt.Sprintf("staging budget: %s in %s + %s in flight, budget %s", configs.ByteSize(j.shmUsage.Bytes), j.cfg.ShmDir, configs.ByteSize(reserved), configs.ByteSize(j.shmBudget))
	}
	return ""
}

func (j *job) send(ctx context.Context, sample int, rid shm.RID) {
	s, err := j.ds.Sample(sample)
	if err == nil {
		_, err = j.client.Generate(ctx, sglang.GenerateRequest{RID: rid.String(), InputIDs: s.InputIDs, Text: s.Text, MaxNewTokens: j.cfg.Server.MaxNewTokens})
	}
	j.sent <- sendResult{sample: sample, attempt: rid.Attempt, err: err}
}

func (j *job) onSent(r sendResult) {
	f := j.inflight[r.sample]
	if f == nil || f.attempt != r.attempt || f.moving {
		return // already done, or superseded, or its dump is being moved
	}
	if r.err != nil {
		if j.draining {
			delete(j.inflight, r.sample)
			return
		}
		j.log.Warn("request failed", "sample", r.sample, "rid", f.rid, "err", r.err)
		j.requeue(r.sample, "request failed: "+r.err.Error())
		return
	}
	f.answered = time.Now()
}

// onDump routes a dump: the current attempt of an unfinished sample goes to a mover;
// anything else is rejected and removed (invariant 4).
func (j *job) onDump(d shm.Dump) {
	if j.moving[d.Path] {
		return
	}
	s := d.RID.Sample
	switch {
	case s >= j.ds.Len():
		j.reject(d, "unknown_sample", fmt.Sprintf("sample %d is past the dataset's %d samples", s, j.ds.Len()), true)
		return
	case j.prog.State[s] == checkpoint.StateDone:
		j.reject(d, "duplicate", "sample already done", false)
		return
	case uint32(d.RID.Attempt) != j.prog.Attempt[s]:
		j.reject(d, "stale_attempt", fmt.Sprintf("attempt %d, current is %d", d.RID.Attempt, j.prog.Attempt[s]), false)
		return
	}
	f := j.inflight[s]
	if f == nil {
		// A complete dump of the current attempt left by a crashed run: adopt it (invariant 6).
		f = &flight{sample: s, attempt: d.RID.Attempt, rid: d.RID.String(), expected: j.expectedBytes(s)}
		j.inflight[s] = f
		j.log.Info("adopting leftover dump", "sample", s, "rid", f.rid)
	}
	if f.moving {
		return
	}
	f.moving = true
	j.moving[d.Path] = true
	j.moveQueue = append(j.moveQueue, moveJob{dump: d, expected: f.expected})
}

// reject removes a dump that must not be used; a dump we cannot explain is kept in
// quarantine for a person to look at.
func (j *job) reject(d shm.Dump, reason, detail string, keep bool) {
	j.rejected[reason]++
	j.metrics.rejected.WithLabelValues(reason).Inc()
	if keep {
		j.quarantine(d.Path)
	} else if err := os.Remove(d.Path); err != nil && !os.IsNotExist(err) {
		j.log.Warn("remove rejected dump", "file", d.Path, "err", err)
	}
	j.log.Info("dump rejected", "file", d.Path, "reason", reason, "detail", detail)
}

func (j *job) quarantine(path string) {
	dir := filepath.Join(j.cfg.StateDir, "quarantine")
	dst := filepath.Join(dir, filepath.Base(path))
	err := os.MkdirAll(dir, 0o755)
	if err == nil {
		err = copyFile(path, dst)
	}
	if err != nil {
		j.log.Warn("could not quarantine dump; removing it", "file", path, "err", err)
	} else {
		j.log.Warn("dump quarantined", "file", path, "kept_as", dst)
	}
	os.Remove(path)
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		os.Remove(dst)
		return err
	}
	return out.Close()
}

// moverLoop moves dumps and commits them: file durable, then index, then the staging
// file removed (invariant 1). Many movers share one index commit through bbolt's batch.
func (j *job) moverLoop(ctx context.Context, done chan<- struct{}) {
	defer func() { done <- struct{}{} }()
	for mj := range j.moveJobs {
		start := time.Now()
		moved, err := j.moveOne(ctx, mj.dump)
		j.moved <- moveResult{dump: mj.dump, moved: moved, took: time.Since(start), err: err}
	}
}

func (j *job) moveOne(ctx context.Context, d shm.Dump) (checkpoint.Moved, error) {
	if ctx.Err() != nil {
		return checkpoint.Moved{}, ctx.Err()
	}
	s, err := j.ds.Sample(d.RID.Sample)
	if err != nil {
		return checkpoint.Moved{}, err
	}
	// TODO(lead): open with lstat + O_NOFOLLOW|O_NONBLOCK + fstat (issue 8).
	src, err := os.Open(d.Path)
	if err != nil {
		return checkpoint.Moved{}, fmt.Errorf("sample %d: open dump: %w", s.Index, err)
	}
	moved, err := j.mover.Move(ctx, src, d.Path, checkpoint.Expect{
		Sample: s.Index, RID: d.RID.String(), InputIDs: s.InputIDs, LossMask: s.LossMask,
		DatasetFingerprint: j.ds.Fingerprint, HiddenSize: j.cfg.HiddenSize(),
		Layers: layersString(j.mgr.Spec.Layers), Model: j.mgr.Spec.ModelPath, ConfigFingerprint: j.cfg.Fingerprint(),
	})
	_ = src.Close()
	if err != nil {
		return moved, err
	}
	err = j.ix.CommitDone(checkpoint.Record{
		Sample: s.Index, State: checkpoint.StateDone, Attempt: d.RID.Attempt, RID: d.RID.String(),
		Bytes: moved.Bytes, CRC32C: moved.CRC32C, Tokens: moved.Tokens, Updated: time.Now().UTC(),
	})
	if err != nil {
		return moved, fmt.Errorf("index sample %d: %w", s.Index, err)
	}
	if err := os.Remove(d.Path); err != nil && !os.IsNotExist(err) {
		j.log.Warn("remove moved dump", "file", d.Path, "err", err)
	}
	return moved, nil
}

// drainResults settles the results that arrived after the loop ended.
func (j *job) drainResults() {
	for {
		select {
		case r := <-j.moved:
			j.onMoved(r)
		default:
			return
		}
	}
}

func (j *job) onMoved(r moveResult) error {
	delete(j.moving, r.dump.Path)
	s := r.dump.RID.Sample
	f := j.inflight[s]
	if f != nil {
		f.moving = false
	}
	var dumpErr *checkpoint.DumpError
	switch {
	case r.err == nil:
		j.moveErrors = 0
		if j.prog.State[s] != checkpoint.StateDone {
			j.prog.State[s] = checkpoint.StateDone
			j.counters.Done++
			j.counters.BytesWritten += r.moved.Bytes
			j.counters.Tokens += int64(r.moved.Tokens)
			// Charge what was reserved (block rounding included) until the next measurement.
			used := r.moved.Bytes
			if f != nil {
				used = max(used, f.expected)
			}
			j.diskFree -= used
		}
		delete(j.inflight, s)
		j.metrics.moveSeconds.Observe(r.took.Seconds())
		if r.moved.HookVersion != j.server.HookVersion {
			j.log.Info("server dump hook", "hook_version", r.moved.HookVersion, "protocol", r.moved.Protocol, "layers", r.moved.Layers)
			j.server.HookVersion = r.moved.HookVersion
		}
		return nil
	case errors.As(r.err, &dumpErr):
		j.rejected["malformed"]++
		j.metrics.rejected.WithLabelValues("malformed").Inc()
		j.log.Error("dump rejected", "sample", s, "rid", r.dump.RID.String(), "err", r.err)
		j.quarantine(r.dump.Path)
		if f != nil && !j.draining {
			j.requeue(s, r.err.Error())
		}
		return nil
	case errors.Is(r.err, context.Canceled):
		return nil // stopping; the dump stays in shm for the next run
	default:
		// The dump is fine but we could not store it (disk full, I/O error): keep it in
		// shm and try again; admission pauses meanwhile because the disk check sees it.
		j.moveErrors++
		j.lastMoveErr = r.err.Error()
		if errors.Is(r.err, syscall.ENOSPC) {
			j.lastMoveErr = "output disk full (" + j.cfg.OutputDir + ")"
		}
		j.log.Warn("could not store dump; keeping it in staging and retrying", "sample", s, "file", r.dump.Path, "err", r.err, "consecutive", j.moveErrors)
		if !errors.Is(r.err, syscall.ENOSPC) && j.moveErrors > 50 {
			return fmt.Errorf("%w: storing dumps keeps failing (%d in a row), last: %v", ErrTemporary, j.moveErrors, r.err)
		}
		go func(d shm.Dump) {
			select {
			case <-time.After(2 * time.Second):
				select {
				case j.dumps <- d:
				case <-j.work.Done():
				}
			case <-j.work.Done():
			}
		}(r.dump)
		return nil
	}
}

// requeue gives up on a sample's current attempt: it is sent again with a new rid after a
// backoff, or marked failed once it has failed max_attempts times in this run.
func (j *job) requeue(sample int, reason string) {
	delete(j.inflight, sample)
	j.failures[sample]++
	n := j.failures[sample]
	if n >= j.cfg.Run.MaxAttempts {
		if err := j.ix.MarkFailed(sample, int(j.prog.Attempt[sample]), reason); err != nil {
			j.log.Error("mark failed", "sample", sample, "err", err)
		}
		j.prog.State[sample] = checkpoint.StateFailed
		j.counters.Failed++
		j.log.Error("sample failed", "sample", sample, "attempts", n, "reason", reason)
		return
	}
	backoff := time.Second << min(n-1, 5)
	j.retries = append(j.retries, retry{sample: sample, due: time.Now().Add(backoff)})
	sort.Slice(j.retries, func(a, b int) bool { return j.retries[a].due.Before(j.retries[b].due) })
}

// checkTimeouts re-sends samples whose request was answered but whose dump never came.
func (j *job) checkTimeouts() {
	now := time.Now()
	for s, f := range j.inflight {
		if f.moving || f.answered.IsZero() || now.Sub(f.answered) < j.cfg.Run.DumpTimeout {
			continue
		}
		j.rejected["dump_timeout"]++
		j.metrics.rejected.WithLabelValues("dump_timeout").Inc()
		j.log.Warn("no dump arrived; sending again", "sample", s, "rid", f.rid, "waited", now.Sub(f.answered).Round(time.Second))
		j.requeue(s, "dump never arrived")
	}
}

// probeHealth asks /health_generate every health_interval; the coordinator judges.
func (j *job) probeHealth(ctx context.Context) {
	t := time.NewTicker(j.cfg.Server.HealthInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		pctx, cancel := context.WithTimeout(ctx, j.cfg.Server.HealthTimeout)
		err := j.client.HealthGenerate(pctx)
		cancel()
		if ctx.Err() != nil {
			return
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
	j.rejected["server_hang"]++
	stopCtx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := j.mgr.Stop(stopCtx, 5*time.Second); err != nil {
		return fmt.Errorf("%w: kill hung server: %v", ErrTemporary, err)
	}
	return j.onServerExit(ctx)
}

// onServerExit requeues what the dead server held and starts a new one, within a budget.
func (j *job) onServerExit(ctx context.Context) error {
	j.log.Error("server exited", "pid", j.server.PID)
	for s, f := range j.inflight {
		if !f.moving {
			delete(j.inflight, s)
			j.retries = append(j.retries, retry{sample: s, due: time.Now()})
		}
	}
	if j.draining {
		return nil
	}
	now := time.Now()
	recent := j.restartTimes[:0]
	for _, t := range j.restartTimes {
		if now.Sub(t) < j.cfg.Server.RestartWindow {
			recent = append(recent, t)
		}
	}
	j.restartTimes = append(recent, now)
	if len(j.restartTimes) > j.cfg.Server.MaxRestarts {
		return fmt.Errorf("%w: server died or hung %d times within %s (server.max_restarts %d); see %s", ErrTemporary, len(j.restartTimes), j.cfg.Server.RestartWindow, j.cfg.Server.MaxRestarts, j.mgr.LogPath())
	}
	j.server.Restarts++
	j.server.State = "restarting"
	j.metrics.restarts.Inc()
	j.publish()
	backoff := time.Second << (len(j.restartTimes) - 1)
	select {
	case <-ctx.Done():
		return nil
	case <-time.After(backoff):
	}
	return j.startServer(ctx, true)
}

// countForeignNames reports files in the staging dir that are not dumps: never opened,
// but a person should know something else writes there.
func (j *job) countForeignNames() {
	if d := j.watcher.Ignored() - j.rejected["foreign_name"]; d > 0 {
		j.rejected["foreign_name"] += d
		j.metrics.rejected.WithLabelValues("foreign_name").Add(float64(d))
	}
}

// measure refreshes the disk and staging usage that admission checks.
func (j *job) measure() error {
	fs, err := shm.StatFS(j.cfg.OutputDir)
	if err != nil {
		return err
	}
	j.diskFree = fs.Free
	u, err := shm.Measure(j.cfg.ShmDir)
	if err != nil {
		if !os.IsNotExist(errors.Unwrap(err)) {
			return err
		}
		if err := os.MkdirAll(j.cfg.ShmDir, 0o755); err != nil {
			return fmt.Errorf("create staging dir %s: %w", j.cfg.ShmDir, err)
		}
	}
	j.shmUsage = u
	j.shmBudget = int64(j.cfg.ShmBudget)
	if j.shmBudget == 0 {
		j.shmBudget = u.Total / 2
	}
	j.metrics.shmBytes.Set(float64(u.Bytes))
	j.metrics.diskFree.Set(float64(fs.Free))
	return nil
}

// publish refreshes the live status and metrics.
func (j *job) publish() {
	j.rates.add(ratePoint{at: time.Now(), samples: int64(j.counters.Done), tokens: j.counters.Tokens, byts: j.counters.BytesWritten})
	st := j.snapshot()
	if j.status != nil {
		j.status.set(st)
	}
	m := j.metrics
	m.total.Set(float64(st.Total))
	m.done.Set(float64(st.Done))
	m.failed.Set(float64(st.Failed))
	m.inflight.Set(float64(st.Inflight))
	m.bytesWritten.Set(float64(st.BytesWritten))
	if j.opt.OnStatus != nil {
		j.opt.OnStatus(st)
	}
}

func (j *job) snapshot() Status {
	now := time.Now()
	sps, tps, bps := j.rates.rates()
	total := j.ds.Len()
	remaining := total - j.counters.Done - j.counters.Failed
	eta := -1.0
	if remaining == 0 {
		eta = 0
	} else if sps > 0 {
		eta = float64(remaining) / sps
	}
	rejected := make(map[string]int64, len(j.rejected))
	for k, v := range j.rejected {
		rejected[k] = v
	}
	started := j.started.UTC()
	var gpus []GPUStatus
	if p := j.gpus.Load(); p != nil {
		gpus = *p
	}
	state := "running"
	if remaining == 0 && j.counters.Failed == 0 {
		state = "complete"
	}
	return Status{
		State: state, Source: "live", PID: os.Getpid(),
		Total: total, Done: j.counters.Done, Failed: j.counters.Failed, Pending: remaining,
		Inflight: len(j.inflight), BytesWritten: j.counters.BytesWritten,
		SamplesPerSecond: sps, TokensPerSecond: tps, BytesPerSecond: bps, ETASeconds: eta,
		Paused: append([]string{}, j.paused...), Server: j.server, Rejected: rejected, GPUs: gpus,
		Dataset: j.ds.Path, OutputDir: j.cfg.OutputDir, StartedAt: &started, UpdatedAt: now.UTC(),
	}
}

func (j *job) logProgress() {
	st := j.snapshot()
	j.log.Info("progress", "done", st.Done, "total", st.Total, "failed", st.Failed, "inflight", st.Inflight,
		"samples_per_second", fmt.Sprintf("%.2f", st.SamplesPerSecond), "bytes_written", st.BytesWritten,
		"eta", time.Duration(st.ETASeconds*float64(time.Second)).Round(time.Second), "paused", strings.Join(st.Paused, "; "))
}

// writeProgress leaves a snapshot in state_dir for `extract status` while the live
// endpoint is not answering.
func (j *job) writeProgress() {
	b, err := json.MarshalIndent(j.snapshot(), "", "  ")
	if err == nil {
		err = atomicfile.WriteFile(progressPath(j.cfg.StateDir), b, 0o644)
	}
	if err != nil {
		j.log.Warn("write progress snapshot", "err", err)
	}
}

// layersString is layers_to_capture as dump metadata spells it: "2,30,58".
func layersString(ids []int) string {
	parts := make([]string, len(ids))
	for i, id := range ids {
		parts[i] = strconv.Itoa(id)
	}
	return strings.Join(parts, ",")
}
