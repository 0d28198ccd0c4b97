package main

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/extract-dev/extract/internal/testsupport"
)

// contractTokens is the simulator's chat contract computed here, from the contract's
// words alone (docs/dataset.md), not by the code under test: <|im_start|> 1, <|im_end|>
// 2, byte b → b+3; "<|im_start|>{role}\n{content}<|im_end|>\n" per message; the loss is
// an assistant's content and its <|im_end|>.
func contractTokens(turns [][2]string) sample {
	var s sample
	add := func(m int64, ids ...int64) {
		s.ids = append(s.ids, ids...)
		for range ids {
			s.mask = append(s.mask, m)
		}
	}
	bytesOf := func(x string) []int64 {
		var out []int64
		for _, b := range []byte(x) {
			out = append(out, int64(b)+3)
		}
		return out
	}
	for _, t := range turns {
		m := int64(0)
		if t[0] == "assistant" {
			m = 1
		}
		add(0, 1)
		add(0, bytesOf(t[0]+"\n")...)
		add(m, bytesOf(t[1])...)
		add(m, 2)
		add(0, '\n'+3)
	}
	return s
}

type convCase struct {
	line  int
	id    string
	turns [][2]string // nil: the line must be refused
}

// writeConversations writes n lines: ShareGPT and OpenAI conversations, multi-turn,
// some with a system turn, and every 50th line one that must be refused (no assistant
// turn, an unknown role, invalid UTF-8, in turn).
func writeConversations(t *testing.T, path string, n int) []convCase {
	t.Helper()
	r := rand.New(rand.NewSource(int64(n)))
	var buf bytes.Buffer
	var cases []convCase
	words := []string{"alpha", "beta", "gamma", "δέλτα", "ünïcode", "tokens", "mask", "turn", "✓", "end"}
	text := func(k int) string {
		var b strings.Builder
		for i := range k {
			if i > 0 {
				b.WriteByte(' ')
			}
			b.WriteString(words[r.Intn(len(words))])
		}
		return b.String()
	}
	for i := range n {
		line := i + 1
		id := fmt.Sprintf("conv-%04d", i)
		if i%50 == 7 {
			switch (i / 50) % 3 {
			case 0:
				fmt.Fprintf(&buf, `{"id":%q,"messages":[{"role":"user","content":"anyone?"}]}`+"\n", id)
			case 1:
				fmt.Fprintf(&buf, `{"id":%q,"conversations":[{"from":"narrator","value":"x"},{"from":"gpt","value":"y"}]}`+"\n", id)
			case 2:
				fmt.Fprintf(&buf, "{\"id\":%q,\"data\":[\"bad \xff byte\",\"y\"]}\n", id)
			}
			cases = append(cases, convCase{line: line, id: id})
			continue
		}
		var turns [][2]string
		if r.Intn(2) == 0 {
			turns = append(turns, [2]string{"system", "system " + text(3)})
		}
		for range 1 + r.Intn(3) {
			turns = append(turns, [2]string{"user", text(2 + r.Intn(8))}, [2]string{"assistant", text(5 + r.Intn(30))})
		}
		var b []byte
		if i%2 == 0 {
			from := map[string]string{"system": "system", "user": "human", "assistant": "gpt"}
			var conv []map[string]string
			for _, t := range turns {
				conv = append(conv, map[string]string{"from": from[t[0]], "value": t[1]})
			}
			b, _ = json.Marshal(map[string]any{"id": id, "conversations": conv})
		} else {
			var msgs []map[string]string
			for _, t := range turns {
				msgs = append(msgs, map[string]string{"role": t[0], "content": t[1]})
			}
			b, _ = json.Marshal(map[string]any{"conversation_id": id, "messages": msgs})
		}
		buf.Write(append(b, '\n'))
		cases = append(cases, convCase{line: line, id: id, turns: turns})
	}
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return cases
}

