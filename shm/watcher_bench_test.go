package shm

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// benchStaging is a fresh directory on /dev/shm when it is a tmpfs, as in production.
func benchStaging(b *testing.B) string {
	b.Helper()
	if fs, err := StatFS("/dev/shm"); err == nil && fs.Tmpfs {
		dir, err := os.MkdirTemp("/dev/shm", "shm-bench-")
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { os.RemoveAll(dir) })
		return dir
	}
	return b.TempDir()
}

// BenchmarkWatcherRenameToReport is the watcher's whole job per dump: the hook renames
// <rid>.safetensors.partial to its final name, fsnotify reports the Create, the name is
// parsed and the dump handed on. ns/op is per dump, with the consumer always ready.
func BenchmarkWatcherRenameToReport(b *testing.B) {
	dir := benchStaging(b)
	w, err := NewWatcher(dir, quietLog())
	if err != nil {
		b.Fatal(err)
	}
	defer w.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out := make(chan Dump, 64)
	go w.Run(ctx, out)

	b.StopTimer()
	names := make([]string, b.N)
	for i := range names {
		names[i] = filepath.Join(dir, RID{Sample: i, Attempt: 1}.FileName())
		if err := os.WriteFile(names[i]+PartialSuffix, nil, 0o644); err != nil {
			b.Fatal(err)
		}
	}
	b.StartTimer()
	start := time.Now()
	go func() {
		for _, n := range names {
			if err := os.Rename(n+PartialSuffix, n); err != nil {
				b.Error(err)
				return
			}
		}
	}()
	seen := make(map[int]bool, b.N)
	timeout := time.After(time.Minute)
	for len(seen) < b.N {
		select {
		case d := <-out:
			seen[d.RID.Sample] = true
		case <-timeout:
			b.Fatalf("reported %d of %d dumps", len(seen), b.N)
		}
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "dumps/s")
}

// BenchmarkScan lists a staging dir holding n dumps and as many partials: the watcher's
// start (leftover adoption) and its rescan after an event-queue overflow.
func BenchmarkScan(b *testing.B) {
	for _, n := range []int{32, 1000} {
		b.Run(fmt.Sprintf("dumps=%d", n), func(b *testing.B) {
			dir := benchStaging(b)
			for i := range n {
				name := filepath.Join(dir, RID{Sample: i, Attempt: 1}.FileName())
				os.WriteFile(name, nil, 0o644)
				os.WriteFile(filepath.Join(dir, RID{Sample: n + i, Attempt: 1}.FileName()+PartialSuffix), nil, 0o644)
			}
			w, err := NewWatcher(dir, quietLog())
			if err != nil {
				b.Fatal(err)
			}
			defer w.Close()
			for b.Loop() {
				dumps, err := w.Scan()
				if err != nil || len(dumps) != n {
					b.Fatalf("Scan = %d dumps, %v", len(dumps), err)
				}
			}
		})
	}
}

// BenchmarkMeasure is the staging-usage read that admission does on every tick (250 ms)
// with a full window of 32 dumps in the dir.
func BenchmarkMeasure(b *testing.B) {
	dir := benchStaging(b)
	for i := range 32 {
		os.WriteFile(filepath.Join(dir, RID{Sample: i, Attempt: 1}.FileName()), make([]byte, 4096), 0o644)
	}
	for b.Loop() {
		if _, err := Measure(dir); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkParseDumpName(b *testing.B) {
	name := RID{Sample: 18421, Attempt: 2}.FileName()
	for b.Loop() {
		if _, ok := ParseDumpName(name); !ok {
			b.Fatal(name)
		}
	}
}
