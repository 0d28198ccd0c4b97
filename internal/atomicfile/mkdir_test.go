package atomicfile

import (
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/extract-dev/extract/internal/lazyfs"
)

// Two movers make the same new rows_ folder. The first is held between its mkdir and
// its fsync of the parent; the second finds the folder there, renames its file into it
// and returns, so the caller would commit the sample. The power then goes: the file must
// still be there, so the second caller must not have trusted a folder it did not see
// made durable. On a lazyfs disk, which keeps only what was fsynced.
func TestAFolderAnotherCallerJustMadeIsDurableBeforeMkdirAllReturns(t *testing.T) {
	disk, mnt := mountDisk(t)
	rows := filepath.Join(mnt, "out", "rows_0-2000")

	held, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	afterMkdir = func(dir string) {
		if dir != rows {
			return
		}
		first := false
		once.Do(func() { first = true })
		if first {
			close(held)
			<-release
		}
	}
	t.Cleanup(func() { afterMkdir = func(string) {} })

	firstDone := make(chan error, 1)
	go func() { firstDone <- MkdirAll(rows, 0o755) }()
	<-held
	if err := MkdirAll(rows, 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(rows, "data_1.safetensors")
	if err := WriteFile(path, []byte("sample 1"), 0o644); err != nil {
		t.Fatal(err)
	}
	// The sample would be committed now. The first caller still has not fsynced.
	if err := disk.PowerCut(); err != nil {
		t.Fatal(err)
	}
	close(release)
	<-firstDone // its fsyncs reach the new boot or fail: either way it is not the point

	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("after the power cut: %v: the file was committed before its folder's entry was durable", err)
	}
	if string(b) != "sample 1" {
		t.Fatalf("after the power cut the file holds %q", b)
	}
}

// mountDisk mounts an empty lazyfs disk, which keeps across PowerCut only what was
// fsynced, or skips the test where FUSE cannot be mounted.
func mountDisk(t *testing.T) (*lazyfs.FS, string) {
	t.Helper()
	mnt := t.TempDir()
	disk := lazyfs.New()
	if err := disk.Mount(mnt); err != nil {
		if errors.Is(err, lazyfs.ErrUnavailable) {
			t.Skipf("needs a FUSE mount (root and /dev/fuse) to see what survives a power cut: %v", err)
		}
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := disk.Unmount(); err != nil {
			t.Errorf("unmount lazyfs: %v", err)
		}
	})
	return disk, mnt
}
