package orchestrator

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/extract-dev/extract/checkpoint"
	"github.com/extract-dev/extract/configs"
	"github.com/extract-dev/extract/sglang"
	"github.com/extract-dev/extract/sglang/simulator"
)

// inProcessServer is one replica's server as the real simulator serving in this
// process: launched from the same argv the Manager would exec (parsed by the simulator's
// own flags), its HTTP server on loopback, its dumps written to the run's staging dir.
// A death is its life's context ending.
type inProcessServer struct {
	*sglang.Manager // LogPath, TrimLog and the launch spec
	log             *slog.Logger

	mu     sync.Mutex
	srv    *sglang.Server
	kill   context.CancelFunc
	exited chan struct{}
	lives  int
}

func (s *inProcessServer) Ensure(context.Context) (*sglang.Server, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.exited != nil {
		select {
		case <-s.exited:
		default:
			return s.srv, nil // alive: adopted, as the Manager would
		}
	}
	argv, err := s.Spec.Argv()
	if err != nil {
		return nil, err
	}
	var cfg simulator.Config
	flags := pflag.NewFlagSet("simulate", pflag.ContinueOnError)
	cfg.BindFlags(flags)
	if err := flags.Parse(argv[2:]); err != nil {
		return nil, fmt.Errorf("simulator argv %q: %w", argv, err)
	}
	sim, err := simulator.Listen(cfg, s.log)
	if err != nil {
		return nil, err
	}
	life, kill := context.WithCancel(context.Background())
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		_ = sim.Serve(life)
	}()
	// The simulator's hook marker names this process, whose group is the "server's".
	s.srv = &sglang.Server{PID: os.Getpid(), PGID: syscall.Getpgrp(), Port: s.Spec.Port, Argv: argv}
	s.kill, s.exited = kill, exited
	s.lives++
	return s.srv, nil
}

func (s *inProcessServer) Exited() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.exited
}

func (s *inProcessServer) Stop(ctx context.Context, _ time.Duration) error {
	s.die()
	s.mu.Lock()
	exited := s.exited
	s.mu.Unlock()
	if exited == nil {
		return nil
	}
	select {
	case <-exited:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// die ends the server's life as a crash would: its requests fail, its exit is seen.
func (s *inProcessServer) die() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.kill != nil {
		s.kill()
	}
}

func (s *inProcessServer) livesSoFar() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lives
}

// inProcessRun is a job of n samples of tokens each against the in-process simulator,
// with the servers it runs on.
type inProcessRun struct {
	cfg     *configs.Config
	opt     RunOptions
	servers []*inProcessServer
	mu      sync.Mutex
}

func newInProcessRun(t *testing.T, n, tokens int) *inProcessRun {
	t.Helper()
	dir := t.TempDir()
	cfg := configs.Default()
	ids := strings.TrimSuffix(strings.Repeat("7,", tokens), ",")
	cfg.Dataset = writeDataset(t, strings.Repeat(`{"input_ids":[`+ids+`]}`+"\n", n))
	cfg.OutputDir = filepath.Join(dir, "out")
	cfg.StateDir = filepath.Join(cfg.OutputDir, ".extract")
	shmDir, err := os.MkdirTemp("/dev/shm", "run-inprocess-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(shmDir) })
	cfg.ShmDir, cfg.ShmBudget, cfg.Disk.Reserve = shmDir, 64<<20, 1<<20
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Server.Port = ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	cfg.Server.Kind, cfg.Server.Host = sglang.KindSimulator, "127.0.0.1"
	cfg.Server.HiddenSize, cfg.Server.Simulator.HiddenSize = 8, 8
	cfg.Server.Simulator.RequestLog = filepath.Join(dir, "requests.log")
	cfg.Run.MaxInflight, cfg.Run.Movers = 4, 2
	cfg.Status.Listen = "127.0.0.1:0"
	r := &inProcessRun{cfg: &cfg}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	r.opt = RunOptions{Log: log, Executable: "extract", seams: runSeams{
		newServer: func(m *sglang.Manager) serverProcess {
			s := &inProcessServer{Manager: m, log: log}
			r.mu.Lock()
			r.servers = append(r.servers, s)
			r.mu.Unlock()
			return s
		},
		restartBackoff: func(int) time.Duration { return 10 * time.Millisecond },
	}}
	return r
}

// run runs the job and checks every server it started is stopped at the end.
func (r *inProcessRun) run(t *testing.T, ctx context.Context) Result {
	t.Helper()
	start := time.Now()
	// A broken rule would leave the job waiting forever: fail in half a minute instead.
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	res, err := Run(ctx, r.cfg, r.opt)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	t.Logf("run took %v: %d of %d done", time.Since(start).Round(time.Millisecond), res.Done, res.Total)
	for i, s := range r.servers {
		if ch := s.Exited(); ch != nil {
			select {
			case <-ch:
			default:
				t.Errorf("server %d still serving after Run returned", i)
			}
		}
	}
	return res
}

// maxOpen is the most requests the servers had open at once, from their request log.
func (r *inProcessRun) maxOpen(t *testing.T) (requests, most int) {
	t.Helper()
	f, err := os.Open(r.cfg.Server.Simulator.RequestLog)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		open, err := strconv.Atoi(fields[len(fields)-1])
		if err != nil {
			t.Fatalf("request log line %q", sc.Text())
		}
		requests++
		most = max(most, open)
	}
	return requests, most
}