// killWhen starts `extract run --resume`, SIGKILLs it once cond holds, and says whether
// it did (false: the run ended first).
func (j *job) killWhen(cond func() bool) bool {
	j.t.Helper()
	cmd := j.command("run", "--resume")
	var errb bytes.Buffer
	cmd.Stderr = &errb
	if err := cmd.Start(); err != nil {
		j.t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	deadline := time.After(5 * time.Minute)
	for {
		select {
		case <-exited:
			j.t.Logf("the run ended before the kill:\n%s", errb.String())
			return false
		case <-deadline:
			cmd.Process.Kill()
			<-exited
			j.t.Fatal("the kill condition never held")
		default:
		}
		if cond() {
			cmd.Process.Signal(syscall.SIGKILL)
			<-exited
			return true
		}
		time.Sleep(time.Millisecond)
	}
}

// safetensorsMetadata reads a safetensors file's __metadata__ on its own.
func safetensorsMetadata(t *testing.T, path string) map[string]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var n [8]byte
	if _, err := io.ReadFull(f, n[:]); err != nil {
		t.Fatal(err)
	}
	hdr := make([]byte, binary.LittleEndian.Uint64(n[:]))
	if _, err := io.ReadFull(f, hdr); err != nil {
		t.Fatal(err)
	}
	var h struct {
		Metadata map[string]string `json:"__metadata__"`
	}
	if err := json.Unmarshal(hdr, &h); err != nil {
		t.Fatal(err)
	}
	return h.Metadata
}

type prepManifest struct {
	Chunks   []json.RawMessage `json:"chunks"`
	Complete bool              `json:"complete"`
}

func (j *job) manifest() (prepManifest, bool) {
	b, err := os.ReadFile(filepath.Join(j.state, "prepare", "manifest.json"))
	if err != nil {
		return prepManifest{}, false
	}
	var m prepManifest
	if err := json.Unmarshal(b, &m); err != nil {
		j.t.Fatalf("manifest.json under its final name does not parse: %v", err)
	}
	return m, true
}

func (j *job) outputFiles() int {
	n := 0
	filepath.WalkDir(j.out, func(path string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasPrefix(filepath.Base(path), "data_") && strings.HasSuffix(path, ".safetensors") {
			n++
		}
		return nil
	})
	return n
}

