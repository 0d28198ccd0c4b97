package orchestrator

import (
	"slices"
	"strings"
	"testing"
	"time"
)

// The request window's decision, from counts alone: what is sent, to which replica, and
// why admission pauses.
func TestTheRequestWindowDecidesWhatIsSentAndWhyItPauses(t *testing.T) {
	roomy := budgets{diskFree: 1 << 40, shmBudget: 1 << 30, shmFree: 1 << 30, outputDir: "/out", shmDir: "/dev/shm/x"}
	two := []replicaView{{ready: true}, {ready: true}}
	for _, c := range []struct {
		name   string
		queue  []int
		w      window
		want   []send
		paused string // prefix of the one pause reason; "" for none
	}{
		{name: "room for everything: samples alternate over the replicas by load",
			queue: []int{0, 1, 2}, w: window{maxInflight: 4, budgets: roomy, replicas: two},
			want: []send{{0, 0, false}, {1, 1, false}, {2, 0, false}}},
		{name: "the window counts open and answered requests",
			queue: []int{0, 1, 2}, w: window{maxInflight: 4, requestsOpen: 1, answered: 2, budgets: roomy, replicas: two},
			want: []send{{0, 0, false}}},
		{name: "a full window sends nothing and is no pause",
			queue: []int{0}, w: window{maxInflight: 2, requestsOpen: 2, budgets: roomy, replicas: two}},
		{name: "dumps moving hold staging, not the window",
			queue: []int{0, 1}, w: window{maxInflight: 2, moving: 15, flights: 15, budgets: roomy, replicas: two},
			want: []send{{0, 0, false}, {1, 1, false}}},
		{name: "a backlog of 8 windows of dumps to move pauses",
			queue: []int{0}, w: window{maxInflight: 2, moving: 16, flights: 16, budgets: roomy, replicas: two},
			paused: "output disk behind: 16 dumps wait to be moved"},
		{name: "storing failing pauses first",
			queue: []int{0}, w: window{maxInflight: 2, storeFailing: "output disk full (/out)", budgets: roomy, replicas: two},
			paused: "cannot store dumps: output disk full (/out)"},
		{name: "the staging budget pauses once the flights' bytes reach it",
			queue: []int{0, 1, 2}, w: window{maxInflight: 8, budgets: budgets{diskFree: 1 << 40, shmBudget: 250, shmFree: 1 << 30, shmDir: "/dev/shm/x"}, replicas: two},
			want: []send{{0, 0, false}, {1, 1, false}}, paused: "staging budget:"},
		{name: "a sample over the staging budget still goes when nothing else is in flight",
			queue: []int{0, 1}, w: window{maxInflight: 8, budgets: budgets{diskFree: 1 << 40, shmBudget: 10, shmFree: 1 << 30}, replicas: two},
			want: []send{{0, 0, false}}, paused: "staging budget:"},
		{name: "the disk reserve pauses counting the bytes in flight",
			queue: []int{0, 1}, w: window{maxInflight: 8, flights: 1, reserved: 100, budgets: budgets{diskFree: 1000, diskReserve: 750, shmBudget: 1 << 30, shmFree: 1 << 30, outputDir: "/out"}, replicas: two},
			want: []send{{0, 0, false}}, paused: "output disk reserve: 1000 B free on /out"},
		{name: "no replica ready",
			queue: []int{0}, w: window{maxInflight: 2, budgets: roomy, replicas: []replicaView{{}, {}}},
			paused: "no server ready"},
		{name: "a sample of the poison rule goes alone to an idle replica, and nothing follows it there",
			queue: []int{0, 1, 2}, w: window{maxInflight: 8, budgets: roomy, replicas: []replicaView{{ready: true, busy: true, load: 5}, {ready: true}},
				poison: &poison{alone: map[int]bool{0: true}, deaths: map[int]int{0: 2}}},
			want: []send{{0, 1, true}, {1, 0, false}, {2, 0, false}}},
		{name: "a sample to be sent alone waits while every replica is busy",
			queue: []int{0, 1}, w: window{maxInflight: 8, budgets: roomy, replicas: []replicaView{{ready: true, busy: true}, {ready: true, busy: true}},
				poison: &poison{alone: map[int]bool{0: true}, deaths: map[int]int{0: 2}}},
			paused: "isolating a sample: sample 0, or one sent before it, was in flight at 2 server deaths"},
	} {
		t.Run(c.name, func(t *testing.T) {
			a := admission{queue: slices.Clone(c.queue), failures: map[int]int{}}
			c.w.cost = func(int) (int64, int64) { return 10, 100 }
			got, paused := a.decide(c.w, time.Now(), func(int) bool { return false })
			if !slices.Equal(got, c.want) {
				t.Errorf("sent %v, want %v", got, c.want)
			}
			switch {
			case c.paused == "" && len(paused) > 0:
				t.Errorf("paused %q, want no pause", paused)
			case c.paused != "" && (len(paused) != 1 || !strings.HasPrefix(paused[0], c.paused)):
				t.Errorf("paused %q, want one reason starting %q", paused, c.paused)
			}
			if len(a.queue) != len(c.queue)-len(c.want) {
				t.Errorf("queue left %v after sending %d of %v", a.queue, len(c.want), c.queue)
			}
		})
	}
}

// Admission resumes by itself: the same queue that paused on a budget is sent once the
// next measurement finds room, and a due retry goes before the queue.
func TestTheRequestWindowResumesWhenRoomReturnsAndSendsDueRetriesFirst(t *testing.T) {
	a := admission{queue: []int{3, 4}, failures: map[int]int{}}
	now := time.Now()
	a.retryAt(9, now.Add(time.Second))
	w := window{maxInflight: 8, flights: 1, reserved: 100, replicas: []replicaView{{ready: true}},
		budgets: budgets{diskFree: 1 << 40, shmBudget: 150, shmFree: 1 << 30},
		cost:    func(int) (int64, int64) { return 10, 100 }}
	if got, paused := a.decide(w, now, func(int) bool { return false }); len(got) != 0 || len(paused) != 1 {
		t.Fatalf("over the budget: sent %v, paused %q; want nothing sent and one reason", got, paused)
	}
	w.budgets.shmBudget = 1 << 30
	got, paused := a.decide(w, now.Add(2*time.Second), func(int) bool { return false })
	if want := []send{{9, 0, false}, {3, 0, false}, {4, 0, false}}; !slices.Equal(got, want) || len(paused) != 0 {
		t.Errorf("with room: sent %v, paused %q; want %v and no pause", got, paused, want)
	}
}
