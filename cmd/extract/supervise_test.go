package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// start runs `extract args...` in the background; the returned func waits for its exit code.
func (j *job) start(args ...string) (*exec.Cmd, func() (int, string)) {
	j.t.Helper()
	cmd := j.command(args...)
	var errb bytes.Buffer
	cmd.Stderr = &errb
	if err := cmd.Start(); err != nil {
		j.t.Fatal(err)
	}
	done := make(chan struct{})
	code := 0
	go func() {
		err := cmd.Wait()
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			code = ee.ExitCode()
		}
		close(done)
	}()
	j.t.Cleanup(func() {
		cmd.Process.Kill()
		<-done
	})
	return cmd, func() (int, string) {
		select {
		case <-done:
		case <-time.After(90 * time.Second):
			cmd.Process.Kill()
			<-done // the output is complete, and no longer written, once the process is gone
			j.t.Fatalf("extract %v did not finish in 90s\n%s", args, errb.String())
		}
		return code, errb.String()
	}
}

// waitStatus polls live status until cond holds.
func (j *job) waitStatus(what string, cond func(st map[string]any) bool) map[string]any {
	j.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		st := j.status()
		if st["source"] == "live" && cond(st) {
			return st
		}
		if time.Now().After(deadline) {
			j.t.Fatalf("timed out waiting for %s; last status %v", what, st)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func server(st map[string]any) map[string]any {
	s, _ := st["server"].(map[string]any)
	return s
}

func num(v any) int {
	f, _ := v.(float64)
	return int(f)
}

func (j *job) requireExact() {
	j.t.Helper()
	if lost, corrupt, extra := j.check(); lost+corrupt+extra > 0 {
		j.t.Fatalf("job not exact: lost %d, corrupt %d, stray %d", lost, corrupt, extra)
	}
	if st := j.status(); st["state"] != "complete" || num(st["done"]) != len(j.samples) {
		j.t.Fatalf("status after the job: %v", st)
	}
}

func TestServerKilledMidRunIsRestartedAndTheJobIsExact(t *testing.T) {
	j := newJob(t, 100, 4000)
	_, wait := j.start("run")
	st := j.waitStatus("progress", func(st map[string]any) bool { return num(st["done"]) > 10 })
	old := num(server(st)["pid"])
	if err := syscall.Kill(-old, syscall.SIGKILL); err != nil {
		t.Fatalf("kill server group %d: %v", old, err)
	}
	j.waitStatus("a restarted server", func(st map[string]any) bool {
		s := server(st)
		return num(s["restarts"]) == 1 && num(s["pid"]) != old && s["state"] == "ready"
	})
	if code, stderr := wait(); code != 0 {
		t.Fatalf("run exit %d\n%s", code, stderr)
	}
	j.requireExact()
}

func TestHungServerIsDetectedKilledAndRestarted(t *testing.T) {
	j := newJob(t, 80, 0)
	j.env = append(j.env,
		"EXTRACT_SERVER_SIMULATOR_HANG_AFTER=30",
		"EXTRACT_SERVER_HEALTH_INTERVAL=200ms",
		"EXTRACT_SERVER_HEALTH_TIMEOUT=300ms",
		"EXTRACT_SERVER_HEALTH_FAILURES=2",
		"EXTRACT_SERVER_MAX_RESTARTS=10",
	)
	_, wait := j.start("run")
	first := num(server(j.waitStatus("a ready server", func(st map[string]any) bool { return server(st)["state"] == "ready" }))["pid"])
	code, stderr := wait()
	if code != 0 {
		t.Fatalf("run exit %d\n%s", code, stderr)
	}
	if !strings.Contains(stderr, "server hung") || alive(first) {
		t.Fatalf("hang not handled (first server pid %d alive: %v):\n%s", first, alive(first), stderr)
	}
	j.requireExact()
}

func TestKilledOrchestratorIsFollowedByARunThatAdoptsTheSameServer(t *testing.T) {
	j := newJob(t, 100, 4000)
	cmd, wait := j.start("run")
	st := j.waitStatus("progress", func(st map[string]any) bool { return num(st["done"]) > 5 })
	pid := num(server(st)["pid"])
	cmd.Process.Signal(syscall.SIGKILL)
	wait()
	if !alive(pid) {
		t.Fatalf("server pid %d died with the orchestrator", pid)
	}
	_, wait = j.start("run", "--resume")
	st = j.waitStatus("the adopted server", func(st map[string]any) bool { return server(st)["state"] == "ready" })
	if s := server(st); num(s["pid"]) != pid || s["adopted"] != true {
		t.Fatalf("resumed run uses server %v, want pid %d adopted", s, pid)
	}
	j.waitStatus("the hook version", func(st map[string]any) bool { return server(st)["hook_version"] == "sim-1" })
	if code, stderr := wait(); code != 0 {
		t.Fatalf("run exit %d\n%s", code, stderr)
	}
	if alive(pid) {
		t.Errorf("server pid %d still running after the job completed", pid)
	}
	j.requireExact()
}

func TestStaleServerWithAnotherFingerprintIsReplaced(t *testing.T) {
	j := newJob(t, 100, 4000)
	cmd, wait := j.start("run")
	pid := num(server(j.waitStatus("a ready server", func(st map[string]any) bool { return server(st)["state"] == "ready" }))["pid"])
	cmd.Process.Signal(syscall.SIGKILL)
	wait()
	j.env = append(j.env, "EXTRACT_SERVER_SIMULATOR_TOKENS_PER_SECOND=50000")
	r := j.run("run", "--resume")
	if r.code != 0 {
		t.Fatalf("run exit %d\n%s", r.code, r.stderr)
	}
	if alive(pid) || !strings.Contains(r.stderr, "launch spec changed") {
		t.Fatalf("stale server pid %d not replaced:\n%s", pid, r.stderr)
	}
	j.requireExact()
}

func TestForeignProcessOnTheServerPortIsNeverKilled(t *testing.T) {
	j := newJob(t, 10, 0)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	j.env = append(j.env, "EXTRACT_SERVER_PORT="+strconv.Itoa(port))
	r := j.run("run")
	if r.code != 3 || !strings.Contains(r.stderr, ":"+strconv.Itoa(port)+" is taken by pid") || !strings.Contains(r.stderr, "did not start") {
		t.Fatalf("exit %d, stderr %q; want exit 3 naming the port", r.code, r.stderr)
	}
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatalf("the foreign listener was disturbed: %v", err)
	}
	c.Close()
}

func TestRestartBudgetExhaustedExitsTempfail(t *testing.T) {
	j := newJob(t, 60, 0)
	j.env = append(j.env, "EXTRACT_SERVER_SIMULATOR_EXIT_AFTER=3", "EXTRACT_SERVER_MAX_RESTARTS=2")
	r := j.run("run")
	if r.code != 75 || !strings.Contains(r.stderr, "server.max_restarts") {
		t.Fatalf("exit %d, stderr %q; want 75 naming server.max_restarts", r.code, r.stderr)
	}
	// Whatever was done stays done, and cron's next run finishes the job.
	j.env = append(j.env, "EXTRACT_SERVER_SIMULATOR_EXIT_AFTER=0")
	if r := j.run("run", "--resume"); r.code != 0 {
		t.Fatalf("resume exit %d\n%s", r.code, r.stderr)
	}
	j.requireExact()
}

func TestLateDumpsAreResentAfterTheTimeoutAndStaleAttemptsRejected(t *testing.T) {
	j := newJob(t, 12, 0)
	j.env = append(j.env,
		"EXTRACT_SERVER_SIMULATOR_LATE_DUMP_DELAY=1500ms",
		"EXTRACT_RUN_DUMP_TIMEOUT=300ms",
		"EXTRACT_RUN_MAX_ATTEMPTS=10",
	)
	r := j.run("run")
	if r.code != 0 {
		t.Fatalf("run exit %d\n%s", r.code, r.stderr)
	}
	for _, want := range []string{"no dump arrived; sending again", "reason=stale_attempt"} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("log lacks %q", want)
		}
	}
	j.requireExact()
}

