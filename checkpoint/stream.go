package checkpoint

import (
	"context"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"io"
)

// streamTensors writes the four tensors of s in canonical order, each to the writer next
// gives for it (a zip record, or one writer for all), and returns the crc32c of all their
// bytes and their count. With ieee set the reader also keeps each tensor's CRC-32
// (IEEE), for zip records, and hands it to writers that take it (WriteSummed).
//
// The bytes go through the two halves of buf: one goroutine reads (and hashes) the next
// chunk while the caller writes the last, so that one move is not one core doing a read,
// a crc32c and a write in turn (docs/performance.md, figure 1 on a tmpfs). The hash is of
// the chunk as it sits in our buffer, which is exactly what is written: a dump that
// changes under the read cannot make the sum describe other bytes than the file's.
func streamTensors(ctx context.Context, s *sample, next func(i int, n int64) (io.Writer, error), buf []byte, ieee bool) (uint32, int64, error) {
	half := max(len(buf)/2/8*8, 8)
	if len(buf) < 2*half {
		buf = make([]byte, 2*half)
	}
	free := make(chan []byte, 2)
	free <- buf[:half:half]
	free <- buf[half : 2*half : 2*half]
	full := make(chan chunk, 2)
	quit := make(chan struct{})
	var sum uint32
	var readErr error
	go func() {
		defer close(full)
		sum, readErr = s.produce(ctx, free, full, quit, ieee)
	}()

	sizes := s.sizes()
	var n int64
	var w io.Writer
	var summed summedWriter
	var writeErr error
	stopped := false
	cur := -1
	for c := range full {
		if writeErr == nil && c.tensor != cur {
			cur = c.tensor
			w, writeErr = next(cur, sizes[cur])
			summed, _ = w.(summedWriter)
			if !ieee {
				summed = nil
			}
		}
		if writeErr == nil && len(c.b) > 0 {
			var k int
			if summed != nil {
				k, writeErr = summed.WriteSummed(c.b, c.ieee)
			} else {
				k, writeErr = w.Write(c.b)
			}
			n += int64(k)
		}
		if writeErr != nil && !stopped {
			close(quit) // the reader stops at its next chunk
			stopped = true
		}
		free <- c.b[:cap(c.b)] // never blocks: only two buffers exist
	}
	switch {
	case writeErr != nil:
		return 0, 0, writeErr
	case readErr != nil:
		return 0, 0, readErr
	}
	return sum, n, nil
}

// chunk is bytes of one tensor on their way from the reader to the writer.
type chunk struct {
	tensor int
	b      []byte
	ieee   uint32 // the tensor's CRC-32 (IEEE) through b, when asked for
}

// summedWriter takes data with its running CRC-32 computed by the reader
// (torchzip.Record): the writer goroutine then only writes.
type summedWriter interface {
	WriteSummed(p []byte, sum uint32) (int, error)
}

// errStopped ends the reader when the writer has failed; the writer's error is the one
// returned.
var errStopped = errors.New("stream stopped")

// produce fills the free buffers with the tensors' bytes in order and hashes them. Each
// tensor yields at least one chunk, so that the writer opens every record.
func (s *sample) produce(ctx context.Context, free <-chan []byte, full chan<- chunk, quit <-chan struct{}, ieee bool) (uint32, error) {
	var sum uint32
	for i, size := range s.sizes() {
		var tensorSum uint32
		for off, first := int64(0), true; first || off < size; first = false {
			if err := ctx.Err(); err != nil {
				return 0, err
			}
			var b []byte
			select {
			case b = <-free:
			case <-quit:
				return 0, errStopped
			}
			b = b[:min(size-off, int64(len(b)))]
			if err := s.fill(i, off, b); err != nil {
				return 0, err
			}
			sum = crc32.Update(sum, castagnoli, b)
			if ieee {
				tensorSum = crc32.Update(tensorSum, crc32.IEEETable, b)
			}
			select {
			case full <- chunk{tensor: i, b: b, ieee: tensorSum}:
			case <-quit:
				return 0, errStopped
			}
			off += int64(len(b))
		}
	}
	return sum, nil
}

// fill puts tensor i's bytes from offset off (a multiple of 8 for the int64 tensors)
// into b. Values the caller knows (the dataset's input_ids and loss_mask) are written
// from memory; the rest is read from the source.
func (s *sample) fill(i int, off int64, b []byte) error {
	switch {
	case len(b) == 0:
		return nil
	case i == 0 && s.idVals != nil:
		putInt64s(b, s.idVals[off/8:])
		return nil
	case i == 1 && s.mask == nil && s.maskVals == nil:
		putInt64s(b, nil)
		return nil
	case i == 1 && s.mask == nil:
		putInt64s(b, s.maskVals[off/8:])
		return nil
	}
	seg := [4]segment{s.ids, {}, s.hidden, s.aux}[i]
	if i == 1 {
		seg = *s.mask
	}
	if _, err := seg.r.ReadAt(b, seg.off+off); err != nil {
		return s.readErr(seg.off+off, err)
	}
	return nil
}

// putInt64s writes len(b)/8 values from vals as little-endian int64; nil vals are all
// ones (the loss mask of a dataset line without one).
func putInt64s(b []byte, vals []int64) {
	for k := range len(b) / 8 {
		v := int64(1)
		if vals != nil {
			v = vals[k]
		}
		binary.LittleEndian.PutUint64(b[k*8:], uint64(v))
	}
}

func (s *sample) sizes() [4]int64 {
	return [4]int64{8 * s.T, 8 * s.T, 2 * s.T * s.H, 2 * s.T * 3 * s.H}
}
