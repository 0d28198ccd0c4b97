package prepare

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/extract-dev/extract/internal/conversation"
)

// simIDs computes the simulator contract on its own (not through simulator.ChatEncode):
// <|im_start|>=1, <|im_end|>=2, byte b → b+3; the mask covers an assistant's content and
// its <|im_end|>.
func simIDs(turns [][2]string) (ids, mask []int64) {
	for _, t := range turns {
		ids = append(ids, 1)
		mask = append(mask, 0)
		for _, b := range []byte(t[0] + "\n") {
			ids, mask = append(ids, int64(b)+3), append(mask, 0)
		}
		m := int64(0)
		if t[0] == "assistant" {
			m = 1
		}
		for _, b := range []byte(t[1]) {
			ids, mask = append(ids, int64(b)+3), append(mask, m)
		}
		ids, mask = append(ids, 2, 13), append(mask, m, 0)
	}
	return ids, mask
}

type record struct {
	InputIDs []int64 `json:"input_ids"`
	LossMask []int64 `json:"loss_mask"`
	ID       string  `json:"id"`
	Line     int     `json:"line"`
}

func readRecords(t *testing.T, path string) []record {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []record
	for _, l := range bytes.Split(bytes.TrimSpace(b), []byte("\n")) {
		var r record
		if err := json.Unmarshal(l, &r); err != nil {
			t.Fatalf("%s: %v", l, err)
		}
		out = append(out, r)
	}
	return out
}

func writeConversations(t *testing.T, n int) (string, map[int][][2]string) {
	t.Helper()
	var b strings.Builder
	want := map[int][][2]string{}
	for i := range n {
		line := i + 1
		switch i % 4 {
		case 0:
			fmt.Fprintf(&b, `{"id":"sg-%d","conversations":[{"from":"system","value":"sys %d"},{"from":"human","value":"q%d"},{"from":"gpt","value":"a%d"},{"from":"human","value":"again"},{"from":"gpt","value":"é%d"}]}`+"\n", i, i, i, i, i)
			want[line] = [][2]string{{"system", fmt.Sprintf("sys %d", i)}, {"user", fmt.Sprintf("q%d", i)}, {"assistant", fmt.Sprintf("a%d", i)}, {"user", "again"}, {"assistant", fmt.Sprintf("é%d", i)}}
		case 1:
			fmt.Fprintf(&b, `{"conversation_id":%d,"messages":[{"role":"user","content":"hi %d"},{"role":"assistant","content":"yo"}]}`+"\n", i, i)
			want[line] = [][2]string{{"user", fmt.Sprintf("hi %d", i)}, {"assistant", "yo"}}
		case 2:
			b.WriteString(`{"messages":[{"role":"user","content":"nobody answers"}]}` + "\n")
		case 3:
			fmt.Fprintf(&b, `{"id":"u%d","data":["x","y%d"]}`+"\n", i, i)
			want[line] = [][2]string{{"user", "x"}, {"assistant", fmt.Sprintf("y%d", i)}}
		}
	}
	p := filepath.Join(t.TempDir(), "conv.jsonl")
	if err := os.WriteFile(p, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return p, want
}

func options(from, dir string) Options {
	return Options{From: from, Dir: dir, Format: conversation.Auto, Policy: conversation.DefaultPolicy(),
		Length: Length{OnLong: "truncate", MinLossTokens: 1}, Batch: 3, ChunkLines: 10}
}

func TestPrepareWritesTheSimulatorContractAndListsRefusals(t *testing.T) {
	from, want := writeConversations(t, 41)
	dir := t.TempDir()
	sum, err := Run(context.Background(), options(from, dir), Simulator{EndOfTurn: true, N: 3})
	if err != nil {
		t.Fatal(err)
	}
	recs := readRecords(t, sum.Dataset)
	if len(recs) != len(want) || sum.Counts.Accepted != len(want) || sum.Counts.Refused[string(conversation.NoAssistant)] != 10 || sum.Counts.Lines != 41 {
		t.Fatalf("%d records, counts %+v, want %d accepted and 10 refused", len(recs), sum.Counts, len(want))
	}
	prev := 0
	for _, r := range recs {
		if r.Line <= prev {
			t.Fatalf("line %d after %d: not in file order", r.Line, prev)
		}
		prev = r.Line
		ids, mask := simIDs(want[r.Line])
		if fmt.Sprint(r.InputIDs) != fmt.Sprint(ids) || fmt.Sprint(r.LossMask) != fmt.Sprint(mask) {
			t.Fatalf("line %d:\n ids %v\nmask %v\nwant %v\n     %v", r.Line, r.InputIDs, r.LossMask, ids, mask)
		}
		wantID := map[int]string{0: fmt.Sprintf("sg-%d", r.Line-1), 1: fmt.Sprint(r.Line - 1), 3: fmt.Sprintf("u%d", r.Line-1)}[(r.Line-1)%4]
		if r.ID != wantID {
			t.Fatalf("line %d id %q, want %q", r.Line, r.ID, wantID)
		}
	}
	refused, _ := os.ReadFile(sum.Refused)
	if n := bytes.Count(refused, []byte("\n")); n != 10 || !bytes.Contains(refused, []byte(`"line":3,`)) {
		t.Fatalf("refused.jsonl has %d lines:\n%s", n, refused)
	}
	again, err := Run(context.Background(), options(from, dir), Simulator{EndOfTurn: true, N: 3})
	if err != nil || !again.AlreadyDone || again.Counts.Accepted != len(want) {
		t.Fatalf("second run: %+v, %v", again, err)
	}
}

// stopAtChunk stops the run between chunks: batches of the first chunks chunks are
// encoded, and a batch of a later one waits until the manifest in dir lists those
// chunks, then cancels the run. (Counting batches instead once stopped a run whose
// first chunk still waited on a worker slow to take its batch.)
type stopAtChunk struct {
	Simulator
	dir    string
	chunks int
	cancel context.CancelFunc
}

func (s *stopAtChunk) Encode(ctx context.Context, w int, convs []conversation.Conversation) ([]conversation.Result, error) {
	if (convs[0].Line-1)/10 < s.chunks { // options' ChunkLines
		return s.Simulator.Encode(ctx, w, convs)
	}
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if m, ok, err := ReadManifest(s.dir); err == nil && ok && len(m.Chunks) >= s.chunks {
			break
		}
	}
	s.cancel()
	return nil, ctx.Err()
}

