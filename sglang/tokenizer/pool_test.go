package tokenizer

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
	"github.com/extract-dev/extract/internal/testsupport"
	"github.com/extract-dev/extract/sglang/simulator"
)

// needPython finds python3 with jinja2 for the worker: a skip without it, a failure
// where CI requires it (testsupport.PythonJinja).
func needPython(t *testing.T) string {
	t.Helper()
	testsupport.Require(t, testsupport.PythonJinja)
	pythonOnce.Do(func() {
		// The interpreter itself, not a launcher script (pyenv's shims cost a second a start).
		out, err := exec.Command("python3", "-c", "import jinja2, sys; print(sys.executable)").Output()
		python, pythonErr = strings.TrimSpace(string(out)), err
	})
	if pythonErr != nil {
		testsupport.Unavailable(t, testsupport.PythonJinja, "python3 -c 'import jinja2': %v", pythonErr)
	}
	return python
}

var (
	pythonOnce sync.Once
	python     string
	pythonErr  error
)

// Templates in HF's dialect; '\n' inside expressions, as real templates write it, since
// trim_blocks eats a newline after a block tag.
const (
	chatML = `{% for m in messages %}{{ '<|im_start|>' + m.role + '\n' + m.content + '<|im_end|>' + '\n' }}{% endfor %}` +
		`{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}`
	chatMLTags = `{% for m in messages %}{{ '<|im_start|>' + m.role + '\n' }}{% if m.role == 'assistant' %}` +
		`{% generation %}{{ m.content + '<|im_end|>' }}{% endgeneration %}{{ '\n' }}{% else %}{{ m.content + '<|im_end|>\n' }}{% endif %}{% endfor %}` +
		`{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}`
	// The end-of-turn token outside the tags: the end_of_turn key puts it in.
	chatMLTagsShort = `{% for m in messages %}{{ '<|im_start|>' + m.role + '\n' }}{% if m.role == 'assistant' %}` +
		`{% generation %}{{ m.content }}{% endgeneration %}{{ '<|im_end|>\n' }}{% else %}{{ m.content + '<|im_end|>\n' }}{% endif %}{% endfor %}` +
		`{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}`
	// Like Qwen3's: reasoning is rendered only in the last assistant turn.
	dropsEarlierReasoning = `{% for m in messages %}{{ '<|im_start|>' + m.role + '\n' }}{% if m.role == 'assistant' and loop.last and m.reasoning_content %}` +
		`{{ '<think>\n' + m.reasoning_content + '\n</think>\n' }}{% endif %}{{ m.content + '<|im_end|>\n' }}{% endfor %}` +
		`{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}`
	raisesOnSystem = `{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('no system turns') }}{% endif %}{{ '<|im_start|>' + m.role + '\n' + m.content + '<|im_end|>\n' }}{% endfor %}` +
		`{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}`
	noGenerationPrompt = `{% for m in messages %}{{ '<|im_start|>' + m.role + '\n' + m.content + '<|im_end|>\n' }}{% endfor %}`
)

