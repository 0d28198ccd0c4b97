// Package safetensors reads and writes the safetensors container (an 8-byte header
// length, a JSON header, then the tensor bytes) without loading tensor data into memory.
package safetensors

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/bits"
	"sort"
	"strings"
)

// MaxHeaderSize bounds the JSON header so a corrupt length cannot make us allocate
// gigabytes; real dumps carry a header of a few hundred bytes.
const MaxHeaderSize = 16 << 20

// DType is a safetensors element type name.
type DType string

// The element types that dumps and outputs use.
const (
	BF16 DType = "BF16"
	F16  DType = "F16"
	F32  DType = "F32"
	I64  DType = "I64"
	I32  DType = "I32"
	U8   DType = "U8"
)

// Size is the width of one element in bytes, or 0 for an unknown type.
func (d DType) Size() int64 {
	switch d {
	case BF16, F16:
		return 2
	case F32, I32:
		return 4
	case I64:
		return 8
	case U8:
		return 1
	}
	return 0
}

// Tensor describes one tensor: its offsets are relative to the start of the data section.
type Tensor struct {
	Name  string
	DType DType
	Shape []int64
	Begin int64
	End   int64
}

// Len is the tensor's size in bytes.
func (t Tensor) Len() int64 { return t.End - t.Begin }

// Elements is the product of the shape. It cannot overflow for a tensor that ReadHeader
// or EncodeHeader returned, since both check the shape's byte size; use ByteSize for a
// shape from anywhere else.
func (t Tensor) Elements() int64 {
	n := int64(1)
	for _, d := range t.Shape {
		n *= d
	}
	return n
}

// Header is a parsed safetensors header.
type Header struct {
	// Tensors in data order (ascending Begin).
	Tensors  []Tensor
	Metadata map[string]string
	// DataStart is the file offset of the data section: 8 + the JSON header's length.
	DataStart int64
}

// Tensor returns the named tensor.
func (h *Header) Tensor(name string) (Tensor, bool) {
	for _, t := range h.Tensors {
		if t.Name == name {
			return t, true
		}
	}
	return Tensor{}, false
}

// ErrOverflow means a shape's byte size does not fit in an int64.
var ErrOverflow = errors.New("byte size overflows int64")

// mul is a*b for non-negative a and b, and false when the product exceeds MaxInt64.
func mul(a, b int64) (int64, bool) {
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if hi != 0 || lo > math.MaxInt64 {
		return 0, false
	}
	return int64(lo), true
}

// ByteSize is the number of bytes a tensor of dt and shape holds, by checked
// multiplication: a shape such as [4, 2^61] of BF16 wraps to 0 bytes in plain int64
// arithmetic and would pass for an empty tensor.
func ByteSize(dt DType, shape []int64) (int64, error) {
	n := dt.Size()
	if n == 0 {
		return 0, fmt.Errorf("unsupported dtype %q", dt)
	}
	// A zero dimension makes the tensor empty whatever the others are, but the others
	// must still be sane, so check every dimension before multiplying.
	for _, d := range shape {
		if d < 0 {
			return 0, fmt.Errorf("negative dimension in shape %v", shape)
		}
	}
	for _, d := range shape {
		var ok bool
		if n, ok = mul(n, d); !ok {
			return 0, fmt.Errorf("shape %v of %s: %w", shape, dt, ErrOverflow)
		}
	}
	return n, nil
}

type jsonTensor struct {
	DType       DType    `json:"dtype"`
	Shape       []int64  `json:"shape"`
	DataOffsets [2]int64 `json:"data_offsets"`
}

