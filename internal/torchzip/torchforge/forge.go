// Package torchforge forges torch zip checkpoints by hand, for tests: the hostile shapes
// (a pickle that runs code, a tensor re-pointed by BUILD, an offset that overflows) that
// torch.save never writes but Python's unpickler runs. It depends on nothing of
// extract's, so that the reader it attacks cannot shape its input; production code
// never imports it.
package torchforge

import (
	"archive/zip"
	"encoding/binary"
	"hash/crc32"
	"math"
	"os"
	"strconv"
)

// Tensor is one entry of a forged dict: a view of storage Key of class Storage.
type Tensor struct {
	Name, Storage, Key string
	Numel, Offset      int64 // the storage's elements; the view's offset in them
	Shape, Stride      []int64
}

// P is a pickle under construction.
type P []byte

// Op appends raw opcodes.
func (p P) Op(b ...byte) P { return append(p, b...) }

// Str appends a BINUNICODE string.
func (p P) Str(s string) P {
	p = append(p, 'X')
	p = binary.LittleEndian.AppendUint32(p, uint32(len(s)))
	return append(p, s...)
}

// Int appends an integer the way Python's pickler does.
func (p P) Int(v int64) P {
	switch {
	case v >= 0 && v < 1<<8:
		return append(p, 'K', byte(v))
	case v >= 0 && v < 1<<16:
		return binary.LittleEndian.AppendUint16(append(p, 'M'), uint16(v))
	case v >= math.MinInt32 && v <= math.MaxInt32:
		return binary.LittleEndian.AppendUint32(append(p, 'J'), uint32(int32(v)))
	}
	return binary.LittleEndian.AppendUint64(append(p, 0x8a, 8), uint64(v))
}

// Ints appends a tuple of integers.
func (p P) Ints(vs []int64) P {
	p = append(p, '(')
	for _, v := range vs {
		p = p.Int(v)
	}
	return append(p, 't')
}

// Global appends GLOBAL mod.name.
func (p P) Global(mod, name string) P { return append(p, "c"+mod+"\n"+name+"\n"...) }

// Storage appends the persistent id of t's storage, BINPERSID.
func (p P) Storage(t Tensor) P {
	return p.Op('(').Str("storage").Global("torch", t.Storage).Str(t.Key).Str("cpu").Int(t.Numel).Op('t', 'Q')
}

// EmptyHooks is torch's backward_hooks argument: collections.OrderedDict().
func EmptyHooks() P { return P{}.Global("collections", "OrderedDict").Op(')', 'R') }

// Tensor appends torch._utils._rebuild_tensor_v2 of t with hooks as its backward_hooks
// argument (nil: EmptyHooks).
func (p P) Tensor(t Tensor, hooks P) P {
	p = p.Global("torch._utils", "_rebuild_tensor_v2").Op('(').Storage(t)
	p = p.Int(t.Offset).Ints(t.Shape).Ints(t.Stride).Op(0x89)
	if hooks == nil {
		hooks = EmptyHooks()
	}
	return append(append(p, hooks...), 't', 'R')
}

// Dict is a pickle of a dict of ts, as torch.save writes one, with hooks(i) (nil: none)
// as tensor i's backward_hooks and after(i) spliced in right after tensor i is built.
func Dict(ts []Tensor, hooks, after func(i int) P) []byte {
	p := P{0x80, 2, '}', '('}
	for i, t := range ts {
		var h P
		if hooks != nil {
			h = hooks(i)
		}
		p = p.Str(t.Name).Tensor(t, h)
		if after != nil {
			p = append(p, after(i)...)
		}
	}
	return p.Op('u', '.')
}

// Sample is a SpecForge sample's dict: input_ids and loss_mask [T] int64 on storages 0
// and 1, hidden_state [1,T,H] and aux_hidden_state [1,T,3H] bf16 on 2 and 3.
func Sample(T, H int64) []Tensor {
	return []Tensor{
		{Name: "input_ids", Storage: "LongStorage", Key: "0", Numel: T, Shape: []int64{T}, Stride: []int64{1}},
		{Name: "loss_mask", Storage: "LongStorage", Key: "1", Numel: T, Shape: []int64{T}, Stride: []int64{1}},
		{Name: "hidden_state", Storage: "BFloat16Storage", Key: "2", Numel: T * H, Shape: []int64{1, T, H}, Stride: []int64{T * H, H, 1}},
		{Name: "aux_hidden_state", Storage: "BFloat16Storage", Key: "3", Numel: 3 * T * H, Shape: []int64{1, T, 3 * H}, Stride: []int64{3 * T * H, 3 * H, 1}},
	}
}

