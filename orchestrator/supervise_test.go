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
		if got := leastLoaded(reps, c.load); got == nil || got.n != c.want {
			t.Errorf("load %v: got %v, want replica %d", c.load, got, c.want)
		}
	}
	for _, rep := range reps {
		rep.status.State = "restarting"
	}
	if got := leastLoaded(reps, []int64{0, 0, 0, 0}); got != nil {
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
