package checkpoint

import (
	"strings"
	"sync"
	"testing"
)

// A bad record in a group commit fails its own caller only; the others land.
func TestGroupCommitFailsOnlyTheBadRecord(t *testing.T) {
	ix := newIndex(t, 100)
	var wg sync.WaitGroup
	errs := make([]error, 64)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := i
			if i%16 == 5 {
				s = 1000 + i // beyond the job's 100 samples
			}
			errs[i] = ix.CommitDone(doneRecord(s, 1))
		}()
	}
	wg.Wait()
	good := 0
	for i, err := range errs {
		switch {
		case i%16 == 5 && (err == nil || !strings.Contains(err.Error(), "out of range")):
			t.Errorf("commit of sample %d = %v, want out of range", 1000+i, err)
		case i%16 != 5 && err != nil:
			t.Errorf("commit of sample %d = %v", i, err)
		case i%16 != 5:
			good++
		}
	}
	if c := mustCounters(t, ix); c.Done != good {
		t.Fatalf("done = %d, want %d", c.Done, good)
	}
}
