package orchestrator

import (
	"strings"
	"testing"
)

// A staging filesystem filled by others below the budget pauses admission with the
// reason "staging full", even for a sample that would be alone: the hook could not
// write its dump. Room on it admits again.
func TestAdmissionPausesWithStagingFullWhenTheStagingDiskHasNoRoom(t *testing.T) {
	b := budgets{diskFree: 1 << 40, shmBudget: 1 << 30, shmUsed: 0, shmFree: 1 << 20, shmDir: "/dev/shm/x"}
	for _, alone := range []bool{true, false} {
		if why := b.blocked(0, 2<<20, alone); !strings.HasPrefix(why, "staging full: 1.0 MiB free on /dev/shm/x") {
			t.Errorf("alone=%v: blocked = %q, want staging full", alone, why)
		}
	}
	b.shmFree = 1 << 30
	if why := b.blocked(0, 2<<20, false); why != "" {
		t.Errorf("with room: blocked = %q", why)
	}
	found := false
	for _, r := range pauseReasons {
		found = found || r == "staging full"
	}
	if !found {
		t.Error("staging full is not a pause reason label")
	}
}
