package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/fsnotify/fsnotify"

	"github.com/extract-dev/extract/sglang"
	"github.com/extract-dev/extract/shm"
)

// startSimulator launches `extract simulate` as the job would and waits until it answers.
func startSimulator(extract, shmDir string, port, hidden int, tps float64) (*proc, error) {
	p, err := start(extract, "simulate", "--host", "127.0.0.1", "--port", strconv.Itoa(port),
		"--shm-dir", shmDir, "--model", "simulator", "--hidden-size", strconv.Itoa(hidden),
		"--num-layers", "61", "--layers", "2,30,58", "--tokens-per-second", strconv.FormatFloat(tps, 'g', -1, 64))
	if err != nil {
		return nil, err
	}
	url := fmt.Sprintf("http://127.0.0.1:%d/health_generate", port)
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if resp, err := http.Get(url); err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return p, nil
			}
		}
		select {
		case <-p.exited:
			return nil, fmt.Errorf("simulator exited: %v\n%s", p.err, p.tail(10))
		case <-time.After(10 * time.Millisecond):
		}
	}
	_ = p.cmd.Process.Kill()
	return nil, fmt.Errorf("simulator on port %d not ready in 20s", port)
}

// simAlone drives the simulator the way the job does (same client, same window) with
// nobody reading its dumps, and returns the time from the first request to the last answer.
// With copyDir set, each dump is copied there as soon as its request is answered and then
// deleted, and the time includes a final sync: the least any mover could do (no checks,
// no checksum, no per-file fsync, no index), on the same CPUs as the simulator.
// The first duration is to the last answer, the second to the end (the sync).
//
// copyFn is how each dump is copied (plainCopy, or copyDurable: the least a crash-safe
// copier does per file); nil means plainCopy.
func simAlone(extract, shmDir string, hidden int, tps float64, n int, plan tokenPlan, inflight int, copyDir string, copyFn func(src, dst string) error) (time.Duration, time.Duration, error) {
	if copyFn == nil {
		copyFn = plainCopy
	}
	if err := os.MkdirAll(shmDir, 0o755); err != nil {
		return 0, 0, err
	}
	port, err := freePort()
	if err != nil {
		return 0, 0, err
	}
	sim, err := startSimulator(extract, shmDir, port, hidden, tps)
	if err != nil {
		return 0, 0, err
	}
	defer func() {
		_ = sim.cmd.Process.Signal(syscall.SIGTERM)
		_ = sim.wait(30 * time.Second)
	}()
	client := sglang.NewClient(fmt.Sprintf("http://127.0.0.1:%d", port), sglang.ClientOptions{RetryMax: 1, AttemptTimeout: 5 * time.Minute})
	samples := make([][]int64, n)
	for s := range n {
		samples[s] = sampleIDs(s, plan(s))
	}
	var g errgroup.Group
	g.SetLimit(inflight)
	var mu sync.Mutex
	var lastAnswer time.Time
	start := time.Now()
	for s := range n {
		g.Go(func() error {
			rid := shm.RID{Sample: s, Attempt: 1}
			_, err := client.Generate(context.Background(), sglang.GenerateRequest{RID: rid.String(), InputIDs: samples[s]})
			mu.Lock()
			lastAnswer = time.Now()
			mu.Unlock()
			if err != nil || copyDir == "" {
				return err
			}
			src := filepath.Join(shmDir, rid.FileName())
			if err := copyFn(src, filepath.Join(copyDir, rid.FileName())); err != nil {
				return err
			}
			return os.Remove(src)
		})
	}
	firstErr := g.Wait()
	if copyDir != "" {
		if err := run("sync"); err != nil {
			return 0, 0, err
		}
		return lastAnswer.Sub(start), time.Since(start), firstErr
	}
	took := time.Since(start)
	if firstErr != nil {
		return 0, 0, firstErr
	}
	dumps, err := filepath.Glob(filepath.Join(shmDir, "*"+shm.DumpSuffix))
	if err != nil {
		return 0, 0, err
	}
	if len(dumps) != n {
		return 0, 0, fmt.Errorf("simulator left %d dumps in %s, want %d", len(dumps), shmDir, n)
	}
	return took, took, nil
}

// plainCopy copies src over dst, without fsync: the physical baseline's copy, and the
// index snapshot each measured resume starts from.
func plainCopy(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer func() { logErr("in.Close()", in.Close()) }()
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		_ = out.Close()
		return err
	}
	return out.Close()
}

