package checkpoint

import (
	"bytes"
	"context"
	"errors"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"sync/atomic"
	"testing"
	"time"
)

// countingReader serves n bytes of a pattern and counts the reads.
type countingReader struct {
	reads atomic.Int64
}

func (c *countingReader) ReadAt(p []byte, off int64) (int, error) {
	c.reads.Add(1)
	for i := range p {
		p[i] = byte((off + int64(i)) * 7)
	}
	return len(p), nil
}

func streamSample(r io.ReaderAt, T, H int64) *sample {
	return &sample{T: T, H: H,
		ids:    segment{r, 0, 8 * T},
		hidden: segment{r, 8 * T, 2 * T * H},
		aux:    segment{r, 8*T + 2*T*H, 6 * T * H},
		readErr: func(off int64, err error) error {
			return &DumpError{Path: "test", Reason: err.Error()}
		},
	}
}

func TestStreamWritesEveryTensorInOrderWithTheCRCOfWhatItWrote(t *testing.T) {
	r := &countingReader{}
	s := streamSample(r, 100, 64)
	var out bytes.Buffer
	var opened []int
	sum, n, err := streamTensors(context.Background(), s, func(i int, size int64) (io.Writer, error) {
		opened = append(opened, i)
		return &out, nil
	}, make([]byte, 256), false)
	if err != nil {
		t.Fatal(err)
	}
	sizes := s.sizes()
	want := sizes[0] + sizes[1] + sizes[2] + sizes[3]
	if n != want || int64(out.Len()) != want {
		t.Fatalf("wrote %d bytes (counted %d), want %d", out.Len(), n, want)
	}
	if got := crc32.Checksum(out.Bytes(), castagnoli); got != sum {
		t.Errorf("crc32c %08x, the bytes written hash to %08x", sum, got)
	}
	if len(opened) != 4 || opened[0] != 0 || opened[3] != 3 {
		t.Errorf("writers opened for tensors %v, want 0 1 2 3", opened)
	}
	// loss_mask is all ones: nothing of it is read from the source.
	mask := out.Bytes()[sizes[0] : sizes[0]+sizes[1]]
	for k := 0; k < len(mask); k += 8 {
		if mask[k] != 1 {
			t.Fatalf("loss_mask byte %d is %d, want 1", k, mask[k])
		}
	}
}

type failingWriter struct{ left int }

var errDiskFull = errors.New("disk full")

func (w *failingWriter) Write(p []byte) (int, error) {
	if w.left == 0 {
		return 0, errDiskFull
	}
	w.left--
	return len(p), nil
}

func TestStreamStopsReadingOnceAWriteFails(t *testing.T) {
	before := runtime.NumGoroutine()
	r := &countingReader{}
	s := streamSample(r, 1024, 1024) // 8 MiB of tensors: 2048 chunks of 4 KiB
	_, _, err := streamTensors(context.Background(), s, func(int, int64) (io.Writer, error) {
		return &failingWriter{left: 2}, nil
	}, make([]byte, 8<<10), false)
	if !errors.Is(err, errDiskFull) {
		t.Fatalf("err = %v, want the write's error", err)
	}
	// Two chunks written, the failing one, the two buffers read ahead, and one more
	// where the reader takes a free buffer before it sees the stop: a few of 2048.
	if reads := r.reads.Load(); reads > 6 {
		t.Errorf("%d chunks read after the write failed at the third: the reader went on", reads)
	}
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if g := runtime.NumGoroutine(); g > before {
		t.Errorf("%d goroutines after the stream returned, %d before: the reader leaked", g, before)
	}
}

func TestStreamReturnsTheReadErrorOfATruncatedSource(t *testing.T) {
	src := bytes.NewReader(make([]byte, 1000)) // shorter than the tensors say
	s := streamSample(src, 100, 64)
	_, _, err := streamTensors(context.Background(), s, func(int, int64) (io.Writer, error) {
		return io.Discard, nil
	}, make([]byte, 512), false)
	if _, ok := errors.AsType[*DumpError](err); !ok {
		t.Fatalf("err = %v, want a DumpError (the dump is short)", err)
	}
}

func TestStreamStopsReadingOnceARecordCannotBeOpened(t *testing.T) {
	r := &countingReader{}
	s := streamSample(r, 1024, 1024)
	errCreate := errors.New("create record 2: no space left on device")
	_, _, err := streamTensors(context.Background(), s, func(i int, _ int64) (io.Writer, error) {
		if i == 2 {
			return nil, errCreate
		}
		return io.Discard, nil
	}, make([]byte, 8<<10), false)
	if !errors.Is(err, errCreate) {
		t.Fatalf("err = %v, want the record's error", err)
	}
	// input_ids and loss_mask are 2 chunks each, then a few read ahead.
	if reads := r.reads.Load(); reads > 8 {
		t.Errorf("%d chunks read after the third record could not be opened: the reader went on", reads)
	}
}

// changingReader serves a pattern that differs on every pass over the source: a dump
// rewritten while the gzip writer reads it twice.
type changingReader struct{ pass atomic.Int64 }

func (c *changingReader) ReadAt(p []byte, off int64) (int, error) {
	if off == 0 {
		c.pass.Add(1)
	}
	for i := range p {
		p[i] = byte(off+int64(i)) + byte(c.pass.Load())
	}
	return len(p), nil
}

func TestADumpThatChangesBetweenTheGzipPassesIsTheDumpsFault(t *testing.T) {
	s := streamSample(&changingReader{}, 64, 32)
	s.md = map[string]string{"sample": "0"}
	f, err := os.Create(filepath.Join(t.TempDir(), "out.ckpt.gz"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	_, _, err = writeTorchGzip(context.Background(), Layout{Format: FormatSpecForge, Gzip: true}, newWriteback(f), s, make([]byte, 1024))
	if _, ok := errors.AsType[*DumpError](err); !ok {
		t.Fatalf("err = %v, want a DumpError: a store failure would retry the same dump forever", err)
	}
}
