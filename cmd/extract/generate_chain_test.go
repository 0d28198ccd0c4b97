package main

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// The whole data stage from one cron line: conversations → generate → run (the
// generated file is pre-tokenized, and prepare of it as a conversation file gives the
// same tokens) → SpecForge files and the draft vocabulary, killed in each stage.
func TestRunWithGenerateGoesFromConversationsToExtractedFilesThroughKills(t *testing.T) {
	g := genContract{seed: 3, replyTokens: 60, emptyEvery: 0, maxNew: 2048, maxAttempts: 3}
	j, _, want := newGenerateJob(t, 240, g)
	j.env = append(j.env, "EXTRACT_GENERATE_ENABLED=true", "EXTRACT_VOCAB_DRAFT_SIZE=64",
		"EXTRACT_SERVER_SIMULATOR_DECODE_DELAY=2ms", "EXTRACT_SERVER_SIMULATOR_TOKENS_PER_SECOND=150000")
	j.samples = nil
	for _, w := range want {
		j.samples = append(j.samples, w.sample)
	}
	genIndex := filepath.Join(j.state, "generate", "index.db")
	generated := filepath.Join(j.state, "generate", "generated.jsonl")
	// Killed while generating: the index exists, the output does not.
	if !j.killWhen(func() bool {
		st, err := os.Stat(genIndex)
		return err == nil && st.Size() > 64<<10
	}) {
		t.Fatal("generate finished before it could be killed")
	}
	if _, err := os.Stat(generated); err == nil {
		t.Fatal("the generated file exists after a kill during generate")
	}
	// Killed while extracting.
	if !j.killWhen(func() bool { return j.outputFiles() >= 30 }) {
		t.Fatal("the run finished before it could be killed while extracting")
	}
	if n := j.outputFiles(); n >= len(j.samples) {
		t.Fatalf("killed with all %d files written", n)
	}
	deadline := time.Now().Add(3 * time.Minute)
	for {
		res := j.run("run", "--resume")
		if res.code == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("resume: exit %d\n%s", res.code, res.stderr)
		}
	}
	checkGenerated(t, readGenerated(t, generated), want)
	for i, s := range j.samples {
		if err := j.checkFile(j.layout().Path(i), i, s); err != nil {
			t.Fatalf("sample %d: %v", i, err)
		}
	}
	if n := j.outputFiles(); n != len(j.samples) {
		t.Fatalf("%d output files for %d generated conversations", n, len(j.samples))
	}
	for _, name := range []string{"vocab_mapping.pt", "token_freq.pt"} {
		if _, err := os.Stat(filepath.Join(j.out, "vocab_mapping", name)); err != nil {
			t.Fatalf("no draft vocabulary at the job's end: %v", err)
		}
	}
	checkVocabAgainstSpecForge(t, filepath.Join(j.out, "vocab_mapping"), generated, 64, 259)
	// The generated file is a conversation file too: prepare renders it to the same tokens.
	prep := filepath.Join(j.dir, "prep")
	if res := j.run("prepare", "--from", generated, "--to", prep); res.code != 0 {
		t.Fatalf("prepare of the generated file: exit %d\n%s", res.code, res.stderr)
	}
	f, err := os.Open(filepath.Join(prep, "dataset.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 16<<20)
	for k := 0; sc.Scan(); k++ {
		var rec struct {
			IDs  []int64 `json:"input_ids"`
			Mask []int64 `json:"loss_mask"`
		}
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			t.Fatal(err)
		}
		if k >= len(j.samples) || !slices.Equal(rec.IDs, j.samples[k].ids) || !slices.Equal(rec.Mask, j.samples[k].mask) {
			t.Fatalf("prepare of the generated file: sample %d differs from generate's tokens", k)
		}
	}
}
