package orchestrator

import (
	"testing"
	"time"

	"github.com/extract-dev/extract/sglang"
)

func TestEachSampleGoesToTheReadyReplicaWithTheFewestTokensInFlight(t *testing.T) {
	views := func(load []int64) []replicaView {
		reps := make([]replicaView, len(load))
		for r := range reps {
			reps[r] = replicaView{ready: r != 1, load: load[r]} // replica 1 is restarting
		}
		return reps
	}
	for _, c := range []struct {
		load []int64
		want int
	}{
		{[]int64{0, 0, 0, 0}, 0},       // a tie goes to the lowest number
		{[]int64{500, 0, 200, 300}, 2}, // replica 1 is idle but not ready
		{[]int64{100, 0, 100, 99}, 3},
	} {
		if got := leastLoaded(views(c.load)); got != c.want {
			t.Errorf("load %v: got %d, want replica %d", c.load, got, c.want)
		}
	}
	if got := leastLoaded(make([]replicaView, 4)); got != -1 {
		t.Errorf("no replica ready, got replica %d", got)
	}
}

func TestRestartBackoffDoublesFromOneSecondAndStopsAtAMinute(t *testing.T) {
	for n, want := range map[int]time.Duration{
		1: time.Second, 2: 2 * time.Second, 6: 32 * time.Second, 7: time.Minute,
		12: time.Minute, 36: time.Minute, 64: time.Minute, 1 << 20: time.Minute,
	} {
		if got := restartBackoff(n); got != want {
			t.Errorf("restart %d waits %v, want %v", n, got, want)
		}
	}
}

func TestASampleInFlightAtEveryServerDeathIsSentAloneThenFailed(t *testing.T) {
	const k = 2
	p := poison{isolateAfter: k}
	if p.died(7, false) || p.isAlone(7) {
		t.Fatal("one death: neither failed nor isolated")
	}
	if p.died(7, false) || !p.isAlone(7) {
		t.Fatalf("after %d deaths sample 7 must be sent alone", k)
	}
	if p.isAlone(8) {
		t.Error("a sample never in flight at a death is isolated")
	}
	if !p.died(7, true) {
		t.Error("the server died with sample 7 alone: it must fail")
	}
}

func TestASampleSentAloneGetsAnIdleReplicaAndNoneShareIt(t *testing.T) {
	reps := []replicaView{{ready: true, busy: true}, {ready: true}, {ready: true}}
	if got := idleReplica(reps); got != 1 {
		t.Errorf("idle replica = %d, want 1", got)
	}
	if got := idleReplica([]replicaView{{ready: true, busy: true}, {ready: true, busy: true}}); got != -1 {
		t.Errorf("every replica busy: got %d, want none", got)
	}
	// Replica 1 runs a sample alone: the others share the rest, however idle 1 is.
	reps = []replicaView{{ready: true, load: 50}, {ready: true, busy: true, exclusive: true}, {ready: true, load: 40}}
	if got := leastLoaded(reps); got != 2 {
		t.Errorf("least loaded beside an exclusive replica = %d, want 2", got)
	}
}

func TestASortWindowIsShortWhenTheRequestsOpenCannotFillEveryReplicasWindow(t *testing.T) {
	transformers := sglang.ServerInfo{Raw: map[string]any{"server_kind": "transformers", "window_requests": 256.0, "max_batch_requests": 64.0}}
	for _, c := range []struct {
		name                  string
		info                  sglang.ServerInfo
		maxInflight, replicas int
		want                  int
		short                 bool
	}{
		{"the general default", transformers, 32, 1, 384, true},
		{"one short", transformers, 383, 1, 384, true},
		{"exactly enough", transformers, 384, 1, 384, false},
		{"shared by two replicas", transformers, 384, 2, 768, true},
		{"enough for two", transformers, 768, 2, 768, false},
		{"SGLang reports no window", sglang.ServerInfo{Raw: map[string]any{"max_running_requests": 4.0}}, 1, 1, 0, false},
	} {
		want, short := sortWindowShort(c.info, c.maxInflight, c.replicas)
		if want != c.want || short != c.short {
			t.Errorf("%s: sortWindowShort = %d, %v; want %d, %v", c.name, want, short, c.want, c.short)
		}
	}
}
