package checkpoint

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/extract-dev/extract/internal/safetensors"
	"golang.org/x/sys/unix"
)

// Benchmarks of the mover as the run uses it: dumps on a tmpfs (/dev/shm when it is
// one), outputs on the output disk. The output dir is EXTRACT_BENCH_OUT when set, else
// the test temp dir: if that is a tmpfs, fsync costs nothing and the figures flatter the
// mover. scripts/bench.sh measures the same paths against cp + sync on real disks.

func benchStagingDir(b *testing.B) string {
	b.Helper()
	var st unix.Statfs_t
	if unix.Statfs("/dev/shm", &st) == nil && st.Type == unix.TMPFS_MAGIC {
		dir, err := os.MkdirTemp("/dev/shm", "mover-bench-")
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { os.RemoveAll(dir) })
		return dir
	}
	return b.TempDir()
}

func benchOutputDir(b *testing.B) string {
	b.Helper()
	base := os.Getenv("EXTRACT_BENCH_OUT")
	if base == "" {
		return b.TempDir()
	}
	dir, err := os.MkdirTemp(base, "mover-bench-")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

func benchIDs(sample, T int) []int64 {
	ids := make([]int64, T)
	for i := range ids {
		ids[i] = int64(sample*7919+i*31)%150000 + 3
	}
	return ids
}

// benchDump writes a protocol v1 dump of T tokens × H for sample, as the hook does.
func benchDump(b *testing.B, dir string, sample, T, H int) string {
	b.Helper()
	rid := fmt.Sprintf("s%09d-a1", sample)
	hdr, _, err := safetensors.EncodeHeader([]safetensors.Spec{
		{Name: "aux_hidden_state", DType: safetensors.BF16, Shape: []int64{int64(T), int64(3 * H)}},
		{Name: "hidden_state", DType: safetensors.BF16, Shape: []int64{int64(T), int64(H)}},
		{Name: "input_ids", DType: safetensors.I64, Shape: []int64{int64(T)}},
	}, map[string]string{"rid": rid, "protocol": "1", "layers": "2,30,58", "model": "bench", "hook_version": "bench"})
	if err != nil {
		b.Fatal(err)
	}
	path := filepath.Join(dir, rid+".safetensors")
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	w := bufio.NewWriterSize(f, 1<<20)
	w.Write(hdr)
	row := make([]byte, 2*H)
	for i := range row {
		row[i] = byte(i*131 + sample)
	}
	for range 4 * T {
		w.Write(row)
	}
	for _, id := range benchIDs(sample, T) {
		binary.Write(w, binary.LittleEndian, id)
	}
	if err := w.Flush(); err != nil {
		b.Fatal(err)
	}
	if err := f.Close(); err != nil {
		b.Fatal(err)
	}
	return path
}

func benchExpect(sample, T, H int) Expect {
	return Expect{Sample: sample, RID: fmt.Sprintf("s%09d-a1", sample), InputIDs: benchIDs(sample, T), DatasetFingerprint: "bench", HiddenSize: H,
		Layers: "2,30,58", Model: "bench", ConfigFingerprint: "bench"}
}

// BenchmarkMoveFromStaging moves one dump per op, overwriting the same output: validate,
// stream with crc32c, fsync, rename, fsync dir. MB/s is dump bytes per second.
func BenchmarkMoveFromStaging(b *testing.B) {
	for _, c := range []struct {
		name string
		T, H int
	}{
		{"256KiB", 32, 1024},
		{"4MiB", 512, 1024},
		{"256MiB", 8192, 4096},
	} {
		b.Run(c.name, func(b *testing.B) {
			path := benchDump(b, benchStagingDir(b), 1, c.T, c.H)
			st, err := os.Stat(path)
			if err != nil {
				b.Fatal(err)
			}
			m := &Mover{OutputDir: benchOutputDir(b)}
			want := benchExpect(1, c.T, c.H)
			b.SetBytes(st.Size())
			for b.Loop() {
				if _, err := m.moveFile(context.Background(), path, want); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkCheckDump is the validation alone (header, shapes, metadata, input_ids
// against the dataset) of a dump of the real model's width, 2,048 tokens.
func BenchmarkCheckDump(b *testing.B) {
	const T, H = 2048, 7168
	path := benchDump(b, benchStagingDir(b), 3, T, H)
	want := benchExpect(3, T, H)
	buf := make([]byte, 1<<20)
	for b.Loop() {
		f, err := os.Open(path)
		if err != nil {
			b.Fatal(err)
		}
		st, _ := f.Stat()
		if _, err := checkDump(context.Background(), f, path, st.Size(), want, buf); err != nil {
			b.Fatal(err)
		}
		f.Close()
	}
}

// BenchmarkSmallDumpFullPath is figure 2 of docs/performance.md: 256 KiB dumps through
// the whole per-sample path of a run, with run.movers (4) goroutines: Move, then
// CommitDone, then the staging file removed. samples/s is the figure (target ≥ 500/s).
func BenchmarkSmallDumpFullPath(b *testing.B) {
	const T, H, movers = 32, 1024, 4
	stage := benchStagingDir(b)
	b.StopTimer()
	paths := make([]string, b.N)
	for i := range paths {
		paths[i] = benchDump(b, stage, i, T, H)
	}
	ix := benchIndex(b, b.N)
	m := &Mover{OutputDir: benchOutputDir(b)}
	next := make(chan int)
	var wg sync.WaitGroup
	b.StartTimer()
	start := time.Now()
	for range movers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for s := range next {
				moved, err := m.moveFile(context.Background(), paths[s], benchExpect(s, T, H))
				if err == nil {
					err = ix.CommitDone(Record{Sample: s, State: StateDone, Attempt: 1, RID: fmt.Sprintf("s%09d-a1", s),
						Bytes: moved.Bytes, CRC32C: moved.CRC32C, Tokens: moved.Tokens})
				}
				if err == nil {
					err = os.Remove(paths[s])
				}
				if err != nil {
					b.Error(err)
				}
			}
		}()
	}
	for s := range b.N {
		next <- s
	}
	close(next)
	wg.Wait()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "samples/s")
}

// BenchmarkMoveFormats is BenchmarkMoveFromStaging's 256 MiB dump in every output
// format: the torch zip adds a CRC-32 per record beside the crc32c (gzip a first pass
// and deflate), and must keep the mover's ratio to cp + sync (scripts/bench.sh -format).
func BenchmarkMoveFormats(b *testing.B) {
	const T, H = 8192, 4096
	for _, l := range []Layout{{}, {Format: FormatSpecForge}, {Format: FormatModelOpt}, {Format: FormatSpecForge, Gzip: true}} {
		b.Run(l.Name(), func(b *testing.B) {
			path := benchDump(b, benchStagingDir(b), 1, T, H)
			st, err := os.Stat(path)
			if err != nil {
				b.Fatal(err)
			}
			l.Dir = benchOutputDir(b)
			m := &Mover{Layout: l}
			want := benchExpect(1, T, H)
			b.SetBytes(st.Size())
			for b.Loop() {
				if _, err := m.moveFile(context.Background(), path, want); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
