package orchestrator

import (
	"errors"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/extract-dev/extract/sglang"
)

func TestStopSignalsOnlyARunOnThisHostBootAndPIDNamespace(t *testing.T) {
	me := Holder{PID: 10, Host: "node-a", BootID: "boot-1", PIDNamespace: 4026531836, StartTime: 99}
	for _, c := range []struct {
		name   string
		change func(*Holder)
		says   string // "" : may be signalled
	}{
		{"the same host, boot and namespace", func(*Holder) {}, ""},
		{"another node on a shared state dir", func(h *Holder) { h.Host = "node-b" }, "runs on host node-b, not here (node-a); run `extract stop` on node-b"},
		{"before a reboot, or a twin host name", func(h *Holder) { h.BootID = "boot-0" }, "from boot boot-0"},
		{"a container or unshare --pid", func(h *Holder) { h.PIDNamespace = 4026532178 }, "in its own pid namespace 4026532178"},
		{"an old lock with a bare pid", func(h *Holder) { *h = Holder{PID: h.PID} }, "kill -TERM 4242"},
		{"no pid at all", func(h *Holder) { h.PID = 0 }, "names no pid"},
	} {
		h := me
		h.PID = 4242
		c.change(&h)
		got := stopTarget(h, me)
		if (c.says == "") != (got == "") || !strings.Contains(got, c.says) {
			t.Errorf("%s: stopTarget = %q, want it to say %q", c.name, got, c.says)
		}
	}
}

// A pid whose start time is not the lock's is another process (the run exited and its
// pid was reused): it must survive; the real holder gets SIGTERM through its pidfd.
func TestStopNeverSignalsAProcessWhoseStartTimeIsNotTheLocks(t *testing.T) {
	sleep := exec.Command("sleep", "60")
	if err := sleep.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- sleep.Wait() }()
	t.Cleanup(func() { sleep.Process.Kill() })
	start, err := sglang.ProcessStartTime(sleep.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	err = signalRun(Holder{PID: sleep.Process.Pid, StartTime: start + 1})
	if !errors.Is(err, ErrNotHere) {
		t.Fatalf("signalRun with another start time = %v, want ErrNotHere", err)
	}
	select {
	case err := <-exited:
		t.Fatalf("the process that only shares the pid was signalled: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	if err := signalRun(Holder{PID: sleep.Process.Pid, StartTime: start}); err != nil {
		t.Fatalf("signalRun of the holder: %v", err)
	}
	select {
	case err := <-exited:
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGTERM {
			t.Fatalf("holder ended with %v, want SIGTERM", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the holder was not signalled")
	}
}
