package main

import (
	"bytes"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/extract-dev/extract/internal/lazyfs"
)

// A slow output disk must not slow the server down while staging has room: a dump
// waiting on its fsyncs holds staging, not one of the server's max_inflight requests.
// The output dir is on a lazyfs disk whose every fsync takes 2 s; the state dir is not.
func TestASlowOutputDiskDoesNotHoldTheServersRequestWindow(t *testing.T) {
	mnt := t.TempDir()
	disk := lazyfs.New()
	if err := disk.Mount(mnt); err != nil {
		if errors.Is(err, lazyfs.ErrUnavailable) {
			t.Skipf("needs a FUSE mount: %v", err)
		}
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := disk.Unmount(); err != nil {
			t.Errorf("unmount lazyfs: %v", err)
		}
	})
	disk.SetSyncDelay(2 * time.Second)

	const n, window = 24, 4
	j := newJob(t, n, 0)
	j.out = filepath.Join(mnt, "out")
	j.state = filepath.Join(t.TempDir(), "state")
	j.env = append(j.env, "EXTRACT_OUTPUT_DIR="+j.out, "EXTRACT_STATE_DIR="+j.state,
		"EXTRACT_RUN_MAX_INFLIGHT=4", "EXTRACT_RUN_MOVERS=1")
	cmd := j.command("run")
	var errb bytes.Buffer
	cmd.Stderr = &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()

	// The first output appears under its final name once its file fsync is over (2 s)
	// and before its directory fsync (2 s more): no move has landed yet. By then the
	// server must have had more than one window's worth of requests.
	deadline := time.After(time.Minute)
	requestsAtFirstOutput := -1
	for requestsAtFirstOutput < 0 {
		select {
		case err := <-exited:
			t.Fatalf("run exited (%v) before any output appeared\n%s", err, errb.String())
		case <-deadline:
			t.Fatalf("no output after a minute\n%s", errb.String())
		case <-time.After(5 * time.Millisecond):
		}
		if outs, _ := filepath.Glob(filepath.Join(j.out, "rows_*", "data_*.safetensors")); len(outs) > 0 {
			requestsAtFirstOutput = len(j.requests())
		}
	}
	if err := <-exited; err != nil {
		t.Fatalf("run: %v\n%s", err, errb.String())
	}
	if requestsAtFirstOutput <= window {
		t.Errorf("the server had received %d requests when the first output appeared, no more than the window of %d: dumps waiting on the disk held it", requestsAtFirstOutput, window)
	}
	if got := len(j.requests()); got != n {
		t.Errorf("the simulator received %d requests, want %d (one per sample)", got, n)
	}
	if st := j.status(); num(st["done"]) != n {
		t.Errorf("status says %v done, want %d", st["done"], n)
	}
	t.Logf("requests at the first output: %d of %d; file fsyncs %d, dir fsyncs %d", requestsAtFirstOutput, n, disk.Stats().FileSyncs, disk.Stats().DirSyncs)
}