func TestConversationJobKilledDuringPrepareAndTheRunFinishesWithTheContractsTokens(t *testing.T) {
	j := newJob(t, 1, 150000)
	cases := writeConversations(t, j.dataset, 600)
	j.samples = nil
	for _, c := range cases {
		if c.turns != nil {
			j.samples = append(j.samples, contractTokens(c.turns))
		}
	}
	// Small chunks: many durable steps, so the kill lands between two of them.
	j.env = append(j.env, "EXTRACT_PREPARE_CHUNK_LINES=4", "EXTRACT_VOCAB_DRAFT_SIZE=64")

	if !j.killWhen(func() bool { m, ok := j.manifest(); return ok && len(m.Chunks) > 0 && !m.Complete }) {
		t.Fatal("prepare finished before it could be killed: the test killed nothing")
	}
	if m, _ := j.manifest(); m.Complete || j.outputFiles() > 0 {
		t.Fatalf("after the kill in prepare: complete %v, %d output files", m.Complete, j.outputFiles())
	}
	killedRun := j.killWhen(func() bool { n := j.outputFiles(); return n >= 40 })
	if !killedRun {
		t.Fatal("the run finished before it could be killed")
	}
	if n := j.outputFiles(); n >= len(j.samples) {
		t.Fatalf("killed with all %d files written: the kill tested nothing", n)
	}
	res := j.run("run", "--resume")
	if res.code != 0 {
		t.Fatalf("resume: exit %d\n%s", res.code, res.stderr)
	}

	// The prepared dataset: one record per accepted line, in file order, with the line's
	// id and number; the refused lines listed with their reasons.
	f, err := os.Open(filepath.Join(j.state, "prepare", "dataset.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 16<<20)
	k := 0
	for _, c := range cases {
		if c.turns == nil {
			continue
		}
		if !sc.Scan() {
			t.Fatalf("the prepared dataset ends before line %d", c.line)
		}
		var rec struct {
			IDs  []int64 `json:"input_ids"`
			Mask []int64 `json:"loss_mask"`
			ID   string  `json:"id"`
			Line int     `json:"line"`
		}
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			t.Fatal(err)
		}
		want := j.samples[k]
		if rec.ID != c.id || rec.Line != c.line || fmt.Sprint(rec.IDs) != fmt.Sprint(want.ids) || fmt.Sprint(rec.Mask) != fmt.Sprint(want.mask) {
			t.Fatalf("sample %d: id %q line %d, want %q line %d; ids or mask differ from the contract: %v", k, rec.ID, rec.Line, c.id, c.line,
				fmt.Sprint(rec.IDs) != fmt.Sprint(want.ids))
		}
		k++
	}
	if sc.Scan() {
		t.Fatalf("the prepared dataset has more than %d records", k)
	}
	refused := mustRead(t, filepath.Join(j.state, "prepare", "refused.jsonl"))
	for _, reason := range []string{`"reason":"no_assistant_turn"`, `"reason":"unknown_role"`, `"reason":"invalid_utf8"`, `"line":8,`} {
		if !strings.Contains(refused, reason) {
			t.Fatalf("refused.jsonl lacks %s:\n%s", reason, refused)
		}
	}
	if n := strings.Count(refused, "\n"); n != len(cases)-len(j.samples) {
		t.Fatalf("refused.jsonl lists %d lines, %d were bad", n, len(cases)-len(j.samples))
	}

	// Every output file once, with the contract's ids and mask and the simulator's rows,
	// and its conversation's id in the metadata (read from the header here: 8 bytes of
	// length, then JSON).
	var ids []string
	for _, c := range cases {
		if c.turns != nil {
			ids = append(ids, c.id)
		}
	}
	for i, s := range j.samples {
		path := j.layout().Path(i)
		if err := j.checkFile(path, i, s); err != nil {
			t.Fatalf("sample %d: %v", i, err)
		}
		if got := safetensorsMetadata(t, path)["source_id"]; got != ids[i] {
			t.Fatalf("sample %d: source_id %q in %s, want %q", i, got, path, ids[i])
		}
	}
	if n := j.outputFiles(); n != len(j.samples) {
		t.Fatalf("%d output files for %d accepted conversations", n, len(j.samples))
	}
	for _, name := range []string{"vocab_mapping.pt", "token_freq.pt"} {
		if _, err := os.Stat(filepath.Join(j.out, "vocab_mapping", name)); err != nil {
			t.Fatalf("no draft vocabulary at the job's end: %v", err)
		}
	}
	checkVocabAgainstSpecForge(t, filepath.Join(j.out, "vocab_mapping"), filepath.Join(j.state, "prepare", "dataset.jsonl"), 64, 259)
	st := j.status()
	if st["state"] != "complete" || int(st["done"].(float64)) != len(j.samples) {
		t.Fatalf("status %v", st)
	}
	if p, _ := st["prepare"].(map[string]any); p == nil || int(p["refused"].(float64)) != len(cases)-len(j.samples) || int(p["accepted"].(float64)) != len(j.samples) {
		t.Fatalf("status's prepare: %v", st["prepare"])
	}

	// status traces a sample to its conversation and back, done before the kill or after.
	for _, i := range []int{0, len(j.samples) / 2, len(j.samples) - 1} {
		var got []struct {
			Sample   int    `json:"sample"`
			State    string `json:"state"`
			SourceID string `json:"source_id"`
			File     string `json:"file"`
		}
		res := j.run("status", "--sample", fmt.Sprint(i), "--json")
		if res.code != 0 || json.Unmarshal([]byte(res.stdout), &got) != nil || len(got) != 1 ||
			got[0].State != "done" || got[0].SourceID != ids[i] || got[0].File != j.layout().Path(i) {
			t.Fatalf("status --sample %d: exit %d %s %s, want done from %q in %s", i, res.code, res.stdout, res.stderr, ids[i], j.layout().Path(i))
		}
		res = j.run("status", "--source-id", ids[i], "--json")
		if res.code != 0 || json.Unmarshal([]byte(res.stdout), &got) != nil || len(got) != 1 || got[0].Sample != i {
			t.Fatalf("status --source-id %s: exit %d %s %s, want sample %d", ids[i], res.code, res.stdout, res.stderr, i)
		}
	}
	// verify reads the samples from the prepared file, as the run did, not from the
	// conversations (it refused every conversation job: "missing input_ids").
	if res := j.run("verify", "--deep"); res.code != 0 || !strings.Contains(res.stdout, fmt.Sprintf("checked %d: %d ok", len(j.samples), len(j.samples))) {
		t.Fatalf("verify --deep of a conversation job: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
	for _, args := range [][]string{{"--sample", fmt.Sprint(len(j.samples))}, {"--source-id", "no-such-conversation"}} {
		if res := j.run(append([]string{"status"}, args...)...); res.code != 2 || !strings.Contains(res.stderr, strings.TrimPrefix(args[1], "no-such-")) {
			t.Fatalf("status %v: exit %d %s, want 2 naming it", args, res.code, res.stderr)
		}
	}
}

func TestAResumeWithAChangedChatOptionIsRefusedNamingIt(t *testing.T) {
	j := newJob(t, 1, 0)
	writeConversations(t, j.dataset, 30)
	if res := j.run("run"); res.code != 0 {
		t.Fatalf("run: exit %d\n%s", res.code, res.stderr)
	}
	j.env = append(j.env, "EXTRACT_PREPARE_END_OF_TURN=exclude")
	res := j.run("run", "--resume")
	if res.code != 2 || !strings.Contains(res.stderr, "the prepare options") {
		t.Fatalf("resume with another end-of-turn convention: exit %d\n%s", res.code, res.stderr)
	}
}

func TestPrepareShowMarksTheLossInAPipe(t *testing.T) {
	j := newJob(t, 1, 0)
	writeConversations(t, j.dataset, 3)
	res := j.run("prepare", "--show", "2")
	if res.code != 0 || !strings.Contains(res.stdout, "<|im_start|>assistant\n[[") || !strings.Contains(res.stdout, "<|im_end|>]]") {
		t.Fatalf("exit %d\n%s\n%s", res.code, res.stdout, res.stderr)
	}
}

func TestAConversationRunWithAnUnusableTokenizerFolderIsRefusedBeforeAnyServer(t *testing.T) {
	j := newJob(t, 1, 0)
	writeConversations(t, j.dataset, 5)
	model := t.TempDir()
	os.WriteFile(filepath.Join(model, "config.json"), []byte(`{"vocab_size": 1000}`), 0o644) // weights' config, no tokenizer
	j.env = append(j.env, "EXTRACT_SERVER_KIND=transformers", "EXTRACT_SERVER_MODEL_PATH="+model)
	res := j.run("run")
	if res.code != 3 || !strings.Contains(res.stderr, "has no tokenizer.json") {
		t.Fatalf("exit %d\n%s", res.code, res.stderr)
	}
	if _, err := os.Stat(filepath.Join(j.state, "server.json")); err == nil {
		t.Fatal("a server was launched")
	}
	if res := j.run("doctor"); res.code != 3 || !strings.Contains(res.stdout+res.stderr, "tokenizer") {
		t.Fatalf("doctor: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
}

// checkVocabAgainstSpecForge loads the job's vocab_mapping in Debian's torch and compares
// it with SpecForge's process_token_dict_to_mappings on the same samples
// (scripts/check_vocab_mapping.py). A subtest: without torch or SpecForge's source it
// skips on a laptop and fails where CI requires them.
func checkVocabAgainstSpecForge(t *testing.T, vocabDir, samples string, draft, target int) {
	t.Run("vocabulary equals SpecForge's", func(t *testing.T) {
		testsupport.Require(t, testsupport.Torch)
		src, _ := filepath.Abs("../../../shared/specforge-src")
		if _, err := os.Stat(filepath.Join(src, "specforge/data/preprocessing.py")); err != nil {
			testsupport.Unavailable(t, testsupport.SGLangSrc, "SpecForge source absent at %s", src)
		}
		out, err := exec.Command("/usr/bin/python3", "../../scripts/check_vocab_mapping.py", vocabDir, "--samples", samples,
			"--draft", strconv.Itoa(draft), "--target", strconv.Itoa(target), "--specforge", src).CombinedOutput()
		if err != nil {
			t.Fatalf("the vocabulary differs from SpecForge's: %v\n%s", err, out)
		}
	})
}