func tokDir(t *testing.T, template string, merges map[string]int) string {
	t.Helper()
	dir := t.TempDir()
	spec, _ := json.Marshal(map[string]any{"chat_template": template, "eos_token": "<|im_end|>",
		"specials": map[string]int{"<|im_start|>": 1, "<|im_end|>": 2}, "merges": merges})
	tc, _ := json.Marshal(map[string]any{"chat_template": template})
	for name, b := range map[string][]byte{"fake_tokenizer.json": spec, "tokenizer.json": []byte("{}"), "tokenizer_config.json": tc, "config.json": []byte(`{"vocab_size": 259}`)} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func start(t *testing.T, dir, mask, eot string) *Pool {
	t.Helper()
	py := needPython(t)
	abs, _ := filepath.Abs("testdata/fake_transformers")
	p, err := Start(context.Background(), Config{Python: py, Env: []string{"PYTHONPATH=" + abs}, Tokenizer: dir,
		Mask: mask, EndOfTurn: eot, Workers: 1, WorkDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func conv(msgs ...conversation.Message) conversation.Conversation {
	return conversation.Conversation{Messages: msgs}
}

func msg(role conversation.Role, content string) conversation.Message {
	return conversation.Message{Role: role, Content: content}
}

var multiTurn = conv(msg(conversation.System, "be brief"), msg(conversation.User, "hi"), msg(conversation.Assistant, "hello there"),
	msg(conversation.User, "ünïcode?"), msg(conversation.Assistant, "ja, ü"))

// Through the stand-in byte tokenizer, a ChatML template must give exactly the
// simulator's contract, computed in Go by simulator.ChatEncode: both mask methods, both
// end-of-turn conventions.
func TestWorkerMasksEqualTheContractByBothMethods(t *testing.T) {
	for _, tc := range []struct{ template, mask string }{
		{chatML, "prefix"}, {chatMLTags, "tags"}, {chatMLTags, "prefix"}, {chatMLTagsShort, "tags"}, {chatMLTags, "auto"},
	} {
		for _, eot := range []string{"include", "exclude"} {
			t.Run(fmt.Sprintf("%s/%d/%s", tc.mask, len(tc.template), eot), func(t *testing.T) {
				p := start(t, tokDir(t, tc.template, nil), tc.mask, eot)
				if tc.mask == "auto" && p.Method() != "tags" {
					t.Fatalf("auto chose %s for a template with generation tags", p.Method())
				}
				res, err := p.Encode(context.Background(), 0, []conversation.Conversation{multiTurn, conv(msg(conversation.User, "q"), msg(conversation.Assistant, "a"))})
				if err != nil {
					t.Fatal(err)
				}
				for i, c := range []conversation.Conversation{multiTurn, conv(msg(conversation.User, "q"), msg(conversation.Assistant, "a"))} {
					if res[i].Refusal != nil {
						t.Fatalf("refused: %v", res[i].Refusal)
					}
					want := simulator.ChatEncode(c.Messages, eot == "include")
					if fmt.Sprint(res[i].Enc.IDs) != fmt.Sprint(want.IDs) || fmt.Sprint(res[i].Enc.Mask) != fmt.Sprint(want.Mask) {
						t.Fatalf("conversation %d:\n ids %v\nmask %v\nwant %v\n     %v", i, res[i].Enc.IDs, res[i].Enc.Mask, want.IDs, want.Mask)
					}
					checkSpans(t, res[i].Enc)
				}
			})
		}
	}
}

func checkSpans(t *testing.T, e conversation.Encoding) {
	t.Helper()
	at := 0
	for _, s := range e.Spans {
		if s.Start != at || s.End <= s.Start || s.Rule == "" {
			t.Fatalf("spans do not tile the tokens: %+v", e.Spans)
		}
		for i := s.Start; i < s.End; i++ {
			if (e.Mask[i] == 1) != s.Loss {
				t.Fatalf("span %+v disagrees with the mask at %d", s, i)
			}
		}
		at = s.End
	}
	if at != len(e.IDs) {
		t.Fatalf("spans end at %d of %d tokens", at, len(e.IDs))
	}
}

func TestWorkerRefusesWhatCannotBeMaskedExactly(t *testing.T) {
	reasoning := conversation.Message{Role: conversation.Assistant, Content: "4", Reasoning: "2+2"}
	for _, tc := range []struct {
		name     string
		template string
		merges   map[string]int
		mask     string
		conv     conversation.Conversation
		want     conversation.Reason
	}{
		// "\nh" merges across the header/content boundary: the prompt's tokens are not a
		// prefix of the conversation's.
		{"merge across the boundary", chatML, map[string]int{"\nh": 300}, "prefix", conv(msg(conversation.User, "x"), msg(conversation.Assistant, "hello")), conversation.NotPrefix},
		{"a token across the generation block", chatMLTags, map[string]int{"\nh": 300}, "tags", conv(msg(conversation.User, "x"), msg(conversation.Assistant, "hello")), conversation.CrossesBoundary},
		{"earlier reasoning dropped", dropsEarlierReasoning, nil, "prefix", conv(msg(conversation.User, "2+2?"), reasoning, msg(conversation.User, "and?"), msg(conversation.Assistant, "done")), conversation.NotPrefix},
		{"reasoning never rendered", chatML, nil, "prefix", conv(msg(conversation.User, "2+2?"), reasoning), conversation.TemplateError},
		{"template raises", raisesOnSystem, nil, "prefix", conv(msg(conversation.System, "s"), msg(conversation.User, "q"), msg(conversation.Assistant, "a")), conversation.TemplateError},
		{"no end of turn", strings.ReplaceAll(chatML, "<|im_end|>", "<|im_stop|>"), nil, "prefix", conv(msg(conversation.User, "q"), msg(conversation.Assistant, "a")), conversation.NoEndOfTurn},
		// Without a generation prompt the header would be masked as the assistant's.
		{"no generation prompt", noGenerationPrompt, nil, "prefix", conv(msg(conversation.User, "q"), msg(conversation.Assistant, "a")), conversation.TemplateError},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := start(t, tokDir(t, tc.template, tc.merges), tc.mask, "include")
			res, err := p.Encode(context.Background(), 0, []conversation.Conversation{tc.conv, conv(msg(conversation.User, "ok"), msg(conversation.Assistant, "fine"))})
			if err != nil {
				t.Fatal(err)
			}
			if res[0].Refusal == nil || res[0].Refusal.Reason != tc.want {
				t.Fatalf("result %+v, want a refusal %s", res[0], tc.want)
			}
			if tc.want != conversation.NoEndOfTurn && tc.template != noGenerationPrompt && res[1].Refusal != nil {
				t.Fatalf("the good conversation beside it was refused: %v", res[1].Refusal)
			}
		})
	}
}

// A start that fails says the worker's reason, and a failure that is not an import's is
// not retried with torch (a second start of 13 s on the device, for the same error).
func TestWorkerStartFailsWithTheWorkersReason(t *testing.T) {
	py := needPython(t)
	abs, _ := filepath.Abs("testdata/fake_transformers")
	dir := tokDir(t, chatML, nil)
	loads := filepath.Join(t.TempDir(), "loads")
	_, err := Start(context.Background(), Config{Python: py, Env: []string{"PYTHONPATH=" + abs, "FAKE_LOAD_LOG=" + loads}, Tokenizer: dir, Mask: "tags", EndOfTurn: "include", Workers: 1, WorkDir: t.TempDir()})
	if err == nil || !strings.Contains(err.Error(), "no {% generation %} block") {
		t.Fatalf("err = %v", err)
	}
	if b, _ := os.ReadFile(loads); strings.Count(string(b), "\n") != 1 {
		t.Fatalf("the tokenizer was loaded %d times, want once (no retry with torch for a template error)", strings.Count(string(b), "\n"))
	}
}

// The variables the worker hands itself when it re-executes are not taken from extract's
// environment: a stale config there would replace the real one.
func TestAStaleReexecConfigInTheEnvironmentIsIgnored(t *testing.T) {
	p := startN(t, 2, `PREPARE_WORKER_HELLO={"tokenizer": "/nonexistent", "worker_fds": [[3, 4]]}`, "PREPARE_WORKER_WITH_TORCH=1")
	if h, _ := p.ready.Timings["torch_hidden"].(bool); !h {
		t.Fatalf("torch was not hidden: %v", p.ready.Timings)
	}
	for w := range 2 {
		if _, err := p.Encode(context.Background(), w, []conversation.Conversation{multiTurn}); err != nil {
			t.Fatalf("worker %d: %v", w, err)
		}
	}
}

func TestWorkerPiecesDecodeEachToken(t *testing.T) {
	p := start(t, tokDir(t, chatML, nil), "prefix", "include")
	got, err := p.Pieces(context.Background(), []int64{1, 'h' + 3, 2})
	if err != nil || strings.Join(got, "|") != "<|im_start|>|h|<|im_end|>" {
		t.Fatalf("pieces %q, %v", got, err)
	}
}

func TestTemplateKwargsReachTheTemplate(t *testing.T) {
	py := needPython(t)
	abs, _ := filepath.Abs("testdata/fake_transformers")
	tmpl := `{% for m in messages %}{{ '<|im_start|>' + m.role + '\n' + tag + m.content + '<|im_end|>\n' }}{% endfor %}` +
		`{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}`
	p, err := Start(context.Background(), Config{Python: py, Env: []string{"PYTHONPATH=" + abs}, Tokenizer: tokDir(t, tmpl, nil),
		Mask: "prefix", EndOfTurn: "include", Workers: 1, WorkDir: t.TempDir(), TemplateKwargs: map[string]any{"tag": "T:"}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	res, err := p.Encode(context.Background(), 0, []conversation.Conversation{conv(msg(conversation.User, "q"), msg(conversation.Assistant, "a"))})
	if err != nil || res[0].Refusal != nil {
		t.Fatalf("%+v %v", res, err)
	}
	want := simulator.ChatEncode([]conversation.Message{msg(conversation.User, "T:q"), msg(conversation.Assistant, "T:a")}, true)
	if fmt.Sprint(res[0].Enc.IDs) != fmt.Sprint(want.IDs) || fmt.Sprint(res[0].Enc.Mask) != fmt.Sprint(want.Mask) {
		t.Fatalf("ids %v mask %v\nwant %v %v", res[0].Enc.IDs, res[0].Enc.Mask, want.IDs, want.Mask)
	}
}

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
	cmd.Env = append(os.Environ(), "EXTRACT_TEST_POOL_HELPER=1")
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
	time.Sleep(300 * time.Millisecond) // the helper's Encode is now in the worker's 60 s batch
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
// start on the device); one whose load fails without torch loads again with it.
func TestTheTokenizerLoadsWithTorchHiddenAndAgainWithItWhereItFails(t *testing.T) {
	for _, tc := range []struct {
		name   string
		env    []string
		loads  string
		hidden bool
	}{
		{"hidden", nil, "torch_hidden=True\n", true},
		{"needs torch", []string{"FAKE_NEEDS_TORCH=1"}, "torch_hidden=True\ntorch_hidden=False\n", false},
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
