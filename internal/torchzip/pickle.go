package torchzip

import (
	"encoding/binary"
	"fmt"
	"math"
)

// DType is a tensor element type as torch names its storage class.
type DType string

// The element types extract writes and reads.
const (
	Int64    DType = "LongStorage"
	BFloat16 DType = "BFloat16Storage"
	Float16  DType = "HalfStorage"
	Float32  DType = "FloatStorage"
	Float64  DType = "DoubleStorage"
	Int32    DType = "IntStorage"
	Int16    DType = "ShortStorage"
	Int8     DType = "CharStorage"
	Bool     DType = "BoolStorage"
	Uint8    DType = "ByteStorage"
)

// Size is the bytes per element, 0 for an unknown type.
func (d DType) Size() int64 {
	switch d {
	case Int64, Float64:
		return 8
	case Float32, Int32:
		return 4
	case BFloat16, Float16, Int16:
		return 2
	case Bool, Uint8, Int8:
		return 1
	}
	return 0
}

// Tensor is a dense tensor in an archive: a view of storage Key.
type Tensor struct {
	Name          string
	DType         DType
	Key           string // its storage record is data/<Key>
	StorageNumel  int64
	StorageOffset int64 // in elements
	Shape, Stride []int64
}

// Numel is the number of elements of the tensor.
func (t Tensor) Numel() int64 {
	n := int64(1)
	for _, s := range t.Shape {
		n *= s
	}
	return n
}

// Contiguous reports whether the tensor's elements lie in row-major order, back to back.
func (t Tensor) Contiguous() bool {
	want := int64(1)
	for i := len(t.Shape) - 1; i >= 0; i-- {
		if t.Shape[i] != 1 && t.Stride[i] != want {
			return false
		}
		want *= t.Shape[i]
	}
	return true
}

// EncodeDict pickles a dict of tensors, in the given order, the way torch.save does
// (protocol 2), using only what torch.load(weights_only=True) accepts since torch 1.13:
// GLOBAL of torch._utils._rebuild_tensor_v2, torch.<T>Storage and collections.OrderedDict,
// BINPERSID of a storage tuple, REDUCE, tuples, ints, strings and False.
func EncodeDict(ts []Tensor) []byte {
	b := []byte{0x80, 2, '}'} // PROTO 2, EMPTY_DICT
	if len(ts) > 0 {
		b = append(b, '(') // MARK
	}
	for _, t := range ts {
		b = pickleString(b, t.Name)
		b = append(b, "ctorch._utils\n_rebuild_tensor_v2\n"...)
		b = append(b, '(') // MARK: the args tuple
		b = append(b, '(') // MARK: the persistent id
		b = pickleString(b, "storage")
		b = append(b, "ctorch\n"+string(t.DType)+"\n"...)
		b = pickleString(b, t.Key)
		b = pickleString(b, "cpu")
		b = pickleInt(b, t.StorageNumel)
		b = append(b, 't', 'Q') // TUPLE, BINPERSID
		b = pickleInt(b, t.StorageOffset)
		b = pickleTuple(b, t.Shape)
		b = pickleTuple(b, t.Stride)
		b = append(b, 0x89)                               // NEWFALSE: requires_grad
		b = append(b, "ccollections\nOrderedDict\n)R"...) // backward_hooks: OrderedDict()
		b = append(b, 't', 'R')                           // TUPLE, REDUCE
	}
	if len(ts) > 0 {
		b = append(b, 'u') // SETITEMS
	}
	return append(b, '.')
}

func pickleString(b []byte, s string) []byte {
	b = append(b, 'X')
	b = binary.LittleEndian.AppendUint32(b, uint32(len(s)))
	return append(b, s...)
}

func pickleInt(b []byte, v int64) []byte {
	switch {
	case v >= 0 && v < 1<<8:
		return append(b, 'K', byte(v))
	case v >= 0 && v < 1<<16:
		return binary.LittleEndian.AppendUint16(append(b, 'M'), uint16(v))
	case v >= math.MinInt32 && v <= math.MaxInt32:
		return binary.LittleEndian.AppendUint32(append(b, 'J'), uint32(int32(v)))
	}
	// LONG1: little-endian two's complement, 8 bytes is always enough for an int64.
	b = append(b, 0x8a, 8)
	return binary.LittleEndian.AppendUint64(b, uint64(v))
}

func pickleTuple(b []byte, vs []int64) []byte {
	switch len(vs) {
	case 0:
		return append(b, ')')
	case 1, 2, 3:
		for _, v := range vs {
			b = pickleInt(b, v)
		}
		return append(b, 0x85+byte(len(vs)-1)) // TUPLE1..TUPLE3
	}
	b = append(b, '(')
	for _, v := range vs {
		b = pickleInt(b, v)
	}
	return append(b, 't')
}

// Span is the tensor's bytes within its storage: from off, n long (the view's extent;
// its Numel elements when contiguous), in checked arithmetic. An error says the view
// does not lie inside the storage.
func (t Tensor) Span() (off, n int64, err error) {
	es := t.DType.Size()
	if es == 0 {
		return 0, 0, fmt.Errorf("storage %s: unknown element type %s", t.Key, t.DType)
	}
	if t.StorageNumel < 0 || t.StorageNumel > math.MaxInt64/es || t.StorageOffset < 0 || len(t.Shape) != len(t.Stride) {
		return 0, 0, fmt.Errorf("storage %s: %d elements, offset %d", t.Key, t.StorageNumel, t.StorageOffset)
	}
	// extent: one past the last element the view touches, relative to the offset.
	extent := int64(1)
	for i, s := range t.Shape {
		if s == 0 {
			extent = 0
			break
		}
		if t.Stride[i] < 0 {
			return 0, 0, fmt.Errorf("storage %s: negative stride", t.Key)
		}
		reach, ok := mulChecked(s-1, t.Stride[i])
		if !ok || reach > math.MaxInt64-extent {
			return 0, 0, fmt.Errorf("storage %s: shape %v stride %v overflows", t.Key, t.Shape, t.Stride)
		}
		extent += reach
	}
	if _, ok := t.numel(); !ok {
		return 0, 0, fmt.Errorf("storage %s: shape %v overflows", t.Key, t.Shape)
	}
	if t.StorageOffset > t.StorageNumel || extent > t.StorageNumel-t.StorageOffset {
		return 0, 0, fmt.Errorf("storage %s: a view of %d elements at offset %d lies outside its %d elements", t.Key, extent, t.StorageOffset, t.StorageNumel)
	}
	return t.StorageOffset * es, extent * es, nil
}

// numel is the element count, false when it overflows.
func (t Tensor) numel() (int64, bool) {
	n := int64(1)
	for _, s := range t.Shape {
		var ok bool
		if n, ok = mulChecked(n, s); !ok {
			return 0, false
		}
	}
	return n, true
}

func mulChecked(a, b int64) (int64, bool) {
	if a < 0 || b < 0 {
		return 0, false
	}
	if a != 0 && b > math.MaxInt64/a {
		return 0, false
	}
	return a * b, true
}

// StorageBytes is the byte size of the tensor's whole storage (its record's size).
func (t Tensor) StorageBytes() int64 { return t.StorageNumel * t.DType.Size() }
