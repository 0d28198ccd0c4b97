package orchestrator

import (
	"testing"
	"time"
)

func TestEachSampleGoesToTheReadyReplicaWithTheFewestTokensInFlight(t *testing.T) {
	reps := make([]*replica, 4)
	for r := range reps {
		reps[r] = &replica{n: r, status: ServerStatus{Replica: r, State: "ready"}}
	}
	reps[1].status.State = "restarting"
	for _, c := range []struct {
		load []int64
		want int
	}{
		{[]int64{0, 0, 0, 0}, 0},       // a tie goes to the lowest number
		{[]int64{500, 0, 200, 300}, 2}, // replica 1 is idle but not ready
		{[]int64{100, 0, 100, 99}, 3},
	} {
		if got := leastLoaded(reps, c.load, nil); got == nil || got.n != c.want {
			t.Errorf("load %v: got %v, want replica %d", c.load, got, c.want)
		}
	}
	for _, rep := range reps {
		rep.status.State = "restarting"
	}
	if got := leastLoaded(reps, []int64{0, 0, 0, 0}, nil); got != nil {
		t.Errorf("no replica ready, got replica %d", got.n)
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
	var a admission
	const k = 2
	if a.died(7, k, false) || a.alone[7] {
		t.Fatal("one death: neither failed nor isolated")
	}
	if a.died(7, k, false) || !a.alone[7] {
		t.Fatalf("after %d deaths sample 7 must be sent alone", k)
	}
	if a.alone[8] {
		t.Error("a sample never in flight at a death is isolated")
	}
	if !a.died(7, k, true) {
		t.Error("the server died with sample 7 alone: it must fail")
	}
}

func TestASampleSentAloneGetsAnIdleReplicaAndNoneShareIt(t *testing.T) {
	reps := make([]*replica, 3)
	for r := range reps {
		reps[r] = &replica{n: r, status: ServerStatus{Replica: r, State: "ready"}}
	}
	if got := idleReplica(reps, []bool{true, false, false}); got == nil || got.n != 1 {
		t.Errorf("idle replica = %v, want 1", got)
	}
	if got := idleReplica(reps, []bool{true, true, true}); got != nil {
		t.Errorf("every replica busy: got %d, want none", got.n)
	}
	// Replica 1 runs a sample alone: the others share the rest, however idle 1 is.
	if got := leastLoaded(reps, []int64{50, 0, 40}, []bool{false, true, false}); got == nil || got.n != 2 {
		t.Errorf("least loaded beside an exclusive replica = %v, want 2", got)
	}
}
