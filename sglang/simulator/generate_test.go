package simulator_test

import (
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/extract-dev/extract/sglang"
	"github.com/extract-dev/extract/sglang/simulator"
)

func TestAGenerationRidGetsTheContractsReplyAndNoDump(t *testing.T) {
	cfg := baseConfig(t)
	cfg.Port, cfg.RequestLog, cfg.ReplyTokens = 0, filepath.Join(t.TempDir(), "requests.log"), 10
	base, _ := start(t, cfg)
	c := sglang.NewClient(base, sglang.ClientOptions{})
	prompt := []int64{1, 120, 118, 104, 117, 13, 107, 108, 2, 13, 1, 100}
	seed := int64(4)
	full, finish := simulator.Reply(prompt, seed, 0, cfg.Simulator)
	if finish != "stop" || full[len(full)-1] != simulator.ChatIMEnd || len(full) > 11 {
		t.Fatalf("Reply without a bound: %v %s", full, finish)
	}
	for _, maxNew := range []int{64, 3} {
		resp, err := c.Sample(context.Background(), sglang.SampleRequest{RID: "g000000003-t1-a1", InputIDs: prompt, Params: sglang.SampleParams{MaxNewTokens: maxNew, Seed: &seed}})
		if err != nil {
			t.Fatal(err)
		}
		want, wantFinish := simulator.Reply(prompt, seed, maxNew, cfg.Simulator)
		text := simulator.ReplyContent(prompt, seed, cfg.Simulator)
		if wantFinish == "length" {
			text = text[:maxNew]
		}
		if !slices.Equal(resp.OutputIDs, want) || resp.Finish != wantFinish || resp.Text != text || !slices.Equal(simulator.Tokenize(resp.Text), want[:len(text)]) {
			t.Fatalf("max_new_tokens %d: %+v, want ids %v finish %s text %q", maxNew, resp, want, wantFinish, text)
		}
		if wantFinish == "stop" && (resp.Matched == nil || *resp.Matched != simulator.ChatIMEnd) {
			t.Fatalf("a stop without the matched <|im_end|>: %+v", resp)
		}
	}
	if entries, _ := os.ReadDir(cfg.ShmDir); slices.ContainsFunc(entries, func(e os.DirEntry) bool { return strings.HasSuffix(e.Name(), ".safetensors") }) {
		t.Fatalf("a generation request left a dump: %v", entries)
	}
	if b, _ := os.ReadFile(cfg.RequestLog); strings.Count(string(b), "g000000003-t1-a1 ") != 2 {
		t.Fatalf("request log:\n%s", b)
	}
	// Another seed, another reply; a prompt past the context length is refused.
	other := seed + 1
	if a, b := simulator.ReplyContent(prompt, seed, cfg.Simulator), simulator.ReplyContent(prompt, other, cfg.Simulator); a == b {
		t.Fatalf("seeds %d and %d give the same reply %q", seed, other, a)
	}
	cfg2 := baseConfig(t)
	cfg2.ContextLength = 5
	base2, _ := start(t, cfg2)
	_, err := sglang.NewClient(base2, sglang.ClientOptions{}).Sample(context.Background(), sglang.SampleRequest{RID: "g1", InputIDs: prompt, Params: sglang.SampleParams{MaxNewTokens: 4}})
	var se *sglang.StatusError
	if err == nil || !strings.Contains(err.Error(), "context length") || !errors.As(err, &se) || se.Status != http.StatusBadRequest {
		t.Fatalf("a prompt past the context length: %v", err)
	}
}
