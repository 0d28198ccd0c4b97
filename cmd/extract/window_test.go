package main

import (
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// A slow output disk must not slow the server down while staging has room: a dump
// waiting on its fsyncs holds staging, not one of the server's max_inflight requests.
// The backlog of such dumps is bounded all the same, at 8 windows: beyond that the disk
// is the limit. The output dir is on a lazyfs disk whose every fsync takes 2 s; the
// state dir is not.
func TestASlowOutputDiskDoesNotHoldTheServersRequestWindowUpToABoundedBacklog(t *testing.T) {
	disk, mnt := mountLazyDisk(t)
	disk.SetSyncDelay(2 * time.Second)

	const n, window, backlog = 24, 2, 8 * 2
	j := newJob(t, n, 0)
	j.out = filepath.Join(mnt, "out")
	j.state = filepath.Join(t.TempDir(), "state")
	j.env = append(j.env, "EXTRACT_OUTPUT_DIR="+j.out, "EXTRACT_STATE_DIR="+j.state,
		"EXTRACT_RUN_MAX_INFLIGHT="+strconv.Itoa(window), "EXTRACT_RUN_MOVERS=1")
	_, wait := j.start("run")

	// The first output appears under its final name once its file fsync is over (2 s)
	// and before its directory fsync (2 s more): no move has landed yet. By then the
	// server must have had more than one window's worth of requests, and no more than
	// the backlog and a window.
	requestsAtFirstOutput := -1
	for deadline := time.Now().Add(time.Minute); requestsAtFirstOutput < 0; time.Sleep(5 * time.Millisecond) {
		if outs, _ := filepath.Glob(filepath.Join(j.out, "rows_*", "data_*.safetensors")); len(outs) > 0 {
			requestsAtFirstOutput = len(j.requests())
		} else if time.Now().After(deadline) {
			code, stderr := wait()
			t.Fatalf("no output after a minute (run exit %d)\n%s", code, stderr)
		}
	}
	if code, stderr := wait(); code != 0 {
		t.Fatalf("run exit %d\n%s", code, stderr)
	}
	if requestsAtFirstOutput <= window {
		t.Errorf("the server had received %d requests when the first output appeared, no more than the window of %d: dumps waiting on the disk held it", requestsAtFirstOutput, window)
	}
	if requestsAtFirstOutput > backlog+window {
		t.Errorf("the server had received %d requests when the first output appeared, more than a backlog of %d and a window of %d: the backlog is unbounded", requestsAtFirstOutput, backlog, window)
	}
	if got := len(j.requests()); got != n {
		t.Errorf("the simulator received %d requests, want %d (one per sample)", got, n)
	}
	if st := j.status(); num(st["done"]) != n {
		t.Errorf("status says %v done, want %d", st["done"], n)
	}
	t.Logf("requests at the first output: %d of %d; file fsyncs %d, dir fsyncs %d", requestsAtFirstOutput, n, disk.Stats().FileSyncs, disk.Stats().DirSyncs)
}

// run.max_inflight bounds the requests open at the server, also when a dump arrives
// before its answer (SGLang dumps at the end of the prefill and answers after decoding).
func TestTheServerNeverHasMoreThanMaxInflightRequestsOpen(t *testing.T) {
	const n, window = 40, 4
	j := newJob(t, n, 0)
	j.env = append(j.env, "EXTRACT_RUN_MAX_INFLIGHT=4", "EXTRACT_SERVER_MAX_NEW_TOKENS=3",
		"EXTRACT_SERVER_SIMULATOR_DECODE_DELAY=50ms")
	if r := j.run("run"); r.code != 0 {
		t.Fatalf("run exit %d\n%s", r.code, r.stderr)
	}
	most := 0
	for _, l := range j.requestLines() {
		if len(l) < 3 {
			t.Fatalf("request log line %q has no open count", l)
		}
		open, err := strconv.Atoi(l[2])
		if err != nil {
			t.Fatal(err)
		}
		most = max(most, open)
	}
	if most > window {
		t.Errorf("the simulator had %d requests open at once, run.max_inflight is %d", most, window)
	}
	if got := len(j.requests()); got != n {
		t.Errorf("the simulator received %d requests, want %d", got, n)
	}
}