// OSSystem is issue 17's payload: a sample's dict whose last tensor's backward_hooks
// BUILD typing.collections with {'OrderedDict': os.system} and then REDUCE
// collections.OrderedDict(command): torch.load(weights_only=False) runs command and
// loads the four tensors fine. The hooks dict is made first, while the name is the class.
func OSSystem(T, H int64, command string) []byte {
	return Dict(Sample(T, H), func(i int) P {
		if i != 3 {
			return nil
		}
		h := EmptyHooks().Str("m").Global("typing", "collections")
		h = h.Op('}').Str("OrderedDict").Global("os", "system").Op('s', 'b', 's')
		return h.Str("r").Global("collections", "OrderedDict").Op('(').Str(command).Op('t', 'R', 's')
	}, nil)
}

// Repointed BUILDs hidden_state, right after it is built, with the state (storage key,
// 0, shape, stride): torch calls set_ and the tensor reads storage key instead of 2.
func Repointed(T, H int64, key string) []byte {
	ts := Sample(T, H)
	return Dict(ts, nil, func(i int) P {
		if i != 2 {
			return nil
		}
		other := ts[2]
		other.Key = key
		return P{}.Op('(').Storage(other).Int(0).Ints(other.Shape).Ints(other.Stride).Op('t', 'b')
	})
}

// BigOffset places hidden_state at storage offset 2^63−64: offset plus size overflows.
func BigOffset(T, H int64) []byte {
	ts := Sample(T, H)
	ts[2].Offset = math.MaxInt64 - 63
	return Dict(ts, nil, nil)
}

// Hostile are refused shapes of a 3-token, width-4 sample, by a word the refusal names.
func Hostile() map[string][]byte {
	ts := Sample(3, 4)
	twice := P{0x80, 2, '}', '('}.Str("a").Tensor(ts[0], nil).Op('q', 9).Str("b").Op('h', 9).Op('u', '.')
	shared := ts[1]
	shared.Key = "0"
	return map[string][]byte{
		"GLOBAL typing.collections": OSSystem(3, 4, "true"),
		"BUILD":                     Repointed(3, 4, "4"),
		"lies outside":              BigOffset(3, 4),
		"already stored":            []byte(twice),
		"used by two tensors":       Dict([]Tensor{ts[0], shared}, nil, nil),
		"after STOP":                append(Dict(ts, nil, nil), 'N'),
		"backward hooks": Dict(ts[:1], func(int) P {
			return EmptyHooks().Str("k").Tensor(ts[1], nil).Op('s')
		}, nil),
		"REDUCE of torch.LongStorage": P{0x80, 2}.Global("torch", "LongStorage").Op(')', 'R', '.'),
		"6 (no metadata)":             Dict(ts[:1], func(int) P { return EmptyHooks().Op('}') }, nil),
		"GLOBAL builtins.eval":        P{0x80, 2}.Global("builtins", "eval").Op('.'),
		"opcode 0x5d":                 P{0x80, 2, ']', '.'},
		"PROTO":                       P{0x80, 1, '}', '.'},
	}
}

// Storages are the bytes of Sample(T, H): ids 7.., mask ones, bf16 1.0 in hidden and
// aux; nan adds a storage 4 of NaN the size of hidden's.
func Storages(T, H int64, nan bool) [][]byte {
	ids, mask := make([]byte, 8*T), make([]byte, 8*T)
	for i := range T {
		binary.LittleEndian.PutUint64(ids[8*i:], uint64(i+7))
		binary.LittleEndian.PutUint64(mask[8*i:], 1)
	}
	out := [][]byte{ids, mask, BF16(T*H, 0x3f80), BF16(3*T*H, 0x3f80)}
	if nan {
		out = append(out, BF16(T*H, 0x7fc0))
	}
	return out
}

// BF16 is n bf16 values of bits v.
func BF16(n int64, v uint16) []byte {
	b := make([]byte, 2*n)
	for i := range n {
		binary.LittleEndian.PutUint16(b[2*i:], v)
	}
	return b
}

// WriteArchive writes a torch zip of pkl and storages (records data/0, data/1, ...) to
// path: torch's container, stored records sized in their local headers, only the
// pickle forged.
func WriteArchive(path string, pkl []byte, storages [][]byte) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	z := zip.NewWriter(f)
	add := func(name string, b []byte) error {
		w, err := z.CreateRaw(&zip.FileHeader{Name: "archive/" + name, Method: zip.Store,
			CRC32: crc32.ChecksumIEEE(b), CompressedSize64: uint64(len(b)), UncompressedSize64: uint64(len(b))})
		if err == nil {
			_, err = w.Write(b)
		}
		return err
	}
	err = add("data.pkl", pkl)
	for i, b := range storages {
		if err == nil {
			err = add("data/"+strconv.Itoa(i), b)
		}
	}
	if err == nil {
		err = add("version", []byte("3\n"))
	}
	if err == nil {
		err = z.Close()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
