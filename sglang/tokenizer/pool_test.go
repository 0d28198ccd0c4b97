package tokenizer

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

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

// The variables the worker hands itself when it re-executes are taken neither from
// extract's environment nor from server.env: a stale config there would replace the
// real one.
func TestAStaleReexecConfigInTheEnvironmentIsIgnored(t *testing.T) {
	t.Setenv("PREPARE_WORKER_HELLO", `{"tokenizer": "/nonexistent", "worker_fds": [[3, 4]]}`)
	p := startN(t, 2, "PREPARE_WORKER_WITH_TORCH=1")
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

// Past MaxWorkers the zygote would start with more descriptors than a child's default
// soft limit leaves its loader: refused up front, with what to lower.
func TestMoreWorkersThanOnePoolForksAreRefusedByName(t *testing.T) {
	dir := tokDir(t, chatML, nil)
	if _, err := New(Config{Tokenizer: dir, Workers: MaxWorkers}); err != nil {
		t.Fatalf("%d workers: %v", MaxWorkers, err)
	}
	_, err := New(Config{Tokenizer: dir, Workers: MaxWorkers + 1})
	if err == nil || !strings.Contains(err.Error(), "prepare.workers 481") || !strings.Contains(err.Error(), "ulimit -n") {
		t.Fatalf("%d workers: %v", MaxWorkers+1, err)
	}
}
