package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/extract-dev/extract/sglang"
	"github.com/extract-dev/extract/shm"
)

// consecutivePorts finds n free ports in a row (a job's replicas listen on port + r).
func consecutivePorts(n int) (int, error) {
	for range 200 {
		base, err := freePort()
		if err != nil {
			return 0, err
		}
		ok := base+n <= 65535
		for p := base + 1; p < base+n && ok; p++ {
			ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
			if err != nil {
				ok = false
				continue
			}
			_ = ln.Close()
		}
		if ok {
			return base, nil
		}
	}
	return 0, fmt.Errorf("no %d consecutive free ports", n)
}

// simPlainCopy is the physical path of a job of several servers: replicas simulators,
// each in its own staging dir, driven with the job's window split evenly between them,
// each dump copied to copyDir as soon as its request is answered and deleted, then one
// sync. It returns the time from the first request to the end of the sync.
func simPlainCopy(extract, stage string, replicas, hidden int, tps float64, n int, plan tokenPlan, inflight int, copyDir string) (time.Duration, error) {
	clients := make([]*sglang.Client, replicas)
	dirs := make([]string, replicas)
	for r := range replicas {
		dirs[r] = filepath.Join(stage, fmt.Sprintf("r%d", r))
		if err := os.MkdirAll(dirs[r], 0o755); err != nil {
			return 0, err
		}
		port, err := freePort()
		if err != nil {
			return 0, err
		}
		sim, err := startSimulator(extract, dirs[r], port, hidden, tps)
		if err != nil {
			return 0, err
		}
		defer func() {
			_ = sim.cmd.Process.Signal(syscall.SIGTERM)
			_ = sim.wait(30 * time.Second)
		}()
		clients[r] = sglang.NewClient(fmt.Sprintf("http://127.0.0.1:%d", port), sglang.ClientOptions{RetryMax: 1, AttemptTimeout: 5 * time.Minute})
	}
	samples := make([][]int64, n)
	for s := range n {
		samples[s] = sampleIDs(s, plan(s))
	}
	// Samples go round the replicas, max(inflight, replicas) requests at once.
	var g errgroup.Group
	g.SetLimit(max(inflight, replicas))
	start := time.Now()
	for s := range n {
		g.Go(func() error {
			r := s % replicas
			rid := shm.RID{Sample: s, Attempt: 1}
			if _, err := clients[r].Generate(context.Background(), sglang.GenerateRequest{RID: rid.String(), InputIDs: samples[s]}); err != nil {
				return err
			}
			src := filepath.Join(dirs[r], rid.FileName())
			if err := plainCopy(src, filepath.Join(copyDir, rid.FileName())); err != nil {
				return err
			}
			return os.Remove(src)
		})
	}
	if err := g.Wait(); err != nil {
		return 0, err
	}
	if err := run("sync"); err != nil {
		return 0, err
	}
	return time.Since(start), nil
}