func TestPrepareResumesAfterAStopAndMatchesAnUninterruptedRun(t *testing.T) {
	from, _ := writeConversations(t, 95)
	clean := t.TempDir()
	if _, err := Run(context.Background(), options(from, clean), Simulator{EndOfTurn: true, N: 2}); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	tok := &stopAtChunk{Simulator: Simulator{EndOfTurn: true, N: 2}, dir: dir, chunks: 1, cancel: cancel}
	if _, err := Run(ctx, options(from, dir), tok); !errors.Is(err, context.Canceled) {
		t.Fatalf("stopped run: %v", err)
	}
	m, ok, err := ReadManifest(dir)
	if err != nil || !ok || len(m.Chunks) == 0 || m.Complete {
		t.Fatalf("after the stop the manifest lists %d chunks (complete %v, %v): the test stops nothing mid-way", len(m.Chunks), m.Complete, err)
	}
	sum, err := Run(context.Background(), options(from, dir), Simulator{EndOfTurn: true, N: 2})
	if err != nil {
		t.Fatal(err)
	}
	if sum.Resumed != len(m.Chunks) {
		t.Fatalf("resumed %d chunks, the manifest had %d", sum.Resumed, len(m.Chunks))
	}
	a, _ := os.ReadFile(filepath.Join(clean, DatasetName))
	b, _ := os.ReadFile(sum.Dataset)
	if !bytes.Equal(a, b) {
		t.Fatal("the resumed dataset differs from the uninterrupted one")
	}
}

func TestPrepareRedoesADamagedChunkAndALostDataset(t *testing.T) {
	from, _ := writeConversations(t, 60)
	clean := t.TempDir()
	if _, err := Run(context.Background(), options(from, clean), Simulator{EndOfTurn: true}); err != nil {
		t.Fatal(err)
	}
	good, _ := os.ReadFile(filepath.Join(clean, DatasetName))
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	if _, err := Run(ctx, options(from, dir), &stopAtChunk{Simulator: Simulator{EndOfTurn: true}, dir: dir, chunks: 2, cancel: cancel}); !errors.Is(err, context.Canceled) {
		t.Fatalf("stopped run: %v", err)
	}
	if m, _, _ := ReadManifest(dir); len(m.Chunks) < 2 {
		t.Fatalf("the stop left %d chunks: nothing to damage", len(m.Chunks))
	}
	if err := os.WriteFile(chunkPath(dir, 1, false), []byte("{}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Run(context.Background(), options(from, dir), Simulator{EndOfTurn: true}); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(filepath.Join(dir, DatasetName)); !bytes.Equal(got, good) {
		t.Fatal("the damaged chunk reached the dataset")
	}
	if left, _ := filepath.Glob(filepath.Join(dir, "chunks", "*")); len(left) != 0 {
		t.Fatalf("chunks left after the dataset was assembled: %v", left)
	}
	os.Remove(filepath.Join(dir, DatasetName))
	sum, err := Run(context.Background(), options(from, dir), Simulator{EndOfTurn: true})
	if err != nil || sum.AlreadyDone || sum.Counts.Lines != 60 {
		t.Fatalf("after the dataset was lost: %+v, %v", sum, err)
	}
	if got, _ := os.ReadFile(filepath.Join(dir, DatasetName)); !bytes.Equal(got, good) {
		t.Fatal("the dataset prepared again differs")
	}
}

func TestPrepareRefusesToResumeWithOtherOptionsNamingThem(t *testing.T) {
	from, _ := writeConversations(t, 8)
	dir := t.TempDir()
	if _, err := Run(context.Background(), options(from, dir), Simulator{EndOfTurn: true}); err != nil {
		t.Fatal(err)
	}
	o := options(from, dir)
	o.Length.MaxTokens = 10
	_, err := Run(context.Background(), o, Simulator{EndOfTurn: true})
	if !errors.Is(err, ErrChanged) || !strings.Contains(err.Error(), "the prepare options") || strings.Contains(err.Error(), "tokenizer") {
		t.Fatalf("err = %v", err)
	}
	if err := os.WriteFile(from, append(must(os.ReadFile(from)), `{"data":["p","q"]}`+"\n"...), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = Run(context.Background(), options(from, dir), Simulator{EndOfTurn: true})
	if !errors.Is(err, ErrChanged) || !strings.Contains(err.Error(), "the conversation file") {
		t.Fatalf("err = %v", err)
	}
}

func TestPrepareStrictStopsAtTheFirstRefusedLine(t *testing.T) {
	from, _ := writeConversations(t, 8)
	o := options(from, t.TempDir())
	o.Strict = true
	_, err := Run(context.Background(), o, Simulator{EndOfTurn: true})
	if !errors.Is(err, ErrBadInput) || !strings.Contains(err.Error(), "line 3") || !strings.Contains(err.Error(), string(conversation.NoAssistant)) {
		t.Fatalf("err = %v", err)
	}
}

func must(b []byte, err error) []byte {
	if err != nil {
		panic(err)
	}
	return b
}
