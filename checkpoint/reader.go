package checkpoint

import (
	"bufio"
	"compress/gzip"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/extract-dev/extract/internal/safetensors"
	"github.com/extract-dev/extract/internal/torchzip"
)

// fileTensor is one of a sample file's four tensors, by canonical role.
type fileTensor struct {
	name  string // the key in the file
	dtype safetensors.DType
	// shape is as stored; rows and width are it without a leading batch dim of 1.
	shape       []int64
	rows, width int64
	off, n      int64 // the bytes in the file; unknown (−1) inside gzip
	// zipCRC is the CRC-32 the zip directory records for the tensor's storage, when
	// the tensor is that whole record (hasZipCRC).
	zipCRC    uint32
	hasZipCRC bool
}

// sampleFile is an opened sample file of any format: safetensors, a torch zip (.ckpt,
// .pt) or a torch zip in gzip (.ckpt.gz), extract's own or another tool's.
type sampleFile struct {
	path string
	f    *os.File
	size int64
	gz   bool
	// md is extract's metadata; nil for a file another tool wrote.
	md map[string]string
	// t holds input_ids, loss_mask, hidden, aux; for gzip it is known only after walk.
	t [4]fileTensor
	// hasMask is false for a file without loss_mask (Model-Optimizer's older dumps).
	hasMask bool
	// keys maps a torch zip's storage keys to the roles of the tensors on them.
	keys map[string]int
	// inexact says why the file cannot be placed as is even in its own format (a
	// tensor or record beyond the four, a view of a larger storage); "" when it can.
	inexact string
}

// roles maps every key name a trainer's format uses to its canonical role.
var roles = map[string]int{
	tensorInputIDs: 0, tensorLossMask: 1,
	tensorHidden: 2, "hidden_states": 2,
	tensorAux: 3, "aux_hidden_states": 3,
}

// openSample opens path and reads its header (and for a torch zip its pickle), checking
// the four tensors' shapes and dtypes agree with each other. The caller closes it.
func openSample(path string) (*sampleFile, error) { return openSampleAs(path, path) }

// openSampleAs is openSample of a file whose format the name as says (a temp file's own
// name does not).
func openSampleAs(path, as string) (*sampleFile, error) {
	f, size, err := openRegular(path)
	if err != nil {
		return nil, err
	}
	s := &sampleFile{path: path, f: f, size: size}
	switch {
	case strings.HasSuffix(as, ".gz"):
		err = s.openGzip()
	case strings.HasSuffix(as, dataSuffix):
		err = s.openSafetensors()
	default:
		err = s.openZip()
	}
	if err != nil {
		_ = f.Close()
		return nil, err
	}
	return s, nil
}

func (s *sampleFile) Close() error { return s.f.Close() }

func (s *sampleFile) openSafetensors() error {
	h, err := safetensors.ReadHeader(s.f, s.size)
	if err != nil {
		return err
	}
	if h.Metadata["format"] == outputFormat {
		s.md = h.Metadata
	}
	var seen [4]bool
	for _, t := range h.Tensors {
		r, ok := roles[t.Name]
		if !ok || seen[r] {
			s.inexact = fmt.Sprintf("tensor %s is not one of the format's four", t.Name)
			continue
		}
		s.t[r] = fileTensor{name: t.Name, dtype: t.DType, shape: t.Shape, off: h.DataStart + t.Begin, n: t.Len()}
		seen[r] = true
	}
	return s.settle(seen)
}

// openGzip reads only the gzip header: extract's metadata is there, and the tensors
// are known once walk has decompressed the stream.
func (s *sampleFile) openGzip() error {
	s.gz = true
	zr, err := gzip.NewReader(bufio.NewReader(io.NewSectionReader(s.f, 0, s.size)))
	if err != nil {
		return err
	}
	defer func() { _ = zr.Close() }()
	x := zr.Header.Extra
	for len(x) >= 4 {
		l := int(binary.LittleEndian.Uint16(x[2:]))
		if len(x) < 4+l {
			break
		}
		if x[0] == gzipExtraID[0] && x[1] == gzipExtraID[1] {
			if err := json.Unmarshal(x[4:4+l], &s.md); err != nil {
				return fmt.Errorf("gzip header metadata: %w", err)
			}
		}
		x = x[4+l:]
	}
	return nil
}

