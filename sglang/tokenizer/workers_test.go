package tokenizer

// Tests of the worker processes: one load forked N ways, how a worker's death, a cancel
// and extract's death end them, Close, and their stderr lines.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/extract-dev/extract/internal/conversation"
	"github.com/extract-dev/extract/sglang/simulator"
)

func startN(t *testing.T, n int, env ...string) *Pool {
	t.Helper()
	py := needPython(t)
	abs, _ := filepath.Abs("testdata/fake_transformers")
	p, err := Start(context.Background(), Config{Python: py, Env: append([]string{"PYTHONPATH=" + abs}, env...),
		Tokenizer: tokDir(t, chatMLTags, nil), Mask: "tags", EndOfTurn: "include", Workers: n, WorkDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// The tokenizer is loaded once and the workers forked from it: 16 interpreters each
// importing transformers took 16 s to start on the device.
func TestWorkersAreForkedFromOneLoadedTokenizer(t *testing.T) {
	loads := filepath.Join(t.TempDir(), "loads")
	p := startN(t, 4, "FAKE_LOAD_LOG="+loads)
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := p.Encode(context.Background(), w, []conversation.Conversation{multiTurn})
			if err == nil && fmt.Sprint(res[0].Enc.IDs) != fmt.Sprint(simulator.ChatEncode(multiTurn.Messages, true).IDs) {
				err = fmt.Errorf("ids %v", res[0].Enc.IDs)
			}
			errs[w] = err
		}()
	}
	wg.Wait()
	for w, err := range errs {
		if err != nil {
			t.Fatalf("worker %d: %v", w, err)
		}
	}
	b, _ := os.ReadFile(loads)
	if n := strings.Count(string(b), "\n"); n != 1 {
		t.Fatalf("the tokenizer was loaded %d times for 4 workers, want once", n)
	}
	seen := map[int]bool{}
	for w, pr := range p.procs {
		if seen[pr.pid] || pr.pid == p.zygote.cmd.Process.Pid {
			t.Fatalf("worker %d's pid %d is not its own", w, pr.pid)
		}
		seen[pr.pid] = true
		if pp := parentOf(t, pr.pid); pp != p.zygote.cmd.Process.Pid {
			t.Fatalf("worker %d's parent is %d, not the process that loaded the tokenizer (%d)", w, pp, p.zygote.cmd.Process.Pid)
		}
	}
}

func parentOf(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	// pid (comm) state ppid ...: comm may hold spaces, so from the last ')'.
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	n, _ := strconv.Atoi(f[1])
	return n
}

// alive is whether pid is a process that has not exited (a zombie has).
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	return len(f) > 0 && f[0] != "Z" && f[0] != "X"
}