// checkAllDone checks the index says every sample is done with an output file.
func (r *inProcessRun) checkAllDone(t *testing.T, total int) {
	t.Helper()
	ix, err := checkpoint.Open(filepath.Join(r.cfg.StateDir, "index.db"), checkpoint.OpenOptions{ReadOnly: true, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer ix.Close()
	c, err := ix.Counters()
	if err != nil {
		t.Fatal(err)
	}
	if c.Done != total || c.Failed != 0 {
		t.Errorf("index counts %d done, %d failed; want %d done", c.Done, c.Failed, total)
	}
	for s := range total {
		if _, err := os.Stat(checkpoint.OutputPath(r.cfg.OutputDir, s)); err != nil {
			t.Errorf("sample %d: %v", s, err)
		}
	}
}

func TestRunInProcessKeepsTheServersWithinTheRequestWindowAndFinishes(t *testing.T) {
	r := newInProcessRun(t, 40, 16)
	r.cfg.Server.Simulator.TokensPerSecond = 8000 // 2 ms a sample: the window's requests queue at the server
	res := r.run(t, context.Background())
	if res.Outcome != Finished || res.Done != 40 {
		t.Fatalf("outcome %v with %d done, want Finished with 40", res.Outcome, res.Done)
	}
	requests, most := r.maxOpen(t)
	if requests != 40 {
		t.Errorf("the server got %d requests for 40 samples", requests)
	}
	if most > r.cfg.Run.MaxInflight || most < 2 {
		t.Errorf("at most %d requests open at once; want 2..%d (run.max_inflight)", most, r.cfg.Run.MaxInflight)
	}
	r.checkAllDone(t, 40)
}

// Someone else's file fills the staging budget: samples still go, one at a time (a
// sample alone may pass the budget, or a dump larger than it would never run).
func TestRunInProcessOverTheStagingBudgetSendsOneSampleAtATime(t *testing.T) {
	r := newInProcessRun(t, 12, 16)
	r.cfg.ShmBudget = 1 << 20
	if err := os.WriteFile(filepath.Join(r.cfg.ShmDir, "someone-elses-file"), make([]byte, 2<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	res := r.run(t, context.Background())
	if res.Outcome != Finished || res.Done != 12 {
		t.Fatalf("outcome %v with %d done; want Finished with 12", res.Outcome, res.Done)
	}
	if requests, most := r.maxOpen(t); requests != 12 || most != 1 {
		t.Errorf("%d requests, at most %d open at once; want 12, one at a time", requests, most)
	}
	r.checkAllDone(t, 12)
}

// Someone else's file fills the staging budget: status says admission paused, one
// sample at a time goes; once the file is gone the next measurement opens the window
// again by itself.
func TestRunInProcessPausesOnTheStagingBudgetAndResumesWhenRoomReturns(t *testing.T) {
	r := newInProcessRun(t, 32, 16)
	r.cfg.ShmBudget = 1 << 20
	// 20 ms a sample, one at a time: the pause outlasts the two ticks that see it and
	// then the room.
	r.cfg.Server.Simulator.TokensPerSecond = 800
	filler := filepath.Join(r.cfg.ShmDir, "someone-elses-file")
	if err := os.WriteFile(filler, make([]byte, 2<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	paused := false
	r.opt.OnStatus = func(st Status) {
		for _, p := range st.Paused {
			if strings.HasPrefix(p, "staging budget") && !paused {
				paused = true
				if st.Inflight > 1 {
					t.Errorf("over the staging budget %d samples in flight; want at most one", st.Inflight)
				}
				if err := os.Remove(filler); err != nil { // room returns
					t.Error(err)
				}
			}
		}
	}
	res := r.run(t, context.Background())
	if !paused {
		t.Error("status never said admission paused on the staging budget")
	}
	if res.Outcome != Finished || res.Done != 32 {
		t.Fatalf("outcome %v with %d done; want the run to resume and finish 32", res.Outcome, res.Done)
	}
	if _, most := r.maxOpen(t); most < 2 {
		t.Errorf("at most %d request open at once: admission never resumed to the window", most)
	}
	r.checkAllDone(t, 32)
}

func TestRunInProcessRestartsADeadReplicaAndResendsWhatItHeld(t *testing.T) {
	r := newInProcessRun(t, 30, 16)
	// 20 ms a sample: the window's last requests are still in their prefill, with no dump,
	// when the server dies within a millisecond of the 8th.
	r.cfg.Server.Simulator.TokensPerSecond = 800
	var last Status
	r.opt.OnStatus = func(st Status) { last = st }
	// The server dies once it got 8 requests, with the window's requests open at it. A
	// request that fails before the death is seen is retried after its 1 s backoff: this
	// test takes over a second.
	killed := make(chan bool, 1)
	go func() {
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
			if b, err := os.ReadFile(r.cfg.Server.Simulator.RequestLog); err == nil && strings.Count(string(b), "\n") >= 8 {
				r.mu.Lock()
				server := r.servers[0]
				r.mu.Unlock()
				server.die()
				killed <- true
				return
			}
		}
		killed <- false
	}()
	res := r.run(t, context.Background())
	if !<-killed {
		t.Fatal("the server was never killed")
	}
	if lives := r.servers[0].livesSoFar(); lives != 2 || last.Servers[0].Restarts != 1 {
		t.Errorf("server lives %d, status restarts %d; want one restart", lives, last.Servers[0].Restarts)
	}
	if res.Outcome != Finished || res.Done != 30 || res.Failed != 0 {
		t.Fatalf("outcome %v, %d done, %d failed; want Finished with 30 done", res.Outcome, res.Done, res.Failed)
	}
	if requests, _ := r.maxOpen(t); requests <= 30 {
		t.Errorf("%d requests for 30 samples: nothing the dead server held was sent again", requests)
	}
	r.checkAllDone(t, 30)
}

// A stop (ctx cancelled) sends nothing new and lets every request in flight finish
// into a done sample, so the resume sends each of the rest once and none twice.
func TestRunInProcessDrainsOnStopAndAResumeFinishesTheRest(t *testing.T) {
	r := newInProcessRun(t, 100, 16)
	r.cfg.Server.Simulator.TokensPerSecond = 8000 // 2 ms a sample
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		defer cancel()
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
			if b, err := os.ReadFile(r.cfg.Server.Simulator.RequestLog); err == nil && strings.Count(string(b), "\n") >= 20 {
				return
			}
		}
	}()
	res := r.run(t, ctx)
	if res.Outcome != Stopped || res.Done >= 100 {
		t.Fatalf("outcome %v with %d done; want Stopped short of 100", res.Outcome, res.Done)
	}
	if requests, _ := r.maxOpen(t); requests != res.Done || requests < 20 {
		t.Errorf("the stopped run sent %d requests and got %d samples done; want every request (at least 20) drained into a done sample", requests, res.Done)
	}
	r.opt.Resume = true
	res = r.run(t, context.Background())
	if res.Outcome != Finished || res.Done != 100 {
		t.Fatalf("resume: outcome %v with %d done; want Finished with 100", res.Outcome, res.Done)
	}
	if requests, _ := r.maxOpen(t); requests != 100 {
		t.Errorf("%d requests in both runs for 100 samples; want each sent once", requests)
	}
	r.checkAllDone(t, 100)
}