// dumpClock records when the simulator publishes each dump (the rename of the partial
// to its final name): the time of the last one is when the "GPU" finished its work.
type dumpClock struct {
	w     *fsnotify.Watcher
	mu    sync.Mutex
	n     int
	last  time.Time
	names map[string]bool
	done  chan struct{}
}

func watchDumps(dir string) (*dumpClock, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	w, err := fsnotify.NewBufferedWatcher(4096)
	if err != nil {
		return nil, err
	}
	if err := w.Add(dir); err != nil {
		_ = w.Close()
		return nil, err
	}
	c := &dumpClock{w: w, names: map[string]bool{}, done: make(chan struct{})}
	go func() {
		defer close(c.done)
		for {
			select {
			case ev, ok := <-w.Events:
				if !ok {
					return
				}
				if ev.Has(fsnotify.Create) && strings.HasSuffix(ev.Name, shm.DumpSuffix) {
					c.mu.Lock()
					if !c.names[ev.Name] {
						c.names[ev.Name] = true
						c.n++
						c.last = time.Now()
					}
					c.mu.Unlock()
				}
			case _, ok := <-w.Errors:
				if !ok {
					return
				}
			}
		}
	}()
	return c, nil
}

func (c *dumpClock) stop() (int, time.Time) {
	_ = c.w.Close()
	<-c.done
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n, c.last
}

// jobRun is one `extract run` measured from outside.
type jobRun struct {
	wall       time.Duration // exec to exit
	firstReq   time.Duration // exec to the "first request sent" line
	sinceStart time.Duration // that line's since_start (from the start of Run)
	serverUp   time.Duration // the "server ready" line's startup
	work       time.Duration // first request line to exit
	firstAt    time.Time     // when the first request line arrived
	peakRSS    int64
	stdout     string
	status     []time.Duration // `extract status --json` while running
	statusHTTP []time.Duration // GET /status while running
	statusSrc  string
}

type jobOpts struct {
	args         []string
	config       string
	stateDir     string
	watchRSS     bool
	statusProbes int
	timeout      time.Duration
}

func runJob(extract string, o jobOpts) (*jobRun, error) {
	p, err := start(extract, append([]string{"run", "--config", o.config}, o.args...)...)
	if err != nil {
		return nil, err
	}
	var h *hwm
	if o.watchRSS {
		h = watchHWM(p.cmd.Process.Pid, 5*time.Millisecond)
	}
	r := &jobRun{}
	first, err := p.waitLine(`msg="first request sent"`, o.timeout)
	if err != nil {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		_ = p.wait(time.Minute)
		return nil, err
	}
	r.firstReq = first.at.Sub(p.started)
	r.firstAt = first.at
	r.sinceStart, _ = time.ParseDuration(logField(first.text, "since_start"))
	if l, err := p.waitLine(`msg="server ready" pid=`, time.Second); err == nil {
		r.serverUp, _ = time.ParseDuration(logField(l.text, "startup"))
	}
	var probes sync.WaitGroup
	if o.statusProbes > 0 {
		probes.Add(1)
		go func() {
			defer probes.Done()
			url := ""
			for i := 0; i < o.statusProbes; i++ {
				select {
				case <-p.exited:
					return
				case <-time.After(250 * time.Millisecond):
				}
				d, state, src, err := timedStatus(extract, o.config)
				if err == nil && state == "running" {
					r.status = append(r.status, d)
					r.statusSrc = src
				}
				if url == "" {
					url, _ = liveStatusURL(o.stateDir)
				}
				if url != "" {
					if d, err := timedGet(url); err == nil {
						r.statusHTTP = append(r.statusHTTP, d)
					}
				}
			}
		}()
	}
	werr := p.wait(o.timeout)
	probes.Wait()
	if h != nil {
		r.peakRSS, _ = h.finish()
	}
	if werr != nil {
		return nil, werr
	}
	r.wall = p.ended.Sub(p.started)
	r.work = p.ended.Sub(first.at)
	r.stdout = p.stdout.String()
	return r, nil
}

