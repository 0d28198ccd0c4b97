package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/extract-dev/extract/internal/testsupport"
)

// TestStopNeverSignalsAHostProcessThatSharesThePIDOfARunInAPIDNamespace runs the job
// inside `unshare --pid` with its pid made equal to a host `sleep`'s: `extract stop` on
// the host must leave the sleep alone, say where the run is, and exit 1.
func TestStopNeverSignalsAHostProcessThatSharesThePIDOfARunInAPIDNamespace(t *testing.T) {
	testsupport.Require(t, testsupport.Root) // unshare --pid and /proc/sys/kernel/ns_last_pid
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		testsupport.Unavailable(t, testsupport.Root, "unshare (util-linux) is not installed")
	}
	j := newJob(t, 200, 2000)
	sleep := exec.Command("sleep", "300")
	if err := sleep.Start(); err != nil {
		t.Fatal(err)
	}
	slept := make(chan error, 1)
	go func() { slept <- sleep.Wait() }()
	t.Cleanup(func() { sleep.Process.Kill() })
	pid := sleep.Process.Pid

	// In the new namespace sh is pid 1; the run it forks gets the pid after ns_last_pid.
	script := "echo " + strconv.Itoa(pid-1) + ` > /proc/sys/kernel/ns_last_pid || exit 1; "$@" & wait $!`
	ns := exec.Command(unshare, "--pid", "--fork", "--mount-proc", "--kill-child=SIGKILL", "sh", "-c", script, "sh", extractBin, "run", "--config", j.config)
	ns.Env = j.env
	var nsOut strings.Builder
	ns.Stdout, ns.Stderr = &nsOut, &nsOut
	if err := ns.Start(); err != nil {
		t.Fatal(err)
	}
	nsDone := make(chan struct{})
	go func() { ns.Wait(); close(nsDone) }()
	t.Cleanup(func() {
		ns.Process.Kill()
		<-nsDone
		// The run and its server died with the namespace; server.json holds their
		// namespace's pids, which mean other processes here.
		os.Remove(filepath.Join(j.state, "server.json"))
	})

	var holder struct {
		PID     int    `json:"pid"`
		Command string `json:"command"`
	}
	for deadline := time.Now().Add(60 * time.Second); ; {
		b, _ := os.ReadFile(filepath.Join(j.state, "lock"))
		if json.Unmarshal(b, &holder) != nil {
			holder.PID, _ = strconv.Atoi(strings.TrimSpace(string(b))) // a release that wrote the pid alone
		}
		if holder.PID == pid && j.statusState() == "running" {
			break
		}
		select {
		case <-nsDone:
			t.Fatalf("the namespaced run ended early:\n%s", nsOut.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("the run in the namespace never held the lock as pid %d (lock says %+v):\n%s", pid, holder, nsOut.String())
		}
		time.Sleep(50 * time.Millisecond)
	}

	r := j.run("stop", "--timeout", "10s")
	if r.code != 1 || !strings.Contains(r.stderr, "pid namespace") || !strings.Contains(r.stderr, "not signalled") {
		t.Errorf("stop from the host: exit %d, stderr %q; want 1 naming the run's pid namespace", r.code, r.stderr)
	}
	select {
	case err := <-slept:
		t.Fatalf("stop signalled the host's pid %d, a sleep, instead: %v", pid, err)
	case <-time.After(500 * time.Millisecond):
	}
	if st := j.statusState(); st != "running" {
		t.Errorf("after the refused stop the run is %q, want still running", st)
	}
}

// statusState is status's state field, "" when status fails.
func (j *job) statusState() string {
	r := j.run("status", "--json")
	var st struct {
		State string `json:"state"`
	}
	json.Unmarshal([]byte(r.stdout), &st)
	return st.State
}
