package sglang

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/extract-dev/extract/configs"
	"github.com/extract-dev/extract/sglang/simulator"
)

// alive reports whether pid runs and is not a zombie awaiting its parent's wait.
func alive(pid int) bool {
	st, err := readStat(pid)
	return err == nil && !st.dead()
}

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// simulatorSpec launches this test binary as the simulator (see TestMain).
func simulatorSpec(t *testing.T) LaunchSpec {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return LaunchSpec{
		Kind: KindSimulator, Host: "127.0.0.1", Port: freePort(t), ModelPath: "sim/model", TPSize: 1,
		Layers: []int{2, 30, 58}, ShmDir: t.TempDir(), Env: map[string]string{"SIM_CHILD": "1"},
		Simulator: SimulatorSpec{Executable: exe, NumLayers: 61, Simulator: configs.Simulator{HiddenSize: 16}},
	}
}

// newManager returns a Manager whose server is stopped when the test ends.
func newManager(t *testing.T, stateDir string, spec LaunchSpec) (*Manager, *logBuffer) {
	log, buf := testLogger(t)
	m := &Manager{StateDir: stateDir, Spec: spec, StartupTimeout: 20 * time.Second, Log: log}
	t.Cleanup(func() {
		if err := m.Stop(context.Background(), 2*time.Second); err != nil {
			t.Errorf("cleanup stop: %v", err)
		}
	})
	return m, buf
}

func readRecordFile(t *testing.T, stateDir string) *record {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(stateDir, "server.json"))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	var rec record
	if err := json.Unmarshal(b, &rec); err != nil {
		t.Fatal(err)
	}
	return &rec
}

// startWorker starts an idle process in its own group, standing for a stranger.
func startWorker(t *testing.T) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), "SIM_CHILD=worker")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go cmd.Wait()
	t.Cleanup(func() { cmd.Process.Kill() })
	return cmd
}