// settle checks the tensors found: all four (loss_mask may be missing), int64 ids and
// mask, bf16 hidden and aux of one width, T rows each, an optional batch dim of 1.
func (s *sampleFile) settle(seen [4]bool) error {
	s.hasMask = seen[1]
	for r, ok := range seen {
		if !ok && r != 1 {
			return fmt.Errorf("no tensor %s", [4]string{tensorInputIDs, tensorLossMask, tensorHidden, tensorAux}[r])
		}
	}
	for r := range s.t {
		if r == 1 && !s.hasMask {
			continue
		}
		t := &s.t[r]
		want, rank := safetensors.I64, 1
		if r >= 2 {
			want, rank = safetensors.BF16, 2
		}
		// A batch dim of 1 shows as one rank more than the tensor's own (T = 1 keeps
		// its [1, H]).
		sh := t.shape
		if len(sh) == rank+1 && sh[0] == 1 {
			sh = sh[1:]
		}
		if t.dtype != want {
			return fmt.Errorf("tensor %s is %s, want %s", t.name, t.dtype, want)
		}
		if len(sh) != rank {
			return fmt.Errorf("tensor %s has shape %v, want rank %d (or a batch dim of 1)", t.name, t.shape, rank)
		}
		t.rows, t.width = sh[0], 1
		if rank == 2 {
			t.width = sh[1]
		}
	}
	T, H := s.t[0].rows, s.t[2].width
	switch {
	case T < 1:
		return errors.New("no tokens")
	case s.hasMask && s.t[1].rows != T:
		return fmt.Errorf("%s has %d entries, %s %d", s.t[1].name, s.t[1].rows, s.t[0].name, T)
	case s.t[2].rows != T || s.t[3].rows != T:
		return fmt.Errorf("%s has %d rows and %s %d, %s %d tokens", s.t[2].name, s.t[2].rows, s.t[3].name, s.t[3].rows, s.t[0].name, T)
	case H < 1 || s.t[3].width != 3*H:
		return fmt.Errorf("%s shape %v does not hold 3 layers of %s shape %v", s.t[3].name, s.t[3].shape, s.t[2].name, s.t[2].shape)
	}
	return nil
}

// tokens and hidden are T and H as the tensors say (after walk for gzip).
func (s *sampleFile) tokens() int64 { return s.t[0].rows }
func (s *sampleFile) hidden() int64 { return s.t[2].width }

// walk feeds fn each present tensor's bytes. For random-access files the order is
// canonical (ids, mask, hidden, aux); inside gzip it is the stream's order, which is
// canonical for extract's files (their crc32c depends on it).
func (s *sampleFile) walk(ctx context.Context, fn func(role int, r io.Reader) error) error {
	if !s.gz {
		for r := range s.t {
			if r == 1 && !s.hasMask {
				continue
			}
			t := s.t[r]
			if err := fn(r, &ctxReader{ctx, io.NewSectionReader(s.f, t.off, t.n)}); err != nil {
				return err
			}
		}
		return nil
	}
	zr, err := gzip.NewReader(bufio.NewReaderSize(io.NewSectionReader(s.f, 0, s.size), 1<<20))
	if err != nil {
		return err
	}
	defer func() { _ = zr.Close() }()
	zr.Multistream(false)
	havePickle := false
	err = torchzip.Walk(&ctxReader{ctx, zr}, func(name string, size int64, data io.Reader) error {
		_, rel, _ := strings.Cut(name, "/")
		switch {
		case rel == "data.pkl":
			pkl, err := io.ReadAll(io.LimitReader(data, 1<<20+1))
			if err != nil || len(pkl) > 1<<20 {
				return fmt.Errorf("read data.pkl: %v", err)
			}
			if err := s.fromPickle(pkl, func(string) (torchzip.File, bool) { return torchzip.File{}, false }); err != nil {
				return err
			}
			havePickle = true
		case strings.HasPrefix(rel, "data/"):
			if !havePickle {
				return errors.New("storage record before data.pkl: cannot stream")
			}
			r, ok := s.keys[strings.TrimPrefix(rel, "data/")]
			if !ok {
				return boundedSkip(name, size)
			}
			t := s.t[r]
			es := t.dtype.Size()
			if size != t.n || es == 0 {
				// A view of part of a bigger storage: streaming reads whole records only.
				return fmt.Errorf("storage of %s is %d bytes, the tensor %d: views are not streamed", t.name, size, t.n)
			}
			return fn(r, data)
		}
		return boundedSkip(name, size)
	})
	if err != nil {
		return err
	}
	if !havePickle {
		return errors.New("no data.pkl: not a torch checkpoint")
	}
	return nil
}

// ctxReader stops a long read when ctx ends.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c *ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

// ReadTensors reads a sample file of any format whole and returns its tensors' bytes by
// canonical name (input_ids, loss_mask, hidden_state, aux_hidden_state), batch dims
// dropped: two files hold the same sample exactly when these are equal. Memory grows
// with the file: it is for tests and comparisons, not for the pipeline.
func ReadTensors(path string) (map[string][]byte, error) {
	sf, err := openSample(path)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	defer func() { _ = sf.Close() }()
	out := map[string][]byte{}
	err = sf.walk(context.Background(), func(role int, r io.Reader) error {
		b, err := io.ReadAll(r)
		out[[4]string{tensorInputIDs, tensorLossMask, tensorHidden, tensorAux}[role]] = b
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	return out, nil
}