func TestStopDrainsInFlightSamplesAndResumeFinishesExact(t *testing.T) {
	j := newJob(t, 100, 2000)
	_, wait := j.start("run")
	j.waitStatus("progress", func(st map[string]any) bool { return num(st["done"]) > 5 })
	r := j.run("stop")
	if r.code != 0 || !strings.Contains(r.stdout, "stopped run pid") {
		t.Fatalf("stop: exit %d, %q %q", r.code, r.stdout, r.stderr)
	}
	if code, stderr := wait(); code != 75 || !strings.Contains(stderr, "draining") {
		t.Fatalf("stopped run exit %d, want 75 after a drain\n%s", code, stderr)
	}
	st := j.status()
	if st["state"] != "stopped" || num(st["done"]) >= len(j.samples) {
		t.Fatalf("after stop: %v; want a stopped job with work left", st)
	}
	if entries, _ := os.ReadDir(j.shmDir); len(entries) > 0 {
		t.Errorf("a drained stop left %d files in staging", len(entries))
	}
	if r := j.run("run", "--resume"); r.code != 0 {
		t.Fatalf("resume exit %d\n%s", r.code, r.stderr)
	}
	j.requireExact()
}

func TestMetricsAreScrapableWhileRunning(t *testing.T) {
	j := newJob(t, 60, 3000)
	// Something else writes into the staging dir: never read, but reported.
	if err := os.WriteFile(filepath.Join(j.shmDir, "notes.txt"), []byte("hi"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, wait := j.start("run")
	j.waitStatus("progress", func(st map[string]any) bool { return num(st["done"]) > 2 })
	var ri struct {
		StatusAddr string `json:"status_addr"`
	}
	if err := json.Unmarshal([]byte(mustRead(t, filepath.Join(j.state, "run.json"))), &ri); err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get("http://" + ri.StatusAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, name := range []string{"extract_samples_total 60", "extract_samples_done ", "extract_samples_inflight ", "extract_output_bytes ",
		"extract_move_seconds_bucket", "extract_staging_bytes ", "extract_output_free_bytes ", `extract_server_restarts_total{replica="0"} 0`, `extract_server_up{replica="0"} 1`, `extract_dumps_rejected_total{reason="foreign_name"} 1`, "process_resident_memory_bytes"} {
		if !strings.Contains(string(body), name) {
			t.Errorf("/metrics lacks %q", name)
		}
	}
	if code, stderr := wait(); code != 0 {
		t.Fatalf("run exit %d\n%s", code, stderr)
	}
}

func TestMalformedDumpsAreQuarantinedAndTheirSamplesRedone(t *testing.T) {
	j := newJob(t, 40, 0)
	j.env = append(j.env, "EXTRACT_SERVER_SIMULATOR_CORRUPT_EVERY=7")
	r := j.run("run")
	if r.code != 0 {
		t.Fatalf("run exit %d\n%s", r.code, r.stderr)
	}
	if !strings.Contains(r.stderr, "input_ids") || !strings.Contains(r.stderr, "dump quarantined") {
		t.Errorf("the log does not say why dumps were rejected:\n%s", r.stderr)
	}
	kept, _ := filepath.Glob(filepath.Join(j.state, "quarantine", "*.safetensors"))
	if len(kept) < 5 {
		t.Errorf("%d dumps in quarantine, want one for every 7th of 40+ dumps", len(kept))
	}
	j.requireExact()
}

// A prompt that kills the server (the simulator's crash_on_samples) used to be requeued
// at every death without counting, until the restart budget ran out: exit 75, and cron
// repeated it forever. Now it is sent alone after server.isolate_after_deaths deaths and
// failed when the server dies with it alone: the job ends 1 (that sample failed), every
// other sample done, within the default restart budget.
func TestASampleThatKillsTheServerFailsAloneAndTheRestOfTheJobIsDone(t *testing.T) {
	j := newJob(t, 40, 0)
	j.env = append(j.env, "EXTRACT_SERVER_SIMULATOR_CRASH_ON_SAMPLES=7")
	r := j.run("run")
	if r.code != 1 || !strings.Contains(r.stderr, "1 samples failed") {
		t.Fatalf("run with a poison sample: exit %d, want 1 naming one failed sample\n%s", r.code, r.stderr)
	}
	st := j.status()
	if num(st["failed"]) != 1 || num(st["done"]) != 39 {
		t.Errorf("status after the run: %d done, %d failed; want 39 and 1", num(st["done"]), num(st["failed"]))
	}
	var sent []string // how many requests were open at the server with each of sample 7's
	for _, l := range j.requestLines() {
		if strings.HasPrefix(l[0], "s000000007-") && len(l) > 2 {
			sent = append(sent, l[2])
		}
	}
	if len(sent) != 3 || sent[2] != "1" {
		t.Errorf("sample 7 was sent %d times with %v requests open; want 3, the last one alone", len(sent), sent)
	}
	if b, _ := os.ReadFile(filepath.Join(j.state, "logs", "extract.log")); !strings.Contains(string(b), "server died with it in flight") {
		t.Errorf("extract.log does not say why sample 7 failed")
	}
}
