package checkpoint

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestInspectIndexReportsFactsAndClosesTheIndexBeforeTheFileChecks(t *testing.T) {
	j := newBigJob(t, 10)
	var bytes int64
	for s := range 6 {
		moved := j.move(t, s, nil)
		j.commit(t, moved, s)
		bytes += moved.Bytes
	}
	if err := j.ix.MarkFailed(8, 2, "boom"); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(OutputPath(j.out, 1)); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(OutputPath(j.out, 3), 100); err != nil {
		t.Fatal(err)
	}
	path := j.ix.Path()
	if err := j.ix.Close(); err != nil {
		t.Fatal(err)
	}

	f, err := InspectIndex(path, InspectOptions{OutputDir: j.out})
	if err != nil {
		t.Fatal(err)
	}
	if !f.Exists || !f.Initialised || f.SchemaVersion != SchemaVersion || f.Meta.Total != 10 || f.Meta.DatasetFingerprint != "fp-1" || f.Meta.ConfigFingerprint != "cfg-1" {
		t.Fatalf("facts %+v", f)
	}
	if f.Counters != (Counters{Done: 6, Failed: 1, BytesWritten: bytes, Tokens: 30}) {
		t.Fatalf("counters %+v", f.Counters)
	}
	if f.Progress == nil || len(f.Progress.State) != 10 || f.Progress.State[8] != StateFailed || len(f.Done) != 6 {
		t.Fatalf("progress %+v, done %v", f.Progress, f.Done)
	}
	if f.Checked != 6 || len(f.Problems) != 2 ||
		!strings.Contains(f.Problems[0], "sample 1:") || !strings.Contains(f.Problems[0], "missing") ||
		!strings.Contains(f.Problems[1], "sample 3:") || !strings.Contains(f.Problems[1], "100 bytes, the index recorded") {
		t.Fatalf("stat sample: checked %d, problems %q", f.Checked, f.Problems)
	}
	// Closed: a writer gets the lock at once.
	ix, err := Open(path, OpenOptions{Timeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatalf("InspectIndex left the index locked: %v", err)
	}
	_ = ix.Close()
}

func TestInspectIndexStatsAnEvenSampleOfTheDoneFiles(t *testing.T) {
	ix := newIndex(t, 1000)
	for s := range 1000 {
		if s%2 == 0 {
			if err := ix.CommitDone(doneRecord(s, 1)); err != nil {
				t.Fatal(err)
			}
		}
	}
	path := ix.Path()
	_ = ix.Close()
	f, err := InspectIndex(path, InspectOptions{OutputDir: t.TempDir(), StatSample: 10})
	if err != nil {
		t.Fatal(err)
	}
	if len(f.Done) != 500 || f.Checked != 10 || len(f.Problems) != 10 {
		t.Fatalf("done %d, checked %d, problems %d", len(f.Done), f.Checked, len(f.Problems))
	}
	if !strings.Contains(f.Problems[9], "sample 900:") {
		t.Fatalf("sample not spread evenly: %q", f.Problems)
	}
}

func TestInspectIndexOfNoFileSaysSoAndOfABrokenOneIsErrDamaged(t *testing.T) {
	if !isolated(t) {
		return
	}
	dir := t.TempDir()
	f, err := InspectIndex(filepath.Join(dir, "index.db"), InspectOptions{OutputDir: dir})
	if err != nil || f.Exists {
		t.Fatalf("InspectIndex of no file = %+v, %v", f, err)
	}
	if _, err := os.Stat(filepath.Join(dir, "index.db")); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("InspectIndex created the index")
	}
	path, _ := damagedFixture(t)
	if err := os.Truncate(path, 10000); err != nil {
		t.Fatal(err)
	}
	f, err = InspectIndex(path, InspectOptions{OutputDir: dir})
	if !errors.Is(err, ErrDamaged) || !f.Exists {
		t.Fatalf("InspectIndex of a truncated index = %+v, %v; want ErrDamaged", f, err)
	}
}

func TestInspectIndexOfAnIndexHeldByARunIsErrLocked(t *testing.T) {
	ix := newIndex(t, 10)
	_, err := InspectIndex(ix.Path(), InspectOptions{Timeout: 50 * time.Millisecond})
	if !errors.Is(err, ErrLocked) {
		t.Fatalf("InspectIndex of a held index = %v, want ErrLocked", err)
	}
}
