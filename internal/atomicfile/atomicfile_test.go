package atomicfile

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

func TestWriteFileReplacesTheFileAndLeavesNoTemp(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "run.json")
	for _, body := range []string{"first", "second"} {
		if err := WriteFile(path, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		if b, _ := os.ReadFile(path); string(b) != body {
			t.Fatalf("file holds %q, want %q", b, body)
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("dir holds %d entries, want only run.json", len(entries))
	}
	err := WriteFile(filepath.Join(dir, "missing", "x"), nil, 0o644)
	if err == nil || !strings.Contains(err.Error(), "missing") {
		t.Errorf("write into a missing dir: %v, want an error naming the path", err)
	}
}

func TestMkdirAllCreatesMissingParents(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "out", "rows_0-2000")
	if err := MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		t.Fatalf("stat %s: %v", dir, err)
	}
	if err := MkdirAll(dir, 0o755); err != nil {
		t.Fatalf("second MkdirAll: %v", err)
	}
}

// Many movers renaming into one folder share its fsyncs; each still gets an fsync that
// began after its call (the power-cut test checks the durability itself).
func TestConcurrentSyncDirCallersAllReturnAndShareFsyncs(t *testing.T) {
	dir := t.TempDir()
	var wg sync.WaitGroup
	for i := range 64 {
		wg.Go(func() {
			if err := WriteFile(filepath.Join(dir, fmt.Sprintf("f%d", i)), []byte("x"), 0o644); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	g, _ := dirGroups.Load(filepath.Clean(dir))
	n := g.(*dirGroup).done
	t.Logf("64 writers, %d directory fsyncs", n)
	if n == 0 || n > 64 {
		t.Errorf("%d directory fsyncs for 64 writers", n)
	}
	if err := SyncDir(filepath.Join(dir, "missing")); err == nil {
		t.Error("SyncDir of a missing dir succeeded")
	}
}

// A caller whose window holds a failed fsync gets the error even when a later fsync of
// the same dir succeeds: a writeback error is reported only once.
func TestSyncDirReportsAFailureInTheCallersWindow(t *testing.T) {
	g := &dirGroup{started: 5, done: 5, errSeq: 5, err: errors.New("EIO")}
	dir := t.TempDir()
	dirGroups.Store(filepath.Clean(dir), g)
	// A new caller needs fsync 6, which succeeds: the old failure (5) is not its.
	if err := SyncDir(dir); err != nil {
		t.Fatalf("SyncDir = %v; fsync 5's failure is outside this caller's window", err)
	}
	// A caller that needed fsync 7 but saw fsync 7 fail gets it, whatever came later.
	g.mu.Lock()
	g.errSeq, g.err = 7, errors.New("EIO")
	g.done, g.started = 8, 8
	g.mu.Unlock()
	if err := g.errFor(7); err == nil {
		t.Error("a failure in the caller's window was not reported")
	}
}
