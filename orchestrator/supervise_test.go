package orchestrator

import "testing"

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
