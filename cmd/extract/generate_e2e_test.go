package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The simulator's generation contract computed here from its words (docs/generate.md),
// not by the code under test: h = mix(seed ^ golden), then h = mix((h ^ id) + golden)
// per prompt id; empty when (h>>32) % empty_every == 0; else 1 + h % reply_tokens bytes
// from "abcdefghijklmnopqrstuvwxyz ." by the LCG x = x*6364136223846793005 +
// 1442695040888963407, byte (x>>33) % 28; then <|im_end|>; cut at max_new_tokens.
func contractMix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

type genContract struct {
	seed        int64
	replyTokens int
	emptyEvery  int
	maxNew      int
	maxAttempts int
	ctxLen      int // server.simulator.context_length: a longer prompt is refused (400)
}

// reply is the content the simulator generates for prompt with seed, cut at maxNew.
func (g genContract) reply(prompt []int64, seed int64) (text string, cut bool) {
	const golden = 0x9e3779b97f4a7c15
	h := contractMix(uint64(seed) ^ golden)
	for _, id := range prompt {
		h = contractMix((h ^ uint64(id)) + golden)
	}
	content := ""
	if g.emptyEvery == 0 || (h>>32)%uint64(g.emptyEvery) != 0 {
		n := 1 + int(h%uint64(g.replyTokens))
		x := h
		var b strings.Builder
		for range n {
			x = x*6364136223846793005 + 1442695040888963407
			b.WriteByte("abcdefghijklmnopqrstuvwxyz ."[(x>>33)%28])
		}
		content = b.String()
	}
	if len(content)+1 > g.maxNew {
		return content[:g.maxNew], true
	}
	return content, false
}

// genExpect is one conversation as the output must hold it; dropped ones are absent.
type genExpect struct {
	id      string
	turns   [][2]string
	sample  sample
	dropped bool
	failed  bool // a prompt past ctxLen: the server refuses it every time
}

// expect regenerates c by the contract: each assistant turn from the contract's prompt
// of the regenerated history; an empty reply (none, or only whitespace) is sent again with the next seed (the
// default on_empty: retry) and the conversation dropped once max_attempts are spent.
func (g genContract) expect(c convCase) genExpect {
	var hist [][2]string
	last := 0
	for i, t := range c.turns {
		if t[0] == "assistant" {
			last = i
		}
	}
	for _, t := range c.turns[:last+1] {
		if t[0] != "assistant" {
			hist = append(hist, t)
			continue
		}
		prompt := append(contractTokens(hist).ids, 1)
		for _, b := range []byte("assistant\n") {
			prompt = append(prompt, int64(b)+3)
		}
		if g.ctxLen > 0 && len(prompt) > g.ctxLen {
			return genExpect{id: c.id, failed: true}
		}
		text := ""
		for a := range g.maxAttempts {
			text, _ = g.reply(prompt, g.seed+int64(a))
			if strings.TrimSpace(text) != "" {
				break
			}
		}
		if strings.TrimSpace(text) == "" {
			return genExpect{id: c.id, dropped: true}
		}
		hist = append(hist, [2]string{"assistant", text})
	}
	return genExpect{id: c.id, turns: hist, sample: contractTokens(hist)}
}

type genLine struct {
	ID       string `json:"id"`
	Messages []struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	} `json:"messages"`
	InputIDs []int64 `json:"input_ids"`
	LossMask []int64 `json:"loss_mask"`
}

// readGenerated reads the output, failing on a line that does not parse (a partial one).
func readGenerated(t *testing.T, path string) []genLine {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []genLine
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<26)
	for sc.Scan() {
		var l genLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("%s line %d does not parse: %v", path, len(out)+1, err)
		}
		out = append(out, l)
	}
	return out
}

