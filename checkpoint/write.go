package checkpoint

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"strconv"

	"github.com/extract-dev/extract/internal/atomicfile"
	"github.com/extract-dev/extract/internal/safetensors"
	"github.com/extract-dev/extract/internal/torchzip"
)

// segment is n bytes of a source file at off: one tensor's data.
type segment struct {
	r      io.ReaderAt
	off, n int64
}

// sample is what every format's writer streams from: the four tensors of one sample,
// T tokens of width H, read in chunks so that memory does not grow with T.
type sample struct {
	T, H           int64
	ids            segment
	mask           *segment // nil: the values in maskVals (nil there: all ones)
	maskVals       []int64
	hidden, aux    segment
	readErr        func(off int64, err error) error // says whose read failed (a dump's: DumpError)
	md             map[string]string                // extract's metadata, crc32c filled in by the writer
	zipCRCs        [4]uint32                        // filled by prepass, for gzip
	crc32cPrepared uint32
}

// extractRecord is the record torch ignores that carries extract's metadata in a torch zip.
const extractRecord = "extract.json"

// gzipExtraID tags extract's metadata in a .ckpt.gz's gzip header (RFC 1952 FEXTRA
// subfield): readable without decompressing the file.
var gzipExtraID = [2]byte{'E', 'X'}

// writeSample writes s to final under layout l: through a temp file, fsynced, renamed,
// directory fsynced. It returns the file's size and the crc32c of its tensor bytes in
// canonical order (input_ids, loss_mask, hidden, aux: the same in every format).
func writeSample(ctx context.Context, l Layout, final string, s *sample, buf []byte) (size int64, sum uint32, err error) {
	tmp := tempPath(final)
	if err := atomicfile.MkdirAll(filepath.Dir(final), 0o755); err != nil {
		return 0, 0, err
	}
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return 0, 0, fmt.Errorf("create %s: %w", tmp, err)
	}
	renamed := false
	defer func() {
		if !renamed {
			_ = f.Close()
			_ = os.Remove(tmp)
		}
	}()
	switch {
	case l.format() == FormatSafetensors:
		size, sum, err = writeSafetensors(ctx, f, s, buf)
	case l.Gzip:
		size, sum, err = writeTorchGzip(ctx, l, f, s, buf)
	default:
		size, sum, err = writeTorch(ctx, l, f, s, buf)
	}
	if err != nil {
		if _, bad := errors.AsType[*DumpError](err); bad {
			return 0, 0, err
		}
		return 0, 0, fmt.Errorf("write %s: %w", tmp, err)
	}
	if err := atomicfile.Sync(f); err != nil {
		return 0, 0, fmt.Errorf("fsync %s: %w", tmp, err)
	}
	if err := f.Close(); err != nil {
		return 0, 0, fmt.Errorf("close %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, final); err != nil {
		return 0, 0, fmt.Errorf("rename %s: %w", tmp, err)
	}
	renamed = true
	// The file under its final name is complete either way; without a durable directory
	// entry the caller must not commit, and its retry overwrites the file.
	if err := atomicfile.SyncDir(filepath.Dir(final)); err != nil {
		return 0, 0, err
	}
	return size, sum, nil
}

