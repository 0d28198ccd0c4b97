package dataset

import (
	"bufio"
	"context"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

// benchDataset writes n samples of input_ids with lo..hi tokens each and returns its path.
func benchDataset(b *testing.B, n, lo, hi int) string {
	b.Helper()
	path := filepath.Join(b.TempDir(), "dataset.jsonl")
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	w := bufio.NewWriterSize(f, 1<<20)
	r := rand.New(rand.NewPCG(1, 2))
	var line []byte
	for range n {
		t := lo + r.IntN(hi-lo+1)
		line = append(line[:0], `{"input_ids":[`...)
		for p := range t {
			if p > 0 {
				line = append(line, ',')
			}
			line = strconv.AppendInt(line, int64(r.IntN(150000)+3), 10)
		}
		line = append(line, "]}\n"...)
		w.Write(line)
	}
	if err := w.Flush(); err != nil {
		b.Fatal(err)
	}
	if err := f.Close(); err != nil {
		b.Fatal(err)
	}
	return path
}

// BenchmarkOpenDataset is the dataset check every run does before anything else: on
// --resume it is most of the time to the first request (figure 4 of docs/performance.md).
// "real-length" has the real job's mean of ~2,150 tokens per sample; "short" has the
// many short samples of a million-sample dataset.
func BenchmarkOpenDataset(b *testing.B) {
	for _, c := range []struct {
		name      string
		n, lo, hi int
	}{
		{"real-length-4k", 4000, 200, 4100},
		{"short-100k", 100_000, 32, 32},
	} {
		b.Run(c.name, func(b *testing.B) {
			path := benchDataset(b, c.n, c.lo, c.hi)
			st, err := os.Stat(path)
			if err != nil {
				b.Fatal(err)
			}
			b.SetBytes(st.Size())
			for b.Loop() {
				d, err := Open(path)
				if err != nil {
					b.Fatal(err)
				}
				if d.Len() != c.n {
					b.Fatalf("%d samples, want %d", d.Len(), c.n)
				}
				d.Close()
			}
		})
	}
}

// BenchmarkOpenDatasetCached is the same check on a resume that finds the line-index
// cache of an earlier start: a stat, a read of the cache and its crc32c, no dataset read.
// The bytes/s are the dataset's, for comparison with BenchmarkOpenDataset.
func BenchmarkOpenDatasetCached(b *testing.B) {
	old := racyMargin
	racyMargin = 0 // the dataset was just written; no edit races these reads
	defer func() { racyMargin = old }()
	for _, c := range []struct {
		name      string
		n, lo, hi int
	}{
		{"real-length-4k", 4000, 200, 4100},
		{"short-100k", 100_000, 32, 32},
		{"short-1M", 1_000_000, 32, 32},
	} {
		b.Run(c.name, func(b *testing.B) {
			path := benchDataset(b, c.n, c.lo, c.hi)
			state := b.TempDir()
			st, err := os.Stat(path)
			if err != nil {
				b.Fatal(err)
			}
			b.SetBytes(st.Size())
			d, err := OpenCached(context.Background(), datasetConfig(path, state))
			if err != nil {
				b.Fatal(err)
			}
			d.Close()
			for b.Loop() {
				d, err := OpenCached(context.Background(), datasetConfig(path, state))
				if err != nil {
					b.Fatal(err)
				}
				if !d.cached || d.Len() != c.n {
					b.Fatalf("cached %v, %d samples, want the cache's %d", d.cached, d.Len(), c.n)
				}
				d.Close()
			}
		})
	}
}

// BenchmarkDatasetSample is the re-read and decode of one sample before its request.
func BenchmarkDatasetSample(b *testing.B) {
	d, err := Open(benchDataset(b, 64, 2000, 2300))
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close()
	i := 0
	for b.Loop() {
		if _, err := d.Sample(i % d.Len()); err != nil {
			b.Fatal(err)
		}
		i++
	}
}
