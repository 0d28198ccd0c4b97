package main

import (
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Two shards on one node with one server.port: shard 1's doctor must name shard 0's
// server as such, not as a process extract did not start.
func TestAPortHeldByAnotherShardsServerIsNamedAsThatShards(t *testing.T) {
	j := newJob(t, 200, 2000)
	shard0 := filepath.Join(j.state, "shard-0-of-2")
	t.Cleanup(func() { stopRecordedServerFile(filepath.Join(shard0, "server.json")) })
	_, wait := j.start("run", "--shard", "0/2")
	// Up once it answers on its port (its record is written before it listens).
	for deadline := time.Now().Add(60 * time.Second); !listening(portOf(t, j)); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("shard 0's server did not listen in 60 s")
		}
	}
	r := j.run("doctor", "--shard", "1/2")
	if r.code != 3 || !strings.Contains(r.stdout, "the server of the job in "+shard0) || strings.Contains(r.stdout, "did not start") {
		t.Errorf("doctor of shard 1 beside shard 0's server: exit %d, want 3 naming shard 0's server:\n%s", r.code, r.stdout)
	}
	j.run("stop", "--shard", "0/2")
	wait()
}

func listening(port int) bool {
	c, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err == nil {
		c.Close()
	}
	return err == nil
}

// A busy status.listen used to pass doctor and then end the run with exit 2, which the
// documented systemd unit does not restart; both now say exit 3 and who holds it.
func TestABusyStatusPortIsAPreflightRefusalForRunAndDoctor(t *testing.T) {
	j := newJob(t, 10, 0)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	j.env = append(j.env, "EXTRACT_STATUS_LISTEN="+ln.Addr().String())
	for _, cmd := range []string{"doctor", "run"} {
		r := j.run(cmd)
		if out := r.stdout + r.stderr; r.code != 3 || !strings.Contains(out, ln.Addr().String()+" is taken by pid") {
			t.Errorf("%s with status.listen taken: exit %d, want 3 naming the holder:\n%s", cmd, r.code, out)
		}
	}
}
