package safetensors

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"testing"
)

// rawFile builds a container from a literal JSON header followed by dataLen zero bytes,
// so that a test can state offsets and shapes the encoder would refuse to write.
func rawFile(header string, dataLen int) []byte {
	for len(header)%8 != 0 {
		header += " "
	}
	b := binary.LittleEndian.AppendUint64(nil, uint64(len(header)))
	b = append(b, header...)
	return append(b, make([]byte, dataLen)...)
}

// overflowFiles are headers whose element count times the dtype width wraps around
// int64 (or uint64) to exactly the bytes the offsets hold: the unchecked product
// accepted all of them.
func overflowFiles() map[string][]byte {
	return map[string][]byte{
		// 4 × 2^61 × 2 = 2^64 ≡ 0: a 0-byte BF16 tensor "of" 2^63 elements.
		"shape [4, 2^61] bf16": rawFile(`{"h":{"dtype":"BF16","shape":[4,2305843009213693952],"data_offsets":[0,0]}}`, 0),
		// T = 2^61+3 int64 ids: T×8 = 2^64 + 24 ≡ 24 bytes, so 3 ids on disk.
		"T = 2^61+3 int64": rawFile(`{"input_ids":{"dtype":"I64","shape":[2305843009213693955],"data_offsets":[0,24]}}`, 24),
		// A dimension larger than the file with a zero beside it holds no bytes, but a
		// reader that takes T from it would loop 2^61 times.
		"dimension beyond the file": rawFile(`{"x":{"dtype":"U8","shape":[0,2305843009213693952],"data_offsets":[0,0]}}`, 0),
		// Products that stay within uint64 but overflow int64.
		"shape [2^32, 2^31] u8": rawFile(`{"x":{"dtype":"U8","shape":[4294967296,2147483648],"data_offsets":[0,0]}}`, 0),
	}
}

func TestReadHeaderRejectsShapesWhoseByteSizeOverflows(t *testing.T) {
	for name, file := range overflowFiles() {
		t.Run(name, func(t *testing.T) {
			h, err := ReadHeader(bytes.NewReader(file), int64(len(file)))
			if err == nil {
				t.Fatalf("accepted %+v", h.Tensors)
			}
		})
	}
}

func TestReadHeaderRejectsOffsetsBeyondTheFile(t *testing.T) {
	// Offsets near MaxInt64: DataStart + End must not wrap to the file size.
	file := rawFile(`{"x":{"dtype":"U8","shape":[1],"data_offsets":[9223372036854775807,9223372036854775808]}}`, 1)
	if _, err := ReadHeader(bytes.NewReader(file), int64(len(file))); err == nil {
		t.Fatal("accepted offsets past MaxInt64")
	}
	file = rawFile(`{"x":{"dtype":"U8","shape":[9223372036854775800],"data_offsets":[0,9223372036854775800]}}`, 8)
	if _, err := ReadHeader(bytes.NewReader(file), int64(len(file))); err == nil {
		t.Fatal("accepted a tensor that ends far beyond the file")
	}
}

func TestEncodeHeaderRefusesOverflowingShapes(t *testing.T) {
	for _, shape := range [][]int64{
		{4, 1 << 61},
		{1<<61 + 3},
		{1 << 32, 1 << 31},
		{-1, 2},
	} {
		t.Run(fmt.Sprint(shape), func(t *testing.T) {
			if _, _, err := EncodeHeader([]Spec{{Name: "x", DType: I64, Shape: shape}}, nil); err == nil {
				t.Fatalf("encoded shape %v", shape)
			}
		})
	}
	// Two tensors that fit alone but whose offsets overflow together.
	half := int64(1) << 61
	if _, _, err := EncodeHeader([]Spec{{Name: "a", DType: U8, Shape: []int64{half * 3}}, {Name: "b", DType: U8, Shape: []int64{half * 3}}}, nil); err == nil {
		t.Fatal("encoded tensors whose offsets sum past MaxInt64")
	}
}

func TestByteSizeIsCheckedMultiplication(t *testing.T) {
	for _, tt := range []struct {
		dt    DType
		shape []int64
		want  int64
		ok    bool
	}{
		{BF16, []int64{3, 4}, 24, true},
		{I64, nil, 8, true},
		{U8, []int64{0, 1 << 62}, 0, true},
		{BF16, []int64{4, 1 << 61}, 0, false},
		{I64, []int64{1<<61 + 3}, 0, false},
		{U8, []int64{-1}, 0, false},
		{DType("X"), []int64{1}, 0, false},
	} {
		got, err := ByteSize(tt.dt, tt.shape)
		if (err == nil) != tt.ok || got != tt.want {
			t.Errorf("ByteSize(%s, %v) = %d, %v; want %d ok=%v", tt.dt, tt.shape, got, err, tt.want, tt.ok)
		}
	}
}

// FuzzReadHeader feeds arbitrary bytes to ReadHeader as a whole file. Whatever it
// accepts must describe tensors that lie inside the file, tile its data section, and
// whose shapes hold exactly their bytes by checked arithmetic; then the encoder must
// write the same layout back.
func FuzzReadHeader(f *testing.F) {
	good, _, err := EncodeHeader([]Spec{
		{Name: "input_ids", DType: I64, Shape: []int64{3}},
		{Name: "hidden_state", DType: BF16, Shape: []int64{3, 4}},
	}, map[string]string{"rid": "s000000001-a1"})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(append(good, make([]byte, 48)...))
	f.Add(rawFile(`{}`, 0))
	f.Add(rawFile(`{"__metadata__":{"a":"b"}}`, 0))
	f.Add(rawFile(`{"a":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}}`, 4))
	for _, file := range overflowFiles() {
		f.Add(file)
	}
	f.Fuzz(func(t *testing.T, file []byte) {
		h, err := ReadHeader(bytes.NewReader(file), int64(len(file)))
		if err != nil {
			return
		}
		if h.DataStart < 8 || h.DataStart > int64(len(file)) {
			t.Fatalf("DataStart %d outside a %d-byte file", h.DataStart, len(file))
		}
		var at int64
		specs := make([]Spec, 0, len(h.Tensors))
		for _, tn := range h.Tensors {
			n, err := ByteSize(tn.DType, tn.Shape)
			if err != nil || n != tn.Len() || tn.Begin != at {
				t.Fatalf("tensor %q %v %s at [%d,%d]: size %d, %v", tn.Name, tn.Shape, tn.DType, tn.Begin, tn.End, n, err)
			}
			for _, d := range tn.Shape {
				if d < 0 || d > int64(len(file)) {
					t.Fatalf("tensor %q: dimension %d outside 0..%d", tn.Name, d, len(file))
				}
			}
			at = tn.End
			specs = append(specs, Spec{Name: tn.Name, DType: tn.DType, Shape: tn.Shape})
		}
		if h.DataStart+at != int64(len(file)) {
			t.Fatalf("tensors end at %d in a %d-byte file", h.DataStart+at, len(file))
		}
		_, enc, err := EncodeHeader(specs, h.Metadata)
		if err != nil {
			t.Fatalf("re-encode: %v", err)
		}
		for i, tn := range enc {
			if tn.Begin != h.Tensors[i].Begin || tn.End != h.Tensors[i].End {
				t.Fatalf("re-encoded %q at [%d,%d], read at [%d,%d]", tn.Name, tn.Begin, tn.End, h.Tensors[i].Begin, h.Tensors[i].End)
			}
		}
	})
}
