package atomicfile

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// What WriteFile returned for survives a power cut: the new body, under the final name,
// and no temp file. Without the file's fsync the body would be empty after the cut,
// without the directory's the rename would be lost.
func TestWriteFileReplacesTheFileAndLeavesNoTemp(t *testing.T) {
	disk, dir := mountDisk(t)
	path := filepath.Join(dir, "run.json")
	for _, body := range []string{"first", "second"} {
		if err := WriteFile(path, []byte(body), 0o640); err != nil {
			t.Fatal(err)
		}
		if err := disk.PowerCut(); err != nil {
			t.Fatal(err)
		}
		if b, err := os.ReadFile(path); string(b) != body {
			t.Fatalf("after a power cut the file holds %q (%v), want %q", b, err, body)
		}
		if st, err := os.Stat(path); err != nil || st.Mode().Perm() != 0o640 {
			t.Fatalf("after a power cut: %v, mode %v, want 0640", err, st.Mode())
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

// Many movers renaming into one folder share its fsyncs: on a disk whose every fsync
// takes 200 ms, 64 writers that rename at about the same time cost a few directory
// fsyncs, not 64 (counted by the disk). Each still gets an fsync that began after its
// rename: after a power cut every file is there.
func TestConcurrentSyncDirCallersAllReturnAndShareFsyncs(t *testing.T) {
	disk, dir := mountDisk(t)
	disk.SetSyncDelay(200 * time.Millisecond)
	before := disk.Stats().DirSyncs
	const writers = 64
	var wg sync.WaitGroup
	for i := range writers {
		wg.Go(func() {
			if err := WriteFile(filepath.Join(dir, fmt.Sprintf("f%d", i)), []byte("x"), 0o644); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	n := disk.Stats().DirSyncs - before
	t.Logf("%d writers, %d directory fsyncs", writers, n)
	if n < 1 || n > writers/4 {
		t.Errorf("%d directory fsyncs for %d writers renaming together, want a few shared ones", n, writers)
	}
	if err := disk.PowerCut(); err != nil {
		t.Fatal(err)
	}
	for i := range writers {
		if b, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("f%d", i))); string(b) != "x" {
			t.Errorf("after a power cut f%d holds %q (%v): its caller returned before an fsync covered it", i, b, err)
		}
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