// ReadHeader parses and checks the header of a container of fileSize bytes: known
// dtypes, sizes that match shapes, offsets that tile the data section exactly and end
// at the end of the file. A truncated or padded file is an error.
func ReadHeader(r io.Reader, fileSize int64) (*Header, error) {
	var lenBuf [8]byte
	if _, err := io.ReadFull(r, lenBuf[:]); err != nil {
		return nil, fmt.Errorf("read header length: %w", err)
	}
	n := binary.LittleEndian.Uint64(lenBuf[:])
	if n == 0 || n > MaxHeaderSize {
		return nil, fmt.Errorf("header length %d out of range (1..%d)", n, MaxHeaderSize)
	}
	if fileSize >= 0 && int64(n)+8 > fileSize {
		return nil, fmt.Errorf("header length %d exceeds file size %d", n, fileSize)
	}
	raw := make([]byte, n)
	if _, err := io.ReadFull(r, raw); err != nil {
		return nil, fmt.Errorf("read header: %w", err)
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil {
		return nil, fmt.Errorf("header is not JSON: %w", err)
	}
	h := &Header{DataStart: 8 + int64(n), Metadata: map[string]string{}}
	for name, v := range fields {
		if name == "__metadata__" {
			if err := json.Unmarshal(v, &h.Metadata); err != nil {
				return nil, fmt.Errorf("__metadata__ is not a string map: %w", err)
			}
			continue
		}
		var jt jsonTensor
		if err := json.Unmarshal(v, &jt); err != nil {
			return nil, fmt.Errorf("tensor %q: %w", name, err)
		}
		t := Tensor{Name: name, DType: jt.DType, Shape: jt.Shape, Begin: jt.DataOffsets[0], End: jt.DataOffsets[1]}
		// No dimension can exceed the file's size: a tensor that holds bytes has every
		// dimension ≤ its byte count, and an empty one with a huge dimension is a trap
		// for a reader that loops over it (T = 2^61 token rows of nothing).
		for _, d := range t.Shape {
			if fileSize >= 0 && d > fileSize {
				return nil, fmt.Errorf("tensor %q: dimension %d in shape %v exceeds the file's %d bytes", name, d, t.Shape, fileSize)
			}
		}
		n, err := ByteSize(t.DType, t.Shape)
		if err != nil {
			return nil, fmt.Errorf("tensor %q: %w", name, err)
		}
		if t.Begin < 0 || t.End < t.Begin || t.Len() != n {
			return nil, fmt.Errorf("tensor %q: offsets [%d,%d] do not hold shape %v of %s", name, t.Begin, t.End, t.Shape, t.DType)
		}
		if fileSize >= 0 && t.End > fileSize-h.DataStart {
			return nil, fmt.Errorf("tensor %q: offsets [%d,%d] end beyond the file's %d data bytes (truncated file or bad offsets)", name, t.Begin, t.End, fileSize-h.DataStart)
		}
		h.Tensors = append(h.Tensors, t)
	}
	sort.Slice(h.Tensors, func(i, j int) bool { return h.Tensors[i].Begin < h.Tensors[j].Begin })
	var at int64
	for _, t := range h.Tensors {
		if t.Begin != at {
			return nil, fmt.Errorf("tensor %q starts at %d, want %d (gap or overlap)", t.Name, t.Begin, at)
		}
		at = t.End
	}
	if fileSize >= 0 && at != fileSize-h.DataStart {
		return nil, fmt.Errorf("file is %d bytes, header describes %d (truncated or trailing bytes)", fileSize, h.DataStart+at)
	}
	return h, nil
}

// Spec names a tensor to be written.
type Spec struct {
	Name  string
	DType DType
	Shape []int64
}

// EncodeHeader lays out specs in the given order and returns the bytes that precede the
// data section (length prefix and JSON, space-padded to 8 bytes) and the tensors' offsets.
func EncodeHeader(specs []Spec, metadata map[string]string) ([]byte, []Tensor, error) {
	var b strings.Builder
	b.WriteByte('{')
	tensors := make([]Tensor, 0, len(specs))
	var at int64
	for i, s := range specs {
		n, err := ByteSize(s.DType, s.Shape)
		if err != nil {
			return nil, nil, fmt.Errorf("tensor %q: %w", s.Name, err)
		}
		if n > math.MaxInt64-at {
			return nil, nil, fmt.Errorf("tensor %q: data section past %d bytes: %w", s.Name, at, ErrOverflow)
		}
		t := Tensor{Name: s.Name, DType: s.DType, Shape: s.Shape, Begin: at, End: at + n}
		at = t.End
		tensors = append(tensors, t)
		js, err := json.Marshal(jsonTensor{DType: s.DType, Shape: nonNil(s.Shape), DataOffsets: [2]int64{t.Begin, t.End}})
		if err != nil {
			return nil, nil, err
		}
		name, _ := json.Marshal(s.Name)
		if i > 0 {
			b.WriteByte(',')
		}
		b.Write(name)
		b.WriteByte(':')
		b.Write(js)
	}
	if len(metadata) > 0 {
		js, err := json.Marshal(metadata)
		if err != nil {
			return nil, nil, err
		}
		if len(specs) > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`"__metadata__":`)
		b.Write(js)
	}
	b.WriteByte('}')
	for (b.Len())%8 != 0 {
		b.WriteByte(' ')
	}
	out := make([]byte, 8, 8+b.Len())
	binary.LittleEndian.PutUint64(out, uint64(b.Len()))
	out = append(out, b.String()...)
	return out, tensors, nil
}

func nonNil(s []int64) []int64 {
	if s == nil {
		return []int64{}
	}
	return s
}
