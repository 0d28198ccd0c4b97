package main

import (
	"encoding/json"
	"io"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// genReport is `extract generate --report --json`.
type genReport struct {
	Done, Dropped, Failed, Pending int
	Worst                          []struct {
		Line   int
		ID     string
		State  string
		Reason string
	}
}

func (j *job) generateReport() genReport {
	j.t.Helper()
	r := j.run("generate", "--report", "--json")
	var rep genReport
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &rep) != nil {
		j.t.Fatalf("report: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	return rep
}

func TestGenerateOnThreeReplicasWithOneKilledFinishesExact(t *testing.T) {
	g := genContract{seed: 5, replyTokens: 40, maxNew: 64, maxAttempts: 3}
	j, _, want := newGenerateJob(t, 200, g)
	j.withReplicas(3)
	j.env = append(j.env, "EXTRACT_SERVER_SIMULATOR_DECODE_DELAY=3ms")
	base := portOf(t, j)
	cmd, errb, exited := j.startGenerate()
	perPort := func() map[int]int {
		n := map[int]int{}
		for _, l := range j.requestLines() {
			if strings.HasPrefix(l[0], "g") && len(l) > 1 {
				p, _ := strconv.Atoi(l[1])
				n[p]++
			}
		}
		return n
	}
	deadline := time.Now().Add(2 * time.Minute)
	for n := perPort(); n[base] < 5 || n[base+1] < 5 || n[base+2] < 5; n = perPort() {
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			t.Fatalf("requests per port %v: not every replica served", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Live: the running generate's figures, not the index's (which it holds).
	for {
		var st struct {
			Generate *struct {
				State    string
				PID      int
				Requests int
				Addr     string
			}
		}
		r := j.run("status", "--json")
		if json.Unmarshal([]byte(r.stdout), &st) == nil && st.Generate != nil && st.Generate.State == "running" && st.Generate.PID == cmd.Process.Pid && st.Generate.Requests > 0 {
			resp, err := http.Get("http://" + st.Generate.Addr + "/metrics")
			if err != nil {
				t.Fatalf("the running generate's metrics at %q: %v", st.Generate.Addr, err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if !strings.Contains(string(b), "extract_generate_tokens_per_second") || !strings.Contains(string(b), `extract_generate_server_up{replica="2"} 1`) {
				t.Fatalf("metrics lack the generate series:\n%s", b)
			}
			break
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			t.Fatalf("status --json never showed the running generate: %s%s", r.stdout, r.stderr)
		}
		time.Sleep(20 * time.Millisecond)
	}
	var rec struct {
		PID int `json:"pid"`
	}
	if b := mustRead(t, filepath.Join(j.state, "server-1.json")); json.Unmarshal([]byte(b), &rec) != nil || !alive(rec.PID) {
		t.Fatalf("no live replica 1 in its record: %s", b)
	}
	atKill := perPort()
	syscall.Kill(rec.PID, syscall.SIGKILL)
	<-exited
	if cmd.ProcessState.ExitCode() != 0 {
		t.Fatalf("generate exit %d:\n%s", cmd.ProcessState.ExitCode(), errb)
	}
	after := perPort()
	if after[base]+after[base+2] <= atKill[base]+atKill[base+2] {
		t.Fatalf("the live replicas took no work after replica 1 died: %v then %v", atKill, after)
	}
	if !strings.Contains(errb.String(), `msg="generate: server exited" replica=1`) {
		t.Fatalf("replica 1's death was not seen:\n%s", errb)
	}
	checkGenerated(t, readGenerated(t, j.generated()), want)
}

func TestGenerateRefusedPromptsFailWithTheServersReasonAndThePoisonAfterBoundedDeaths(t *testing.T) {
	g := genContract{seed: 9, replyTokens: 30, maxNew: 64, maxAttempts: 3, ctxLen: 260}
	j, cases, want := newGenerateJob(t, 80, g)
	// Sample 10 kills the server whenever it is sent.
	j.env = append(j.env, "EXTRACT_SERVER_SIMULATOR_CRASH_ON_RID=g000000010-", "EXTRACT_SERVER_ISOLATE_AFTER_DEATHS=2",
		"EXTRACT_SERVER_MAX_RESTARTS=5", "EXTRACT_SERVER_SIMULATOR_DECODE_DELAY=1ms")
	for i, c := range cases {
		if i == 10 {
			for k := range want {
				if want[k].id == c.id {
					want[k] = genExpect{id: c.id, failed: true}
				}
			}
		}
	}
	r := j.run("generate", "--to", j.generated())
	if r.code != 0 {
		t.Fatalf("generate exit %d:\n%s", r.code, r.stderr)
	}
	checkGenerated(t, readGenerated(t, j.generated()), want)
	refused := 0
	for _, w := range want {
		if w.failed && w.id != cases[10].id {
			refused++
		}
	}
	if refused == 0 {
		t.Fatal("no prompt was past the context length: the test tests nothing")
	}
	rep := j.generateReport()
	poison, tooLong := 0, 0
	for _, l := range rep.Worst {
		switch {
		case l.State == "failed" && strings.HasPrefix(l.Reason, "poison:") && l.Line == 11:
			poison++
		case l.State == "failed" && strings.Contains(l.Reason, "server_error") && strings.Contains(l.Reason, "context length"):
			tooLong++
		}
	}
	if poison != 1 || tooLong != refused || rep.Failed != refused+1+2 { // +2: the parser's refusals (lines 8, 58)
		t.Fatalf("report: poison %d (want 1), refused by the server %d (want %d), failed %d:\n%+v", poison, tooLong, refused, rep.Failed, rep)
	}
	// Bounded: sample 10 was sent isolate_after_deaths + 1 times, the last one alone.
	sent := 0
	for _, rid := range j.requests() {
		if strings.HasPrefix(rid, "g000000010-") {
			sent++
		}
	}
	if sent != 3 {
		t.Fatalf("the poison conversation was sent %d times, want 3 (2 deaths in company, 1 alone)", sent)
	}
}

func TestAHungServerIsDetectedByItsProbesAndRestartedAndTheGenerateFinishesExact(t *testing.T) {
	g := genContract{seed: 21, replyTokens: 20, maxNew: 64, maxAttempts: 3}
	j, _, want := newGenerateJob(t, 40, g)
	j.env = append(j.env, "EXTRACT_SERVER_SIMULATOR_HANG_AFTER=30", "EXTRACT_SERVER_HEALTH_INTERVAL=200ms",
		"EXTRACT_SERVER_HEALTH_TIMEOUT=300ms", "EXTRACT_SERVER_HEALTH_FAILURES=2", "EXTRACT_SERVER_MAX_RESTARTS=6")
	start := time.Now()
	r := j.run("generate", "--to", j.generated())
	if r.code != 0 {
		t.Fatalf("generate exit %d:\n%s", r.code, r.stderr)
	}
	if n := strings.Count(r.stderr, "generate: server hung"); n == 0 {
		t.Fatalf("no hang was detected:\n%s", r.stderr)
	}
	if time.Since(start) > 2*time.Minute {
		t.Fatalf("took %s: the hung requests waited for their timeout", time.Since(start))
	}
	checkGenerated(t, readGenerated(t, j.generated()), want)
}