func cmdE2E(args []string) error {
	var c commonFlags
	fs := flag.NewFlagSet("e2e", flag.ExitOnError)
	c.register(fs)
	n := fs.Int("n", 32, "samples")
	lo := fs.Int("tokens-lo", 256, "fewest tokens in a sample")
	hi := fs.Int("tokens-hi", 2048, "most tokens in a sample")
	hidden := fs.Int("hidden", 7168, "hidden size (the real model's: 57 KiB per token)")
	tps := fs.Float64("tps", 0, "simulator tokens/s (0: full speed)")
	diskFrac := fs.Float64("disk-fraction", 0, "if > 0, set tokens/s so the dumps arrive at this fraction of figure 1's cp + sync rate")
	label := fs.String("label", "full speed", "what this run is")
	inflight := fs.Int("inflight", 32, "run.max_inflight (default 32), also the simulator-alone window")
	movers := fs.Int("movers", 4, "run.movers")
	probes := fs.Int("status-probes", 0, "`extract status` calls while the job runs (figure 5)")
	fig := fs.String("fig", "3", "3: bytes/s against the simulator alone (target 0.95×); 2: samples/s of small dumps (target 500/s)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := c.check(true); err != nil {
		return err
	}
	plan := spreadTokens(*lo, *hi)
	var tokens int64
	for s := range *n {
		tokens += int64(plan(s))
	}
	bytes := tokens * (int64(4**hidden)*2 + 8)
	if *diskFrac > 0 {
		cp, ok := lookup(c.results, "1", "cp + sync (physical path)")
		if !ok {
			cp = 300
		}
		rate := *diskFrac * cp * (1 << 20) // bytes/s
		*tps = float64(int(rate / float64(int64(4**hidden)*2+8)))
		*label = fmt.Sprintf("simulator at %.0f MiB/s (%.0f%% of cp + sync)", rate/(1<<20), *diskFrac*100)
	}
	dir := filepath.Join(c.out, "e2e")
	stage := filepath.Join(c.shm, "e2e")
	defer func() { logErr("os.RemoveAll(stage)", os.RemoveAll(stage)) }()
	defer func() { logErr("settle(dir)", settle(dir)) }()
	ds := filepath.Join(dir, "dataset.jsonl")
	if _, _, err := writeDataset(ds, *n, plan); err != nil {
		return err
	}
	span := fmt.Sprintf("%d–%d tokens", *lo, *hi)
	if *lo == *hi {
		span = fmt.Sprintf("%d tokens", *lo)
	}
	note := fmt.Sprintf("%d samples of %s, H=%d, %.2f GiB", *n, span, *hidden, float64(bytes)/(1<<30))
	fmt.Printf("fig 3 (%s): %s\n", *label, note)

	alone, _, err := simAlone(c.extract, stage, *hidden, *tps, *n, plan, *inflight, "", nil)
	if err != nil {
		return fmt.Errorf("simulator alone: %w", err)
	}
	if err := settle(stage); err != nil {
		return err
	}
	copyDir := filepath.Join(dir, "plain-copy")
	if err := os.MkdirAll(copyDir, 0o755); err != nil {
		return err
	}
	physAnswered, physical, err := simAlone(c.extract, stage, *hidden, *tps, *n, plan, *inflight, copyDir, plainCopy)
	if err != nil {
		return fmt.Errorf("simulator + plain copy: %w", err)
	}
	if err := settle(stage, copyDir); err != nil {
		return err
	}
	// Figure 2's baseline is what any crash-safe mover must do per file (issue 12's
	// target 1): copy, fsync, rename, fsync the directory, with the job's 4 movers' worth
	// of concurrency coming from the window, as the plain copy's does.
	var durable time.Duration
	if *fig == "2" {
		if err := os.MkdirAll(copyDir, 0o755); err != nil {
			return err
		}
		if _, durable, err = simAlone(c.extract, stage, *hidden, *tps, *n, plan, *inflight, copyDir, copyDurable); err != nil {
			return fmt.Errorf("simulator + durable copy: %w", err)
		}
		if err := settle(stage, copyDir); err != nil {
			return err
		}
	}
	port, err := freePort()
	if err != nil {
		return err
	}
	cfg := filepath.Join(dir, "job.yaml")
	out := filepath.Join(dir, "out")
	jc := jobConfig{Dataset: ds, OutputDir: out, ShmDir: stage, Port: port, Hidden: *hidden, TokensPerSecond: *tps, MaxInflight: *inflight, Movers: *movers}
	if err := jc.write(cfg); err != nil {
		return err
	}
	clock, err := watchDumps(stage)
	if err != nil {
		return err
	}
	job, err := runJob(c.extract, jobOpts{config: cfg, stateDir: filepath.Join(out, ".extract"), statusProbes: *probes, timeout: 4 * time.Minute})
	dumped, lastDump := clock.stop()
	if err != nil {
		return fmt.Errorf("job: %w", err)
	}
	if dumped != *n {
		return fmt.Errorf("saw %d dumps published during the job, want %d", dumped, *n)
	}
	gpu := lastDump.Sub(job.firstAt)
	fmt.Printf("  simulator alone %s; simulator + plain copy: answered %s, synced %s; job: simulator done %s and job done %s after the first request (%s wall): %s", alone.Round(time.Millisecond), physAnswered.Round(time.Millisecond), physical.Round(time.Millisecond), gpu.Round(time.Millisecond), job.work.Round(time.Millisecond), job.wall.Round(time.Millisecond), job.stdout)
	aloneRate := float64(bytes) / (1 << 20) / alone.Seconds()
	jobRate := float64(bytes) / (1 << 20) / job.work.Seconds()
	physRate := float64(bytes) / (1 << 20) / physical.Seconds()
	if *fig == "2" {
		sps := float64(*n) / job.work.Seconds()
		dur := float64(*n) / durable.Seconds()
		err = emit(c.results, result{Fig: "2", Name: "the same small dumps through the whole job (extract run + simulator)", Value: sps, Unit: "samples/s",
			Baseline: fmt.Sprintf("simulator + durable copy %.0f/s", dur), Ratio: sps / dur, Target: "≥ 0.8× (device: and ≥ 1500/s)", Met: met(sps/dur >= 0.8), Note: note})
		if err != nil {
			return err
		}
		err = emit(c.results, result{Fig: "2", Name: "  the same, against simulator + plain copy + one sync", Value: sps, Unit: "samples/s",
			Baseline: fmt.Sprintf("simulator + plain copy %.0f/s", float64(*n)/physical.Seconds()), Ratio: sps / (float64(*n) / physical.Seconds()), Note: note})
		if err != nil {
			return err
		}
	} else {
		gpuRate := float64(bytes) / (1 << 20) / gpu.Seconds()
		ratio := gpuRate / aloneRate
		err = emit(c.results, result{Fig: "3", Name: "simulator under the job (first request → last dump), " + *label, Value: gpuRate, Unit: "MiB/s",
			Baseline: fmt.Sprintf("simulator alone %.0f MiB/s", aloneRate), Ratio: ratio, Target: "≥ 0.95×", Met: met(ratio >= 0.95), Note: note})
		if err != nil {
			return err
		}
		physGPU := float64(bytes) / (1 << 20) / physAnswered.Seconds()
		err = emit(c.results, result{Fig: "3", Name: "  simulator under the job, against the simulator under a plain copy", Value: gpuRate, Unit: "MiB/s",
			Baseline: fmt.Sprintf("simulator under cp %.0f MiB/s", physGPU), Ratio: gpuRate / physGPU, Note: note})
		if err != nil {
			return err
		}
		err = emit(c.results, result{Fig: "3", Name: "  whole job (first request → all durable, exit)", Value: jobRate, Unit: "MiB/s",
			Baseline: fmt.Sprintf("simulator alone %.0f MiB/s", aloneRate), Ratio: jobRate / aloneRate, Note: note})
		if err != nil {
			return err
		}
		err = emit(c.results, result{Fig: "3", Name: "  whole job against simulator + plain copy + sync (physical path)", Value: jobRate, Unit: "MiB/s",
			Baseline: fmt.Sprintf("simulator + cp %.0f MiB/s", physRate), Ratio: jobRate / physRate, Note: note})
		if err != nil {
			return err
		}
	}
	if *probes > 0 {
		if len(job.status) == 0 {
			return fmt.Errorf("no `extract status` answered while the job ran")
		}
		m := ms(median(job.status))
		err = emit(c.results, result{Fig: "5", Name: "`extract status --json` while running, " + *label + " (source " + job.statusSrc + ")", Value: m, Unit: "ms",
			Target: "< 100 ms", Met: met(m < 100), Note: fmt.Sprintf("median of %d, max %.0f ms, exec included", len(job.status), ms(maxDur(job.status)))})
		if err != nil {
			return err
		}
		if len(job.statusHTTP) > 0 {
			err = emit(c.results, result{Fig: "5", Name: "GET /status of the live endpoint, " + *label, Value: ms(median(job.statusHTTP)), Unit: "ms",
				Note: fmt.Sprintf("median of %d, max %.1f ms", len(job.statusHTTP), ms(maxDur(job.statusHTTP)))})
			if err != nil {
				return err
			}
		}
	}
	return nil
}
