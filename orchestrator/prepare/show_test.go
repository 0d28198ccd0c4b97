package prepare

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestShowMarksTheLossAndNamesEachSpansRule(t *testing.T) {
	from := filepath.Join(t.TempDir(), "c.jsonl")
	os.WriteFile(from, []byte(`{"messages":[{"role":"user","content":"hi"}]}`+"\n"+`{"id":"x","messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"ok"}]}`+"\n"), 0o644)
	o := options(from, t.TempDir())
	sh, err := Show(context.Background(), o, Simulator{EndOfTurn: true}, 2)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	sh.Render(&b, false)
	out := b.String()
	for _, want := range []string{"line 2 (id x): 25 tokens, 3 in the loss", "<|im_start|>assistant\n[[ok<|im_end|>]]\n", "loss  turn 1   assistant content", "loss  turn 1   end of turn"} {
		if !strings.Contains(out, want) {
			t.Fatalf("output lacks %q:\n%s", want, out)
		}
	}
	b.Reset()
	sh.Render(&b, true)
	if !strings.Contains(b.String(), ansiLoss+"ok<|im_end|>"+ansiReset) {
		t.Fatalf("no colour on a terminal:\n%q", b.String())
	}
	refused, err := Show(context.Background(), o, Simulator{EndOfTurn: true}, 1)
	if err != nil || refused.Refusal == nil {
		t.Fatalf("line 1: %+v %v", refused, err)
	}
	if _, err := os.Stat(o.Dir + "/manifest.json"); err == nil {
		t.Fatal("show wrote a manifest")
	}
}