func TestEnsureLaunchesTheServerInItsOwnSessionAndWaitsUntilReady(t *testing.T) {
	spec := simulatorSpec(t)
	spec.Simulator.StartupDelay = 700 * time.Millisecond
	state := t.TempDir()
	m, _ := newManager(t, state, spec)
	start := time.Now()
	s, err := m.Ensure(ctxFor(t, 30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < spec.Simulator.StartupDelay {
		t.Errorf("ready after %v, before the startup delay of %v", d, spec.Simulator.StartupDelay)
	}
	if s.Adopted || s.PGID != s.PID || s.Port != spec.Port || s.Fingerprint != spec.Fingerprint() {
		t.Errorf("server %+v", s)
	}
	if st, err := readStat(s.PID); err != nil || st.pgid != s.PID || st.startTime != s.StartTime {
		t.Errorf("process %d: stat %+v %v, want its own group and start time %d", s.PID, st, err, s.StartTime)
	}
	rec := readRecordFile(t, state)
	if rec == nil || rec.PID != s.PID || rec.StartTime != s.StartTime || rec.Fingerprint != s.Fingerprint || rec.BootID == "" {
		t.Errorf("record %+v does not match server %+v", rec, s)
	}
	serverLog, err := os.ReadFile(m.LogPath())
	if err != nil || !strings.Contains(string(serverLog), simulator.ReadyMessage) {
		t.Errorf("server log lacks the ready message: %v\n%s", err, serverLog)
	}

	c := NewClient(spec.BaseURL(), ClientOptions{Logger: m.Log})
	resp, err := c.Generate(ctxFor(t, 10*time.Second), GenerateRequest{RID: "s000000007-a1", Text: "hello"})
	if err != nil || resp.PromptTokens != 5 {
		t.Errorf("Generate: %+v %v", resp, err)
	}
	if _, err := os.Stat(filepath.Join(spec.ShmDir, "s000000007-a1.safetensors")); err != nil {
		t.Errorf("no dump: %v", err)
	}
	info, err := c.ServerInfo(ctxFor(t, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := info.CheckCapture(spec); err != nil {
		t.Errorf("the simulator is not capture-ready: %v", err)
	}
}

func TestASecondManagerAdoptsTheRecordedServerAndSeesItExit(t *testing.T) {
	spec := simulatorSpec(t)
	state := t.TempDir()
	m1, _ := newManager(t, state, spec)
	s1, err := m1.Ensure(ctxFor(t, 30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	m2, logs := newManager(t, state, spec)
	s2, err := m2.Ensure(ctxFor(t, 30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if s2.PID != s1.PID || !s2.Adopted || !strings.Contains(logs.String(), "adopting server") {
		t.Errorf("second manager got %+v, want pid %d adopted", s2, s1.PID)
	}
	if err := m1.Stop(ctxFor(t, 10*time.Second), 2*time.Second); err != nil {
		t.Fatal(err)
	}
	for name, ch := range map[string]<-chan struct{}{"launching": m1.Exited(), "adopting": m2.Exited()} {
		select {
		case <-ch:
		case <-time.After(3 * time.Second):
			t.Errorf("the %s manager did not see the server exit", name)
		}
	}
}

func TestAChangedFingerprintReplacesTheServer(t *testing.T) {
	spec := simulatorSpec(t)
	state := t.TempDir()
	m1, _ := newManager(t, state, spec)
	old, err := m1.Ensure(ctxFor(t, 30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	changed := spec
	changed.Simulator.HiddenSize = 32
	m2, logs := newManager(t, state, changed)
	s, err := m2.Ensure(ctxFor(t, 30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if s.PID == old.PID || s.Adopted || s.Fingerprint != changed.Fingerprint() {
		t.Errorf("got %+v, want a new server replacing pid %d", s, old.PID)
	}
	if alive(old.PID) {
		t.Errorf("old server pid %d still alive", old.PID)
	}
	if !strings.Contains(logs.String(), "launch spec changed") {
		t.Errorf("replacement not logged:\n%s", logs)
	}
}

func TestAForeignListenerOnThePortIsNamedAndLeftAlone(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	spec := simulatorSpec(t)
	spec.Port = ln.Addr().(*net.TCPAddr).Port
	state := t.TempDir()
	m, _ := newManager(t, state, spec)
	_, err = m.Ensure(ctxFor(t, 30*time.Second))
	for _, want := range []string{fmt.Sprintf("port %d", spec.Port), fmt.Sprintf("pid %d", os.Getpid()), "did not start", "server.port"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Ensure error %v, want it to contain %q", err, want)
		}
	}
	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Errorf("the foreign listener was disturbed: %v", err)
	} else {
		conn.Close()
	}
	if rec := readRecordFile(t, state); rec != nil {
		t.Errorf("a record was written: %+v", rec)
	}
}

func TestStopEndsTheWholeProcessGroupEvenWorkersThatIgnoreSIGTERM(t *testing.T) {
	spec := simulatorSpec(t)
	spec.Env["SIM_WORKER"] = "stubborn"
	ready := filepath.Join(t.TempDir(), "worker-ignores-sigterm")
	spec.Env["SIM_WORKER_READY"] = ready
	state := t.TempDir()
	m, _ := newManager(t, state, spec)
	s, err := m.Ensure(ctxFor(t, 30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var members []int
	waitFor(t, 5*time.Second, "worker joins the group", func() bool { members = groupMembers(s.PGID); return len(members) == 2 })
	// A SIGTERM before the worker ignores it would end it at once, as a stubborn one must not.
	waitFor(t, 5*time.Second, "worker ignores SIGTERM", func() bool { _, err := os.Stat(ready); return err == nil })
	const grace = 300 * time.Millisecond
	start := time.Now()
	if err := m.Stop(ctxFor(t, 10*time.Second), grace); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < grace {
		t.Errorf("stopped after %v: the stubborn worker should have needed SIGKILL after %v", d, grace)
	}
	for _, pid := range members {
		if alive(pid) {
			t.Errorf("pid %d of group %d survived Stop", pid, s.PGID)
		}
	}
	if rec := readRecordFile(t, state); rec != nil {
		t.Errorf("record left after Stop: %+v", rec)
	}
}

func TestAServerThatExitsDuringStartupFailsFastWithItsLogTail(t *testing.T) {
	spec := simulatorSpec(t)
	// Valid for Argv, refused by the simulator itself, like a model SGLang cannot load.
	spec.Layers = []int{2, 30, 99}
	spec.Simulator.StartupDelay = time.Minute
	state := t.TempDir()
	m, _ := newManager(t, state, spec)
	start := time.Now()
	_, err := m.Ensure(ctxFor(t, 30*time.Second))
	if err == nil || !strings.Contains(err.Error(), "exited during startup") || !strings.Contains(err.Error(), "layer 99 outside") {
		t.Errorf("Ensure error %v, want the early exit with the simulator's own complaint", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("took %v to notice the exit", d)
	}
	if rec := readRecordFile(t, state); rec != nil {
		t.Errorf("record of a dead server left: %+v", rec)
	}
}

func TestARecordNamingAnotherLiveProcessIsDroppedWithoutSignallingIt(t *testing.T) {
	tests := []struct {
		name   string
		modify func(*record)
	}{
		{"start time differs", func(r *record) { r.StartTime++ }},
		{"command line differs", func(r *record) { r.Argv = []string{"python3", "-m", "sglang.launch_server"} }},
		{"another boot", func(r *record) { r.BootID = "00000000-0000-0000-0000-000000000000" }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			stranger := startWorker(t)
			pid := stranger.Process.Pid
			waitFor(t, 5*time.Second, "stranger starts", func() bool { return alive(pid) })
			st, err := readStat(pid)
			if err != nil {
				t.Fatal(err)
			}
			boot, _ := bootID()
			spec := simulatorSpec(t)
			state := t.TempDir()
			m, logs := newManager(t, state, spec)
			rec := &record{PID: pid, PGID: pid, StartTime: st.startTime, BootID: boot, Port: spec.Port,
				Fingerprint: spec.Fingerprint(), Argv: stranger.Args}
			tc.modify(rec)
			if err := m.writeRecord(rec); err != nil {
				t.Fatal(err)
			}
			s, err := m.Ensure(ctxFor(t, 30*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			if s.PID == pid || s.Adopted {
				t.Errorf("got %+v, want a fresh launch", s)
			}
			time.Sleep(100 * time.Millisecond)
			if !alive(pid) {
				t.Errorf("the stranger pid %d was signalled", pid)
			}
			if !strings.Contains(logs.String(), "belongs to another process") {
				t.Errorf("pid reuse not logged:\n%s", logs)
			}
		})
	}
}

func TestWorkersOrphanedByADeadLeaderAreStoppedBeforeTheRelaunch(t *testing.T) {
	spec := simulatorSpec(t)
	spec.Env["SIM_WORKER"] = "1"
	state := t.TempDir()
	m1, _ := newManager(t, state, spec)
	s, err := m1.Ensure(ctxFor(t, 30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var worker int
	waitFor(t, 5*time.Second, "worker joins the group", func() bool {
		for _, pid := range groupMembers(s.PGID) {
			if pid != s.PID {
				worker = pid
			}
		}
		return worker != 0
	})
	if err := syscall.Kill(s.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-m1.Exited()
	if !alive(worker) {
		t.Fatalf("worker %d died with its leader; nothing to test", worker)
	}
	m2, logs := newManager(t, state, spec)
	s2, err := m2.Ensure(ctxFor(t, 30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if alive(worker) {
		t.Errorf("orphaned worker %d survived the relaunch", worker)
	}
	if s2.PID == s.PID || !strings.Contains(logs.String(), "workers remain") {
		t.Errorf("got %+v; logs:\n%s", s2, logs)
	}
}

func TestAServerStillLoadingWhenEnsureGivesUpIsAdoptedAndAwaitedByTheNextEnsure(t *testing.T) {
	spec := simulatorSpec(t)
	spec.Simulator.StartupDelay = 1500 * time.Millisecond
	state := t.TempDir()
	m1, _ := newManager(t, state, spec)
	_, err := m1.Ensure(ctxFor(t, 300*time.Millisecond))
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Ensure error %v, want the deadline", err)
	}
	rec := readRecordFile(t, state)
	if rec == nil || !alive(rec.PID) {
		t.Fatalf("the loading server is gone: record %+v", rec)
	}
	m2, logs := newManager(t, state, spec)
	s, err := m2.Ensure(ctxFor(t, 30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if s.PID != rec.PID || !s.Adopted || !strings.Contains(logs.String(), "still starting") {
		t.Errorf("got %+v, want pid %d adopted while it loads", s, rec.PID)
	}
	if err := NewClient(spec.BaseURL(), ClientOptions{Logger: m2.Log}).HealthGenerate(ctxFor(t, 5*time.Second)); err != nil {
		t.Errorf("Ensure returned before the server was ready: %v", err)
	}
}