func waitGone(t *testing.T, d time.Duration, pids ...int) {
	t.Helper()
	deadline := time.Now().Add(d)
	for _, pid := range pids {
		for alive(pid) {
			if time.Now().After(deadline) {
				t.Fatalf("process %d is still running %v later", pid, d)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// A worker that dies fails its caller's call with how it ended; the others still answer.
func TestAKilledWorkerFailsItsCallWithHowItEnded(t *testing.T) {
	p := startN(t, 3)
	if err := syscall.Kill(p.procs[1].pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_, err := p.Encode(context.Background(), 1, []conversation.Conversation{multiTurn})
	if err == nil || !strings.Contains(err.Error(), "prepare worker 1") || !strings.Contains(err.Error(), "killed by signal 9") {
		t.Fatalf("err = %v, want worker 1's call to fail saying it was killed by signal 9", err)
	}
	if _, err := p.Encode(context.Background(), 2, []conversation.Conversation{multiTurn}); err != nil {
		t.Fatalf("worker 2 after worker 1's death: %v", err)
	}
}

// A cancelled call returns at once and ends the pool, workers midway in a batch too.
func TestACancelledCallEndsEveryWorker(t *testing.T) {
	p := startN(t, 2, "FAKE_ENCODE_SECONDS=60")
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	started := time.Now()
	_, err := p.Encode(ctx, 0, []conversation.Conversation{multiTurn})
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(started) > 5*time.Second {
		t.Fatalf("err = %v after %v, want the deadline at once", err, time.Since(started))
	}
	waitGone(t, 5*time.Second, p.zygote.cmd.Process.Pid, p.procs[0].pid, p.procs[1].pid)
}

// With extract SIGKILLed, a worker busy in a batch dies too (PR_SET_PDEATHSIG through
// the zygote), not when its batch ends: the helper below is the extract that dies.
func TestWorkersDieWithExtractEvenMidBatch(t *testing.T) {
	needPython(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperPoolThatGetsKilled$", "-test.v")
	started := filepath.Join(t.TempDir(), "encode-started")
	cmd.Env = append(os.Environ(), "EXTRACT_TEST_POOL_HELPER=1", "FAKE_ENCODE_STARTED="+started)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	var pids []int
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "PIDS "); ok {
			for _, f := range strings.Fields(rest) {
				n, _ := strconv.Atoi(f)
				pids = append(pids, n)
			}
			break
		}
	}
	if len(pids) != 3 {
		t.Fatalf("the helper printed pids %v, want the zygote's and 2 workers'", pids)
	}
	// Killed only once the helper's Encode is inside the worker's 60 s batch: an idle
	// worker would end at EOF without the prctl this pins.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, err := os.Stat(started); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the helper's Encode never reached the worker's batch")
		}
	}
	for _, pid := range pids {
		if !alive(pid) {
			t.Fatalf("process %d ended before the helper was killed", pid)
		}
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	waitGone(t, 5*time.Second, pids...)
}

func TestHelperPoolThatGetsKilled(t *testing.T) {
	if os.Getenv("EXTRACT_TEST_POOL_HELPER") != "1" {
		t.Skip("the helper process of TestWorkersDieWithExtractEvenMidBatch")
	}
	p := startN(t, 2, "FAKE_ENCODE_SECONDS=60")
	fmt.Printf("PIDS %d %d %d\n", p.zygote.cmd.Process.Pid, p.procs[0].pid, p.procs[1].pid)
	_, _ = p.Encode(context.Background(), 0, []conversation.Conversation{multiTurn})
	t.Fatal("the helper's Encode returned: it should have been killed in it")
}

// Close is quick even where the interpreter's teardown is slow (a second with
// transformers loaded; one after the other, 16 workers cost 20 s of a 44 s prepare on
// the device): the workers end without it, and the zygote exits by itself.
func TestCloseEndsTheWorkersWithoutTheirTeardown(t *testing.T) {
	p := startN(t, 4, "FAKE_EXIT_SECONDS=3")
	if _, err := p.Encode(context.Background(), 0, []conversation.Conversation{multiTurn}); err != nil {
		t.Fatal(err)
	}
	started := time.Now()
	_ = p.Close()
	if d := time.Since(started); d > 2*time.Second {
		t.Fatalf("Close of 4 workers took %v: it waited for an interpreter teardown of 3 s", d)
	}
	if st := p.zygote.cmd.ProcessState; st == nil || !st.Exited() || st.ExitCode() != 0 {
		t.Fatalf("the worker process did not exit by itself with status 0: %v", st)
	}
	for w, pr := range p.procs {
		if alive(pr.pid) {
			t.Fatalf("worker %d (pid %d) is still running after Close", w, pr.pid)
		}
	}
}

// The tokenizer loads with torch hidden from transformers (importing it was 13 of a 14 s
// start on the device); one whose load, or first encode, fails without torch loads
// again with it.
func TestTheTokenizerLoadsWithTorchHiddenAndAgainWithItWhereItFails(t *testing.T) {
	for _, tc := range []struct {
		name   string
		env    []string
		loads  string
		hidden bool
	}{
		{"hidden", nil, "torch_hidden=True\n", true},
		{"needs torch", []string{"FAKE_NEEDS_TORCH=1"}, "torch_hidden=True\ntorch_hidden=False\n", false},
		{"needs torch to encode", []string{"FAKE_NEEDS_TORCH_TO_ENCODE=1"}, "torch_hidden=True\ntorch_hidden=False\n", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			loads := filepath.Join(t.TempDir(), "loads")
			p := startN(t, 2, append(tc.env, "FAKE_LOAD_LOG="+loads)...)
			b, _ := os.ReadFile(loads)
			var got strings.Builder
			for _, l := range strings.SplitAfter(string(b), "\n") {
				if _, f, ok := strings.Cut(l, " "); ok {
					got.WriteString(f)
				}
			}
			if got.String() != tc.loads {
				t.Fatalf("loads %q, want %q", got.String(), tc.loads)
			}
			if h, _ := p.ready.Timings["torch_hidden"].(bool); h != tc.hidden {
				t.Fatalf("ready says torch_hidden %v, want %v", p.ready.Timings["torch_hidden"], tc.hidden)
			}
			for w := range 2 {
				if _, err := p.Encode(context.Background(), w, []conversation.Conversation{multiTurn}); err != nil {
					t.Fatalf("worker %d: %v", w, err)
				}
			}
		})
	}
}

// Each worker's stats line reaches the log whole: the workers share one stderr pipe, and
// lines written in two pieces by workers ending together came out interleaved.
func TestEveryWorkersStatsLineIsLoggedWhole(t *testing.T) {
	py := needPython(t)
	abs, _ := filepath.Abs("testdata/fake_transformers")
	var logs syncBuffer
	p, err := Start(context.Background(), Config{Python: py, Env: []string{"PYTHONPATH=" + abs},
		Tokenizer: tokDir(t, chatMLTags, nil), Mask: "tags", EndOfTurn: "include", Workers: 8, WorkDir: t.TempDir(),
		Log: slog.New(slog.NewJSONHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	_ = p.Close()
	seen := map[float64]bool{}
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		var rec struct {
			Msg    string  `json:"msg"`
			Worker float64 `json:"worker"`
			Stats  string  `json:"stats"`
		}
		if err := json.Unmarshal([]byte(line), &rec); err != nil || rec.Msg != "prepare worker stats" {
			continue
		}
		var stats map[string]float64
		if err := json.Unmarshal([]byte(rec.Stats), &stats); err != nil {
			t.Fatalf("worker %v's stats are not one JSON object: %q", rec.Worker, rec.Stats)
		}
		seen[rec.Worker] = true
	}
	if len(seen) != 8 {
		t.Fatalf("stats logged for %d of 8 workers:\n%s", len(seen), logs.String())
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