// streamTensors writes the four tensors in canonical order, each to the writer next
// gives for it (a zip record, or one writer for all).
func streamTensors(ctx context.Context, s *sample, next func(i int, n int64) (io.Writer, error), buf []byte) error {
	sizes := s.sizes()
	for i := range 4 {
		w, err := next(i, sizes[i])
		if err != nil {
			return err
		}
		switch {
		case i == 1 && s.mask == nil:
			err = writeLossMask(ctx, w, s.maskVals, s.T, buf)
		case i == 1:
			err = s.copy(ctx, w, *s.mask, buf)
		default:
			err = s.copy(ctx, w, [4]segment{s.ids, {}, s.hidden, s.aux}[i], buf)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func (s *sample) sizes() [4]int64 {
	return [4]int64{8 * s.T, 8 * s.T, 2 * s.T * s.H, 2 * s.T * 3 * s.H}
}

// copy copies a segment, checking ctx between chunks. A short read means the source
// changed under us: readErr says whose fault that is.
func (s *sample) copy(ctx context.Context, w io.Writer, seg segment, buf []byte) error {
	off, n := seg.off, seg.n
	for n > 0 {
		if err := ctx.Err(); err != nil {
			return err
		}
		chunk := buf[:min(n, int64(len(buf)))]
		if _, err := seg.r.ReadAt(chunk, off); err != nil {
			return s.readErr(off, err)
		}
		if _, err := w.Write(chunk); err != nil {
			return err
		}
		off += int64(len(chunk))
		n -= int64(len(chunk))
	}
	return nil
}

// crcWriter hashes what passes through into crc32c and counts it.
type crcWriter struct {
	w   io.Writer
	sum uint32
	n   int64
}

func (c *crcWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.sum = crc32.Update(c.sum, castagnoli, p[:n])
	c.n += int64(n)
	return n, err
}

func writeSafetensors(ctx context.Context, f *os.File, s *sample, buf []byte) (int64, uint32, error) {
	md := map[string]string{}
	for k, v := range s.md {
		md[k] = v
	}
	delete(md, "hidden_size") // the header shows it
	md["crc32c"] = crcPlaceholder
	hdr, _, err := safetensors.EncodeHeader([]safetensors.Spec{
		{Name: tensorInputIDs, DType: safetensors.I64, Shape: []int64{s.T}},
		{Name: tensorLossMask, DType: safetensors.I64, Shape: []int64{s.T}},
		{Name: tensorHidden, DType: safetensors.BF16, Shape: []int64{s.T, s.H}},
		{Name: tensorAux, DType: safetensors.BF16, Shape: []int64{s.T, 3 * s.H}},
	}, md)
	if err != nil {
		return 0, 0, fmt.Errorf("encode header: %w", err)
	}
	// JSON escapes quotes inside values, so this byte sequence can only be the key itself.
	crcAt := bytes.Index(hdr, []byte(`"crc32c":"`+crcPlaceholder+`"`)) + len(`"crc32c":"`)
	if _, err := f.Write(hdr); err != nil {
		return 0, 0, err
	}
	out := &crcWriter{w: f}
	if err := streamTensors(ctx, s, func(int, int64) (io.Writer, error) { return out, nil }, buf); err != nil {
		return 0, 0, err
	}
	if _, err := f.WriteAt([]byte(fmt.Sprintf("%08x", out.sum)), int64(crcAt)); err != nil {
		return 0, 0, fmt.Errorf("patch crc32c: %w", err)
	}
	return int64(len(hdr)) + out.n, out.sum, nil
}

// torchTensors is the dict a torch-format file holds: storages 0..3 in canonical order.
func torchTensors(l Layout, T, H int64) []torchzip.Tensor {
	names := l.tensorNames()
	hs, as := []int64{T, H}, []int64{T, 3 * H}
	hst, ast := []int64{H, 1}, []int64{3 * H, 1}
	if l.batchDim() {
		hs, as = []int64{1, T, H}, []int64{1, T, 3 * H}
		hst, ast = []int64{T * H, H, 1}, []int64{T * 3 * H, 3 * H, 1}
	}
	return []torchzip.Tensor{
		{Name: names[0], DType: torchzip.Int64, Key: "0", StorageNumel: T, Shape: []int64{T}, Stride: []int64{1}},
		{Name: names[1], DType: torchzip.Int64, Key: "1", StorageNumel: T, Shape: []int64{T}, Stride: []int64{1}},
		{Name: names[2], DType: torchzip.BFloat16, Key: "2", StorageNumel: T * H, Shape: hs, Stride: hst},
		{Name: names[3], DType: torchzip.BFloat16, Key: "3", StorageNumel: T * 3 * H, Shape: as, Stride: ast},
	}
}

const zipPrefix = "archive/" // what torch.save names the folder when it writes to a stream

// writeTorch streams a torch zip straight into f; each record's CRC-32 is patched into
// its local header once its data is through.
func writeTorch(ctx context.Context, l Layout, f *os.File, s *sample, buf []byte) (int64, uint32, error) {
	z := torchzip.NewWriter(f, f)
	sum, err := writeZip(ctx, l, z, s, buf, nil)
	if err != nil {
		return 0, 0, err
	}
	return z.Offset(), sum, nil
}

func writeZip(ctx context.Context, l Layout, z *torchzip.Writer, s *sample, buf []byte, crcs *[4]uint32) (uint32, error) {
	if err := z.WriteRecord(zipPrefix+"data.pkl", torchzip.EncodeDict(torchTensors(l, s.T, s.H))); err != nil {
		return 0, err
	}
	out := &crcWriter{}
	err := streamTensors(ctx, s, func(i int, n int64) (io.Writer, error) {
		var want *uint32
		if crcs != nil {
			want = &crcs[i]
		}
		r, err := z.Create(zipPrefix+"data/"+strconv.Itoa(i), n, want)
		out.w = r
		return out, err
	}, buf)
	if err != nil {
		return 0, err
	}
	md := map[string]string{}
	for k, v := range s.md {
		md[k] = v
	}
	md["crc32c"] = fmt.Sprintf("%08x", out.sum)
	js, err := json.Marshal(md)
	if err != nil {
		return 0, err
	}
	for _, r := range []struct{ name, data string }{
		{"version", "3\n"}, {"byteorder", "little"}, {extractRecord, string(js)},
	} {
		if err := z.WriteRecord(zipPrefix+r.name, []byte(r.data)); err != nil {
			return 0, err
		}
	}
	return out.sum, z.Close()
}

// writeTorchGzip writes a torch zip inside gzip, as SpecForge's compress option does.
// gzip cannot be patched afterwards, so a first pass over the source computes every
// record's CRC-32 and the crc32c; the metadata goes into the gzip header too, so that
// verify reads it without decompressing the file.
func writeTorchGzip(ctx context.Context, l Layout, f *os.File, s *sample, buf []byte) (int64, uint32, error) {
	var crcs [4]uint32
	all := &crcWriter{w: io.Discard}
	err := streamTensors(ctx, s, func(i int, _ int64) (io.Writer, error) {
		return io.MultiWriter(all, writerFunc(func(p []byte) (int, error) {
			crcs[i] = crc32.Update(crcs[i], crc32.IEEETable, p)
			return len(p), nil
		})), nil
	}, buf)
	if err != nil {
		return 0, 0, err
	}
	md := map[string]string{}
	for k, v := range s.md {
		md[k] = v
	}
	md["crc32c"] = fmt.Sprintf("%08x", all.sum)
	js, err := json.Marshal(md)
	if err != nil {
		return 0, 0, err
	}
	if len(js) > 65000 {
		return 0, 0, fmt.Errorf("metadata of %d bytes does not fit a gzip header", len(js))
	}
	extra := append(gzipExtraID[:], 0, 0)
	binary.LittleEndian.PutUint16(extra[2:], uint16(len(js)))
	extra = append(extra, js...)
	cw := &countWriter{w: f}
	bw := bufio.NewWriterSize(cw, 1<<20)
	gz, err := gzip.NewWriterLevel(bw, gzip.BestSpeed)
	if err != nil {
		return 0, 0, err
	}
	gz.Header.Extra = extra
	sum, err := writeZip(ctx, l, torchzip.NewWriter(gz, nil), s, buf, &crcs)
	if err != nil {
		return 0, 0, err
	}
	if sum != all.sum {
		return 0, 0, s.readErr(0, errors.New("source changed between passes"))
	}
	if err := gz.Close(); err != nil {
		return 0, 0, err
	}
	if err := bw.Flush(); err != nil {
		return 0, 0, err
	}
	return cw.n, sum, nil
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}