// cmdReplicas is figure 8: the whole job with 1, 2, 4… simulator replicas against the
// same number of simulators + cp + sync. With the simulators together faster than the
// disk (-disk-fraction > 1), the disk is the limit and the job must keep ≥ 0.95× of the
// physical path whatever the number of replicas; with small dumps and many replicas it
// gives extract's overhead per sample.
func cmdReplicas(args []string) error {
	var c commonFlags
	fs := flag.NewFlagSet("replicas", flag.ExitOnError)
	c.register(fs)
	counts := fs.String("replicas", "1,2,4", "numbers of replicas to measure, comma-separated")
	n := fs.Int("n", 64, "samples")
	lo := fs.Int("tokens-lo", 256, "fewest tokens in a sample")
	hi := fs.Int("tokens-hi", 2048, "most tokens in a sample")
	hidden := fs.Int("hidden", 7168, "hidden size (the real model's: 57 KiB per token)")
	tps := fs.Float64("tps", 0, "tokens/s of each simulator (0: full speed)")
	diskFrac := fs.Float64("disk-fraction", 0, "if > 0, the simulators together dump at this fraction of figure 1's cp + sync rate (> 1: the disk is the limit), split evenly between the replicas")
	inflight := fs.Int("inflight", 32, "run.max_inflight, shared by the replicas; also the plain copy's window")
	movers := fs.Int("movers", 4, "run.movers")
	label := fs.String("label", "", "what this run is (default from the flags)")
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
	perToken := int64(4**hidden)*2 + 8
	bytes := tokens * perToken
	dir := filepath.Join(c.out, "replicas")
	stage := filepath.Join(c.shm, "replicas")
	defer func() { logErr("os.RemoveAll(stage)", os.RemoveAll(stage)) }()
	defer func() { logErr("os.RemoveAll(dir)", os.RemoveAll(dir)) }()
	ds := filepath.Join(dir, "dataset.jsonl")
	if _, _, err := writeDataset(ds, *n, plan); err != nil {
		return err
	}
	for _, field := range strings.Split(*counts, ",") {
		reps, err := strconv.Atoi(strings.TrimSpace(field))
		if err != nil || reps < 1 {
			return fmt.Errorf("-replicas: %q is not a number ≥ 1", field)
		}
		simTPS, what := *tps, *label
		if *diskFrac > 0 {
			cp, ok := lookup(c.results, "1", "cp + sync (physical path)")
			if !ok {
				cp = 300
			}
			total := *diskFrac * cp * (1 << 20) / float64(perToken) // tokens/s of all simulators
			simTPS = float64(int(total / float64(reps)))
			if what == "" {
				what = fmt.Sprintf("simulators at %.0f%% of cp + sync", *diskFrac*100)
			}
		}
		if what == "" && simTPS > 0 {
			what = fmt.Sprintf("simulators at %.0f tokens/s each", simTPS)
		}
		if what == "" {
			what = "simulators at full speed"
		}
		note := fmt.Sprintf("%d samples of %d–%d tokens, H=%d, %.2f GiB; %s tokens/s per replica", *n, *lo, *hi, *hidden, float64(bytes)/(1<<30), strconv.FormatFloat(simTPS, 'f', 0, 64))
		fmt.Printf("fig 8 (%d replicas, %s): %s\n", reps, what, note)

		copyDir := filepath.Join(dir, "plain-copy")
		if err := os.MkdirAll(copyDir, 0o755); err != nil {
			return err
		}
		physical, err := simPlainCopy(c.extract, stage, reps, *hidden, simTPS, *n, plan, *inflight, copyDir)
		if err != nil {
			return fmt.Errorf("%d simulators + plain copy: %w", reps, err)
		}
		if err := settle(stage, copyDir); err != nil {
			return err
		}
		port, err := consecutivePorts(reps)
		if err != nil {
			return err
		}
		cfg := filepath.Join(dir, "job.yaml")
		out := filepath.Join(dir, "out")
		jc := jobConfig{Dataset: ds, OutputDir: out, ShmDir: stage, Port: port, Replicas: reps, Hidden: *hidden, TokensPerSecond: simTPS, MaxInflight: *inflight, Movers: *movers}
		if err := jc.write(cfg); err != nil {
			return err
		}
		job, err := runJob(c.extract, jobOpts{config: cfg, stateDir: filepath.Join(out, ".extract"), timeout: 5 * time.Minute})
		if err != nil {
			return fmt.Errorf("job of %d replicas: %w", reps, err)
		}
		if err := settle(out, stage); err != nil {
			return err
		}
		fmt.Printf("  %d simulators + plain copy + sync %s; job %s after the first request (%s wall): %s", reps, physical.Round(time.Millisecond), job.work.Round(time.Millisecond), job.wall.Round(time.Millisecond), job.stdout)
		jobRate := float64(bytes) / (1 << 20) / job.work.Seconds()
		physRate := float64(bytes) / (1 << 20) / physical.Seconds()
		ratio := jobRate / physRate
		r := result{Fig: "8", Name: fmt.Sprintf("whole job, %d replica(s), %s", reps, what), Value: jobRate, Unit: "MiB/s",
			Baseline: fmt.Sprintf("%d simulator(s) + cp + sync %.0f MiB/s", reps, physRate), Ratio: ratio, Note: note}
		if *diskFrac > 1 {
			r.Target, r.Met = "≥ 0.95×", met(ratio >= 0.95)
		}
		if err := emit(c.results, r); err != nil {
			return err
		}
		overhead := (job.work - physical).Seconds() / float64(*n) * 1e6
		err = emit(c.results, result{Fig: "8", Name: fmt.Sprintf("  per-sample overhead, %d replica(s), %s", reps, what), Value: overhead, Unit: "µs",
			Baseline: fmt.Sprintf("%.0f samples/s against %.0f/s", float64(*n)/job.work.Seconds(), float64(*n)/physical.Seconds()), Note: "(job − physical path) / samples; negative: the job was faster"})
		if err != nil {
			return err
		}
	}
	return nil
}