// checkGenerated compares the output with the contract: every accepted, undropped
// conversation once, in input order, with the contract's reply, ids and mask.
func checkGenerated(t *testing.T, got []genLine, want []genExpect) {
	t.Helper()
	var keep []genExpect
	for _, w := range want {
		if !w.dropped && !w.failed {
			keep = append(keep, w)
		}
	}
	if len(got) != len(keep) {
		t.Fatalf("output has %d lines, the contract %d", len(got), len(keep))
	}
	for i, w := range keep {
		g := got[i]
		if g.ID != w.id {
			t.Fatalf("line %d: id %q, want %q (order or a duplicate)", i+1, g.ID, w.id)
		}
		var turns [][2]string
		for _, m := range g.Messages {
			turns = append(turns, [2]string{m.Role, m.Content})
		}
		if !slices.Equal(turns, w.turns) {
			t.Fatalf("line %d (%s): messages %q, want %q", i+1, w.id, turns, w.turns)
		}
		if !slices.Equal(g.InputIDs, w.sample.ids) || !slices.Equal(g.LossMask, w.sample.mask) {
			t.Fatalf("line %d (%s): input_ids/loss_mask differ from the contract\n got %v\nwant %v\n got %v\nwant %v", i+1, w.id, g.InputIDs, w.sample.ids, g.LossMask, w.sample.mask)
		}
	}
}

// generationRequests counts the simulator's generation requests (g-rids) in its log.
func (j *job) generationRequests() int {
	n := 0
	for _, rid := range j.requests() {
		if strings.HasPrefix(rid, "g") {
			n++
		}
	}
	return n
}

// newGenerateJob is a job over n conversations (every 50th refused) with the generate
// keys of contract g.
func newGenerateJob(t *testing.T, n int, g genContract) (*job, []convCase, []genExpect) {
	j := newJob(t, 1, 0)
	cases := writeConversations(t, j.dataset, n)
	var want []genExpect
	for _, c := range cases {
		if c.turns != nil {
			want = append(want, g.expect(c))
		}
	}
	j.env = append(j.env,
		fmt.Sprintf("EXTRACT_GENERATE_SEED=%d", g.seed),
		fmt.Sprintf("EXTRACT_GENERATE_MAX_NEW_TOKENS=%d", g.maxNew),
		fmt.Sprintf("EXTRACT_GENERATE_MAX_ATTEMPTS=%d", g.maxAttempts),
		fmt.Sprintf("EXTRACT_SERVER_SIMULATOR_REPLY_TOKENS=%d", g.replyTokens),
		fmt.Sprintf("EXTRACT_SERVER_SIMULATOR_EMPTY_EVERY=%d", g.emptyEvery),
		fmt.Sprintf("EXTRACT_SERVER_SIMULATOR_CONTEXT_LENGTH=%d", g.ctxLen),
		"EXTRACT_GENERATE_MAX_INFLIGHT=8",
	)
	return j, cases, want
}

func (j *job) generated() string { return filepath.Join(j.dir, "generated.jsonl") }

