package checkpoint

import (
	"io"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

func TestResetNeverLetsARidRepeat(t *testing.T) {
	ix := newIndex(t, 10)
	// s5 reaches attempt 2, s6 fails at attempt 3, s7 is done at attempt 1.
	for range 2 {
		if _, err := ix.BeginAttempts([]int{5}); err != nil {
			t.Fatal(err)
		}
	}
	if err := ix.MarkFailed(6, 3, "boom"); err != nil {
		t.Fatal(err)
	}
	if err := ix.CommitDone(doneRecord(7, 1)); err != nil {
		t.Fatal(err)
	}
	if err := ix.Reset(Meta{DatasetFingerprint: "fp-1", Total: 10}); err != nil {
		t.Fatal(err)
	}
	// Every attempt after the reset is above every attempt ever made: 3 was the highest.
	got, err := ix.BeginAttempts([]int{5, 6, 7, 0})
	if err != nil {
		t.Fatal(err)
	}
	for i, a := range got {
		if a != 4 {
			t.Fatalf("after --fresh, attempts = %v, want all 4 (sample %d would reuse a rid)", got, i)
		}
	}
	// A second reset remembers the first one's base and what came after it.
	if err := ix.Reset(Meta{DatasetFingerprint: "fp-2", Total: 10}); err != nil {
		t.Fatal(err)
	}
	if err := ix.Reset(Meta{DatasetFingerprint: "fp-3", Total: 10}); err != nil {
		t.Fatal(err)
	}
	if got, err := ix.BeginAttempts([]int{9}); err != nil || got[0] != 5 {
		t.Fatalf("after two more resets, attempt = %v, %v; want 5", got, err)
	}
	if m, _, _ := ix.Meta(); m.AttemptBase != 4 {
		t.Fatalf("Meta.AttemptBase = %d, want 4", m.AttemptBase)
	}
}

func TestAttemptBaseSurvivesReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "index.db")
	ix, err := Open(path, OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := ix.Init(Meta{DatasetFingerprint: "fp-1", Total: 3}); err != nil {
		t.Fatal(err)
	}
	if err := ix.MarkFailed(0, 9, "x"); err != nil {
		t.Fatal(err)
	}
	if err := ix.Reset(Meta{DatasetFingerprint: "fp-1", Total: 3}); err != nil {
		t.Fatal(err)
	}
	_ = ix.Close()
	ix, err = Open(path, OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer ix.Close()
	if got, err := ix.BeginAttempts([]int{0}); err != nil || got[0] != 10 {
		t.Fatalf("attempt after reopen = %v, %v; want 10", got, err)
	}
}

// copyFixture copies a committed index fixture into a temp dir, so that a test may
// write to it.
func copyFixture(t *testing.T, name string) string {
	t.Helper()
	src, err := os.Open(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	path := filepath.Join(t.TempDir(), "index.db")
	dst, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		t.Fatal(err)
	}
	if err := dst.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

// testdata/index-v1.db was written by the code before attempt_base existed: 10 samples,
// 0 done at a1, 1 inflight at a1, 2 done at a2, 3 failed at a3.
func TestAV1IndexWithoutAttemptBaseOpensAndReadsAsBaseZero(t *testing.T) {
	for _, ro := range []bool{true, false} {
		ix, err := Open(copyFixture(t, "index-v1.db"), OpenOptions{ReadOnly: ro})
		if err != nil {
			t.Fatalf("readonly=%v: %v", ro, err)
		}
		m, ok, err := ix.Meta()
		want := Meta{SchemaVersion: 1, DatasetFingerprint: "fp-v1", DatasetPath: "/data/v1.jsonl", ConfigFingerprint: "cfg-v1",
			Total: 10, Created: time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)}
		if err != nil || !ok || !m.Created.Equal(want.Created) {
			t.Fatalf("Meta = %+v, %v, %v", m, ok, err)
		}
		m.Created = want.Created
		if m != want {
			t.Fatalf("Meta = %+v, want %+v", m, want)
		}
		if c := mustCounters(t, ix); c != (Counters{Done: 2, Failed: 1, BytesWritten: 3234, Tokens: 12}) {
			t.Fatalf("counters = %+v", c)
		}
		p, err := ix.Load(10)
		if err != nil {
			t.Fatal(err)
		}
		if p.State[0] != StateDone || p.State[1] != StateInflight || p.State[2] != StateDone || p.State[3] != StateFailed || p.Attempt[3] != 3 {
			t.Fatalf("Load = %+v", p)
		}
		if !ro {
			if got, err := ix.BeginAttempts([]int{1, 4}); err != nil || got[0] != 2 || got[1] != 1 {
				t.Fatalf("BeginAttempts on v1 = %v, %v; want [2 1]", got, err)
			}
			if err := ix.Reset(Meta{DatasetFingerprint: "fp-v1", Total: 10}); err != nil {
				t.Fatal(err)
			}
			if got, err := ix.BeginAttempts([]int{1, 4}); err != nil || got[0] != 4 || got[1] != 4 {
				t.Fatalf("BeginAttempts after Reset of v1 = %v, %v; want [4 4]", got, err)
			}
		}
		_ = ix.Close()
	}
}

func TestRecordAttemptRefusesANumberThatWouldReuseARid(t *testing.T) {
	ix := newIndex(t, 4)
	if err := ix.RecordAttempt(1, 1, ""); err != nil {
		t.Fatal(err)
	}
	for _, a := range []int{0, 1} {
		if err := ix.RecordAttempt(1, a, ""); err == nil {
			t.Errorf("RecordAttempt(1, %d) after attempt 1 was accepted", a)
		}
	}
	if err := ix.RecordAttempt(1, 3, ""); err != nil {
		t.Errorf("a gap in attempt numbers is fine: %v", err)
	}
	if r, _, _ := ix.Get(1); r.Attempt != 3 || r.State != StateInflight {
		t.Errorf("record = attempt %d %s, want 3 inflight", r.Attempt, r.State)
	}
}

// Senders record their attempts concurrently, through the group commit: every one lands.
func TestConcurrentRecordAttemptsAllLand(t *testing.T) {
	const n = 200
	ix := newIndex(t, n)
	var wg sync.WaitGroup
	for s := range n {
		wg.Go(func() {
			if err := ix.RecordAttempt(s, 1, ""); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	p, err := ix.Load(n)
	if err != nil {
		t.Fatal(err)
	}
	for s := range n {
		if p.Attempt[s] != 1 || p.State[s] != StateInflight {
			t.Fatalf("sample %d: attempt %d %s", s, p.Attempt[s], p.State[s])
		}
	}
}
