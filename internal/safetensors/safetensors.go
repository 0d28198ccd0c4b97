// Package safetensors reads and writes the safetensors container (an 8-byte header
// length, a JSON header, then the tensor bytes) without loading tensor data into memory.
package safetensors

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
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

// Elements is the product of the shape.
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
		if t.DType.Size() == 0 {
			return nil, fmt.Errorf("tensor %q: unsupported dtype %q", name, t.DType)
		}
		for _, d := range t.Shape {
			if d < 0 {
				return nil, fmt.Errorf("tensor %q: negative dimension in shape %v", name, t.Shape)
			}
		}
		if t.Begin < 0 || t.End < t.Begin || t.Elements()*t.DType.Size() != t.Len() {
			return nil, fmt.Errorf("tensor %q: offsets [%d,%d] do not hold shape %v of %s", name, t.Begin, t.End, t.Shape, t.DType)
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
	if fileSize >= 0 && h.DataStart+at != fileSize {
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
		if s.DType.Size() == 0 {
			return nil, nil, fmt.Errorf("tensor %q: unsupported dtype %q", s.Name, s.DType)
		}
		t := Tensor{Name: s.Name, DType: s.DType, Shape: s.Shape, Begin: at}
		t.End = at + t.Elements()*s.DType.Size()
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