// startGenerate starts `extract generate --resume` in the background.
func (j *job) startGenerate(extra ...string) (*exec.Cmd, *bytes.Buffer, chan struct{}) {
	j.t.Helper()
	cmd := j.command(append([]string{"generate", "--resume", "--to", j.generated()}, extra...)...)
	var errb bytes.Buffer
	cmd.Stderr = &errb
	if err := cmd.Start(); err != nil {
		j.t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	return cmd, &errb, exited
}

func TestGenerateOnTheSimulatorWritesTheContractsRepliesInOrder(t *testing.T) {
	g := genContract{seed: 7, replyTokens: 40, emptyEvery: 6, maxNew: 30, maxAttempts: 3}
	j, _, want := newGenerateJob(t, 120, g)
	r := j.run("generate", "--to", j.generated())
	if r.code != 0 {
		t.Fatalf("generate exit %d:\n%s", r.code, r.stderr)
	}
	checkGenerated(t, readGenerated(t, j.generated()), want)
	dropped := 0
	for _, w := range want {
		if w.dropped {
			dropped++
		}
	}
	rep := j.run("generate", "--report", "--json")
	var report struct {
		Done, Dropped, Failed int
		Flags                 map[string]int
	}
	if err := json.Unmarshal([]byte(rep.stdout), &report); err != nil {
		t.Fatalf("report: %v\n%s%s", err, rep.stdout, rep.stderr)
	}
	// writeConversations refuses every 50th line: 3 of 120 fail with the parser's reason.
	if report.Done != len(want)-dropped || report.Dropped != dropped || report.Failed != 3 {
		t.Fatalf("report %+v, want done %d dropped %d failed 3", report, len(want)-dropped, dropped)
	}
	if report.Flags["length"] == 0 {
		t.Fatalf("no reply was flagged cut at max_new_tokens: %+v", report)
	}
	var st struct {
		Generate *struct {
			State                string
			Total, Done, Pending int
		}
	}
	if r := j.run("status", "--json"); json.Unmarshal([]byte(r.stdout), &st) != nil || st.Generate == nil ||
		st.Generate.State != "complete" || st.Generate.Total != 120 || st.Generate.Done != len(want)-dropped || st.Generate.Pending != 0 {
		t.Fatalf("status --json after generate: %s%s", r.stdout, r.stderr)
	}
	// Again: nothing is sent, the output is the same.
	before := j.generationRequests()
	if r := j.run("generate", "--resume", "--to", j.generated()); r.code != 0 || !strings.Contains(r.stdout, "already generated") {
		t.Fatalf("second generate exit %d: %s%s", r.code, r.stdout, r.stderr)
	}
	if after := j.generationRequests(); after != before {
		t.Fatalf("a finished generate sent %d more requests", after-before)
	}
	checkGenerated(t, readGenerated(t, j.generated()), want)
}

func TestGenerateKilledAndItsServerKilledFinishesWithEveryConversationOnce(t *testing.T) {
	g := genContract{seed: 11, replyTokens: 48, emptyEvery: 9, maxNew: 40, maxAttempts: 3}
	j, _, want := newGenerateJob(t, 300, g)
	// 2 ms a token: the job takes seconds, and kills land with conversations in flight.
	j.env = append(j.env, "EXTRACT_SERVER_SIMULATOR_DECODE_DELAY=2ms")
	r := rand.New(rand.NewSource(22))
	sigkills, serverKills := 0, 0
	for sigkills < *kills || serverKills < 5 {
		// Each kill lands after a random number of new requests at the simulator (counted
		// from its log): mid-work however fast or slow the machine is.
		before := j.generationRequests()
		cmd, errb, exited := j.startGenerate()
		waitRequests := func(n int) {
			deadline := time.Now().Add(2 * time.Minute)
			for j.generationRequests() < before+n {
				select {
				case <-exited:
					t.Fatalf("generate ended before its kill (%d kills so far): %s", sigkills, errb)
				default:
				}
				if time.Now().After(deadline) {
					cmd.Process.Kill()
					t.Fatalf("no %d requests in 2 minutes: %s", n, errb)
				}
				time.Sleep(2 * time.Millisecond)
			}
		}
		if serverKills < 5 && sigkills%4 == 1 {
			// Kill the server under a live generate: it restarts it and goes on.
			waitRequests(5 + r.Intn(15))
			if pid := serverPID(j.state); alive(pid) {
				syscall.Kill(pid, syscall.SIGKILL)
				serverKills++
			}
			before = j.generationRequests()
		}
		waitRequests(5 + r.Intn(25))
		cmd.Process.Signal(syscall.SIGKILL)
		<-exited
		sigkills++
		if _, err := os.Stat(j.generated()); err == nil {
			t.Fatal("the output exists before every conversation finished")
		}
	}
	res := j.run("generate", "--resume", "--to", j.generated())
	if res.code != 0 {
		t.Fatalf("final generate exit %d:\n%s", res.code, res.stderr)
	}
	checkGenerated(t, readGenerated(t, j.generated()), want)
	// The work redone is bounded by what can be in flight at a kill: max_inflight 8
	// conversations of at most 3 turns, each sent at most max_attempts times.
	minimal := 0
	for _, c := range want {
		for _, t := range c.turns {
			if t[0] == "assistant" {
				minimal++
			}
		}
	}
	sent := j.generationRequests()
	bound := minimal*g.maxAttempts + (sigkills+serverKills)*8*3*g.maxAttempts
	t.Logf("%d kills of generate, %d of its server; %d generation requests for %d turns (bound %d)", sigkills, serverKills, sent, minimal, bound)
	if sent < minimal || sent > bound {
		t.Fatalf("the simulator received %d generation requests: want %d..%d", sent, minimal, bound)
	}
}
