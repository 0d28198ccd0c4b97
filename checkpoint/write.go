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
	"syscall"

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
	T, H        int64
	ids         segment
	idVals      []int64  // non-nil: input_ids written from these (checked equal to the source's)
	mask        *segment // nil: the values in maskVals (nil there: all ones)
	maskVals    []int64
	hidden, aux segment
	readErr     func(off int64, err error) error // says whose read failed (a dump's: DumpError)
	md          map[string]string                // extract's metadata, crc32c filled in by the writer
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
	p, size, sum, err := createSample(ctx, l, final, s, buf)
	if err != nil {
		return 0, 0, err
	}
	if err := p.commit(); err != nil {
		return 0, 0, err
	}
	return size, sum, nil
}

// pendingFile is an output written under its temp name and not yet durable.
type pendingFile struct {
	f          *os.File
	tmp, final string
}

// createSample writes s into a temp file beside final, without fsync: commit makes it
// durable, abort takes it away. The copy is CPU and memory bound and the fsync is not,
// so a caller may run few copies and many commits at once (the orchestrator's movers).
func createSample(ctx context.Context, l Layout, final string, s *sample, buf []byte) (p *pendingFile, size int64, sum uint32, err error) {
	tmp := tempPath(final)
	if err := atomicfile.MkdirAll(filepath.Dir(final), 0o755); err != nil {
		return nil, 0, 0, blockedOr(filepath.Dir(final), err)
	}
	f, err := outputDisk.create(tmp)
	if err != nil {
		return nil, 0, 0, blockedOr(tmp, fmt.Errorf("create %s: %w", tmp, err))
	}
	p = &pendingFile{f: f, tmp: tmp, final: final}
	out := newWriteback(f)
	switch {
	case l.format() == FormatSafetensors:
		size, sum, err = writeSafetensors(ctx, out, s, buf)
	case l.Gzip:
		size, sum, err = writeTorchGzip(ctx, l, out, s, buf)
	default:
		size, sum, err = writeTorch(ctx, l, out, s, buf)
	}
	if err != nil {
		p.abort()
		if _, bad := errors.AsType[*DumpError](err); bad {
			return nil, 0, 0, err
		}
		return nil, 0, 0, fmt.Errorf("write %s: %w", tmp, err)
	}
	return p, size, sum, nil
}

// commit fsyncs the file, renames it to its final name and fsyncs the directory. A
// failure before the rename removes the temp file.
func (p *pendingFile) commit() error {
	if err := outputDisk.sync(p.f); err != nil {
		p.abort()
		return fmt.Errorf("fsync %s: %w", p.tmp, err)
	}
	if err := p.f.Close(); err != nil {
		_ = os.Remove(p.tmp)
		return fmt.Errorf("close %s: %w", p.tmp, err)
	}
	if err := outputDisk.rename(p.tmp, p.final); err != nil {
		_ = os.Remove(p.tmp)
		return blockedOr(p.final, fmt.Errorf("rename %s: %w", p.tmp, err))
	}
	// The file under its final name is complete either way; without a durable directory
	// entry the caller must not commit, and its retry overwrites the file.
	if err := outputDisk.syncDir(filepath.Dir(p.final)); err != nil {
		return fmt.Errorf("make %s durable: %w", p.final, err)
	}
	return nil
}

// BlockedError means something the mover may not replace is in the way of an output:
// a directory (or an immutable file) at its final or temp name, or a file where its
// rows_ directory belongs. A retry meets the same thing, so it is that sample's
// failure, not the disk's: the operator removes what is there and resumes.
type BlockedError struct {
	Path string
	Err  error
}

func (e *BlockedError) Error() string {
	return fmt.Sprintf("output path %s is blocked by something extract may not replace (%v): remove it, then `extract run --resume`", e.Path, e.Err)
}

func (e *BlockedError) Unwrap() error { return e.Err }

// blockedOr is err as a BlockedError when it says that path holds the wrong kind of
// thing or one that cannot be replaced: EISDIR, ENOTEMPTY and EEXIST (a directory),
// ENOTDIR (a file where a directory belongs), EPERM (an immutable file). Anything else
// (a full disk, an I/O error) is the disk's and stays as it is.
func blockedOr(path string, err error) error {
	for _, e := range []error{syscall.EISDIR, syscall.ENOTEMPTY, syscall.EEXIST, syscall.ENOTDIR, syscall.EPERM} {
		if errors.Is(err, e) {
			return &BlockedError{Path: path, Err: err}
		}
	}
	return err
}

// abort closes and removes the temp file.
func (p *pendingFile) abort() {
	_ = p.f.Close()
	_ = os.Remove(p.tmp)
}

func writeSafetensors(ctx context.Context, f *writeback, s *sample, buf []byte) (int64, uint32, error) {
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
	sum, n, err := streamTensors(ctx, s, func(int, int64) (io.Writer, error) { return f, nil }, buf, false)
	if err != nil {
		return 0, 0, err
	}
	if _, err := f.WriteAt([]byte(fmt.Sprintf("%08x", sum)), int64(crcAt)); err != nil {
		return 0, 0, fmt.Errorf("patch crc32c: %w", err)
	}
	return int64(len(hdr)) + n, sum, nil
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
func writeTorch(ctx context.Context, l Layout, f *writeback, s *sample, buf []byte) (int64, uint32, error) {
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
	sum, _, err := streamTensors(ctx, s, func(i int, n int64) (io.Writer, error) {
		var want *uint32
		if crcs != nil {
			want = &crcs[i]
		}
		return z.Create(zipPrefix+"data/"+strconv.Itoa(i), n, want)
	}, buf, true)
	if err != nil {
		return 0, err
	}
	md := map[string]string{}
	for k, v := range s.md {
		md[k] = v
	}
	md["crc32c"] = fmt.Sprintf("%08x", sum)
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
	return sum, z.Close()
}

// writeTorchGzip writes a torch zip inside gzip, as SpecForge's compress option does.
// gzip cannot be patched afterwards, so a first pass over the source computes every
// record's CRC-32 and the crc32c; the metadata goes into the gzip header too, so that
// verify reads it without decompressing the file.
func writeTorchGzip(ctx context.Context, l Layout, f *writeback, s *sample, buf []byte) (int64, uint32, error) {
	var crcs [4]uint32
	all, _, err := streamTensors(ctx, s, func(i int, _ int64) (io.Writer, error) {
		return crcOnly{&crcs[i]}, nil
	}, buf, true)
	if err != nil {
		return 0, 0, err
	}
	md := map[string]string{}
	for k, v := range s.md {
		md[k] = v
	}
	md["crc32c"] = fmt.Sprintf("%08x", all)
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
	if errors.Is(err, torchzip.ErrCRCMismatch) {
		return 0, 0, s.readErr(0, fmt.Errorf("source changed between passes: %w", err)) // the dump's fault
	}
	if err != nil {
		return 0, 0, err
	}
	if sum != all {
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

// crcOnly keeps the CRC-32 (IEEE) the reader computed for one record and writes nothing.
type crcOnly struct{ sum *uint32 }

func (c crcOnly) Write(p []byte) (int, error) {
	*c.sum = crc32.Update(*c.sum, crc32.IEEETable, p)
	return len(p), nil
}

func (c crcOnly) WriteSummed(p []byte, sum uint32) (int, error) {
	*c.sum = sum
	return len(p), nil
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}
