package dataset

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/extract-dev/extract/configs"
	"github.com/extract-dev/extract/internal/errclass"
)

// openWithin opens the dataset in a goroutine: one that blocks (a FIFO with no writer)
// fails the test instead of hanging it.
func openWithin(t *testing.T, cfg *configs.Config) error {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		d, err := OpenCached(context.Background(), cfg)
		if err == nil {
			d.Close()
		}
		done <- err
	}()
	select {
	case err := <-done:
		return err
	case <-time.After(10 * time.Second):
		t.Fatalf("opening dataset %s did not return in 10 s", cfg.Dataset)
		return nil
	}
}

func TestADatasetThatIsNoRegularFileIsRefusedAtOnceSayingWhatItIs(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo.jsonl")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link.jsonl")
	if err := os.Symlink(fifo, link); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ path, says string }{
		{fifo, "is a FIFO (named pipe), not a regular file"},
		{link, "is a FIFO (named pipe), not a regular file"},
		{"/dev/zero", "is a character device, not a regular file"},
		{dir, "is a directory, not a regular file"},
	} {
		err := openWithin(t, datasetConfig(c.path, filepath.Join(t.TempDir(), "state")))
		if !errors.Is(err, ErrBad) || !strings.Contains(err.Error(), c.path+" "+c.says) {
			t.Errorf("dataset %s: %v; want ErrBad saying %q", c.path, err, c.says)
		}
	}
	// A symlink to a regular file is an ordinary way to point at a dataset.
	real := writeDataset(t, `{"input_ids": [1, 2]}`+"\n")
	good := filepath.Join(dir, "good.jsonl")
	if err := os.Symlink(real, good); err != nil {
		t.Fatal(err)
	}
	if err := openWithin(t, datasetConfig(good, filepath.Join(t.TempDir(), "state"))); err != nil {
		t.Errorf("a symlink to a regular dataset: %v", err)
	}
}

// A 600 MB file without a newline (a sparse one: no disk is written) is one line far past
// dataset_max_line: refused naming the line, having read little more than the limit.
func TestALineLongerThanDatasetMaxLineIsRefusedNamingItWithoutReadingItAll(t *testing.T) {
	path := writeDataset(t, `{"input_ids": [1]}`+"\n"+`{"input_ids": [2]}`+"\n")
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(600 << 20); err != nil {
		t.Fatal(err)
	}
	f.Close()
	cfg := datasetConfig(path, filepath.Join(t.TempDir(), "state"))
	cfg.DatasetMaxLine = 4 << 20
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	err = openWithin(t, cfg)
	runtime.ReadMemStats(&after)
	if !errors.Is(err, ErrBad) || !strings.Contains(err.Error(), "line 3 (sample 2) is longer than dataset_max_line (4.0 MiB)") {
		t.Fatalf("err = %v, want ErrBad naming line 3 and dataset_max_line", err)
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 64<<20 {
		t.Errorf("refusing the line allocated %d MiB, want about dataset_max_line (4 MiB)", alloc>>20)
	}
}

func TestStoppingWhileTheDatasetIsReadIsATemporaryFailure(t *testing.T) {
	cfg := datasetConfig(writeDataset(t, strings.Repeat(`{"input_ids": [1, 2, 3]}`+"\n", 1000)), filepath.Join(t.TempDir(), "state"))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := OpenCached(ctx, cfg); !errors.Is(err, errclass.ErrTemporary) {
		t.Errorf("OpenCached after SIGTERM: %v, want errclass.ErrTemporary (exit 75)", err)
	}
	if _, err := OpenJob(ctx, cfg); !errors.Is(err, errclass.ErrTemporary) {
		t.Errorf("OpenJob after SIGTERM: %v, want errclass.ErrTemporary (exit 75)", err)
	}
}
