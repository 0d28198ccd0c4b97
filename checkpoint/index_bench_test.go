package checkpoint

import (
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Benchmarks of the index commit path. Each reports samples/s as well as ns/op, and the
// commit path is measured at the concurrency the run uses: run.movers (default 4)
// goroutines calling CommitDone, and one coordinator calling BeginAttempts.

func benchIndex(b *testing.B, total int) *Index {
	b.Helper()
	ix, err := Open(filepath.Join(b.TempDir(), "index.db"), OpenOptions{Timeout: 5 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = ix.Close() })
	if err := ix.Init(Meta{DatasetFingerprint: "bench", DatasetPath: "bench.jsonl", Total: total}); err != nil {
		b.Fatal(err)
	}
	return ix
}

func benchRecord(s int) Record {
	return Record{Sample: s, State: StateDone, Attempt: 1, RID: fmt.Sprintf("s%09d-a1", s), Bytes: 262144, CRC32C: uint32(s), Tokens: 32, Updated: time.Now()}
}

// BenchmarkCommitDoneMovers commits from exactly as many goroutines as the run has
// movers. With few callers, a batch delay is paid by every sample: this is the number
// that bounds small-dump throughput (figure 2 of docs/performance.md).
func BenchmarkCommitDoneMovers(b *testing.B) {
	for _, movers := range []int{1, 4, 16} {
		b.Run(fmt.Sprintf("movers=%d", movers), func(b *testing.B) {
			ix := benchIndex(b, 1<<30)
			var next atomic.Int64
			var wg sync.WaitGroup
			b.ResetTimer()
			start := time.Now()
			per := b.N / movers
			for w := range movers {
				n := per
				if w == 0 {
					n += b.N % movers
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range n {
						if err := ix.CommitDone(benchRecord(int(next.Add(1)))); err != nil {
							b.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "samples/s")
		})
	}
}

// BenchmarkBeginAttempts is the coordinator's durable attempt record before each send.
// batch=1 is what admit does when one slot of the window frees at a time.
func BenchmarkBeginAttempts(b *testing.B) {
	for _, batch := range []int{1, 32} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
			ix := benchIndex(b, 1<<30)
			s := 0
			samples := make([]int, batch)
			start := time.Now()
			for b.Loop() {
				for i := range samples {
					samples[i] = s
					s++
				}
				if _, err := ix.BeginAttempts(samples); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(s)/time.Since(start).Seconds(), "samples/s")
		})
	}
}

// BenchmarkCountersAt1M is what `extract status` reads from a stopped job's index.
func BenchmarkCountersAt1M(b *testing.B) {
	const n = 1_000_000
	ix := benchIndex(b, n)
	fillDone(b, ix, n)
	b.ResetTimer()
	for b.Loop() {
		if _, err := ix.Counters(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkOpenReadOnlyAt1M opens a million-record index read-only and reads its
// counters and metadata: the whole index part of `extract status` without a live run.
func BenchmarkOpenReadOnlyAt1M(b *testing.B) {
	const n = 1_000_000
	ix := benchIndex(b, n)
	fillDone(b, ix, n)
	path := ix.Path()
	if err := ix.Close(); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for b.Loop() {
		r, err := Open(path, OpenOptions{ReadOnly: true, Timeout: time.Second})
		if err != nil {
			b.Fatal(err)
		}
		if _, _, err := r.Meta(); err != nil {
			b.Fatal(err)
		}
		if _, err := r.Counters(); err != nil {
			b.Fatal(err)
		}
		if err := r.Close(); err != nil {
			b.Fatal(err)
		}
	}
}

// fillDone marks samples 0..n-1 done through the public path, in transactions of ten
// thousand records, so the counters are right.
func fillDone(b *testing.B, ix *Index, n int) {
	b.Helper()
	const chunk = 10_000
	for lo := 0; lo < n; lo += chunk {
		rs := make([]Record, 0, chunk)
		for s := lo; s < min(lo+chunk, n); s++ {
			rs = append(rs, benchRecord(s))
		}
		if err := ix.commitDoneMany(rs); err != nil {
			b.Fatal(err)
		}
	}
}
