package torchzip

import (
	"errors"
	"fmt"
	"unicode/utf8"
)

// The decoder reads exactly the pickle a plain torch.save of a dict of dense tensors
// writes (torch 1.13 through 2.x, protocol 2 by default, 4 or 5 when asked):
//
//	PROTO, EMPTY_DICT (or collections.OrderedDict() by REDUCE), then per tensor a string
//	key and torch._utils._rebuild_tensor_v2 REDUCEd with the argument tuple
//	(BINPERSID ('storage', torch.<T>Storage, key, location, numel), offset, size,
//	stride, requires_grad, collections.OrderedDict()), SETITEM(S), STOP,
//
// with memo PUT/GET anywhere. Tensor.__reduce_ex__ of a plain tensor is a 2-tuple, so
// torch never writes BUILD for one; its only REDUCEs are those two calls. Anything else
// is refused, naming it: another GLOBAL (typing.collections, os.system: a pickle that
// runs code when torch.load(weights_only=False) reads it), BUILD (which re-points a
// checked tensor at another storage through set_, or rewrites a module's attributes),
// any other REDUCE, a storage used by two tensors, a tensor outside its storage, bytes
// after STOP. What is accepted is exactly what the values returned describe: torch reads
// the same tensors from it with weights_only True or False.

// Bounds on what a tensor dict needs; past them the pickle is not torch's.
const (
	maxRank     = 16
	maxKeyBytes = 20 // storage keys are decimal record numbers
)

// storageDTypes are the storage classes a torch.<T>Storage GLOBAL may name.
var storageDTypes = map[string]DType{
	"LongStorage": Int64, "BFloat16Storage": BFloat16, "HalfStorage": Float16, "FloatStorage": Float32,
	"DoubleStorage": Float64, "IntStorage": Int32, "ShortStorage": Int16, "CharStorage": Int8,
	"BoolStorage": Bool, "ByteStorage": Uint8,
}

// The callables a plain tensor dict calls.
const (
	globalOrderedDict = "collections.OrderedDict"
	globalRebuild     = "torch._utils._rebuild_tensor_v2"
)

// The decoder's values.
type (
	global  string // an allowed "module.name"
	storage DType  // a torch.<T>Storage class
	tuple   []any
	persID  struct { // a storage reference, checked at BINPERSID
		dtype DType
		key   string
		numel int64
	}
	dict struct {
		keys    []string
		vals    []*tensorV
		ordered bool // made by collections.OrderedDict()
		hooks   bool // a tensor's backward_hooks: must stay empty
	}
	tensorV struct {
		Tensor
		placed bool // a value of the top-level dict already
	}
)

// DecodeDict reads a data.pkl that holds a dict (or OrderedDict) of tensors and returns
// them in the pickle's order. It runs no code and accepts only the shape above.
func DecodeDict(p []byte) ([]Tensor, error) {
	ts, n, err := DecodeDictPrefix(p)
	if err == nil && n != len(p) {
		return nil, fmt.Errorf("pickle: %d bytes after STOP at %d", len(p)-n, n-1)
	}
	return ts, err
}

// DecodeDictPrefix is DecodeDict of a pickle followed by other bytes (the start of a
// stream whose record sizes come after the data): it returns how many bytes the pickle
// took, STOP included.
func DecodeDictPrefix(p []byte) ([]Tensor, int, error) {
	d := &decoder{p: p, memo: map[uint32]any{}, keys: map[string]bool{}}
	ts, err := d.run()
	if err != nil {
		return nil, 0, err
	}
	return ts, d.pos, nil
}

type decoder struct {
	p     []byte
	pos   int
	op    int // the offset of the opcode being decoded, for messages
	stack []any
	marks []int
	memo  map[uint32]any
	proto byte
	keys  map[string]bool // storage keys a tensor was built on
}

func (d *decoder) errf(format string, args ...any) error {
	return fmt.Errorf("pickle: at %d: %s", d.op, fmt.Sprintf(format, args...))
}

func (d *decoder) need(n int) ([]byte, error) {
	if n < 0 || n > len(d.p)-d.pos {
		return nil, errors.New("pickle: truncated")
	}
	s := d.p[d.pos : d.pos+n]
	d.pos += n
	return s, nil
}

func (d *decoder) uint(n int) (uint64, error) {
	b, err := d.need(n)
	if err != nil {
		return 0, err
	}
	var v uint64
	for i := n - 1; i >= 0; i-- {
		v = v<<8 | uint64(b[i])
	}
	return v, nil
}

func (d *decoder) line() (string, error) {
	for i := d.pos; i < len(d.p); i++ {
		if d.p[i] == '\n' {
			s := string(d.p[d.pos:i])
			d.pos = i + 1
			return s, nil
		}
	}
	return "", errors.New("pickle: truncated")
}

func (d *decoder) push(v any) { d.stack = append(d.stack, v) }

func (d *decoder) pop() (any, error) {
	if len(d.stack) == 0 || (len(d.marks) > 0 && d.marks[len(d.marks)-1] == len(d.stack)) {
		return nil, d.errf("stack underflow")
	}
	v := d.stack[len(d.stack)-1]
	d.stack = d.stack[:len(d.stack)-1]
	return v, nil
}

func (d *decoder) popMark() ([]any, error) {
	if len(d.marks) == 0 {
		return nil, d.errf("no MARK")
	}
	m := d.marks[len(d.marks)-1]
	d.marks = d.marks[:len(d.marks)-1]
	items := append([]any(nil), d.stack[m:]...)
	d.stack = d.stack[:m]
	return items, nil
}

func (d *decoder) run() ([]Tensor, error) {
	for {
		d.op = d.pos
		b, err := d.need(1)
		if err != nil {
			return nil, err
		}
		op := b[0]
		if d.op == 0 && op != 0x80 {
			return nil, d.errf("no PROTO: not a pickle torch.save writes")
		}
		switch op {
		case 0x80: // PROTO
			v, err := d.uint(1)
			if err != nil {
				return nil, err
			}
			if d.op != 0 || v < 2 || v > 5 {
				return nil, d.errf("PROTO %d: torch.save writes protocol 2 (4 or 5 when asked), once, first", v)
			}
			d.proto = byte(v)
		case 0x95: // FRAME: protocol 4 framing, no value
			if d.proto < 4 {
				return nil, d.errf("FRAME in protocol %d", d.proto)
			}
			if _, err := d.need(8); err != nil {
				return nil, err
			}
		case '}': // EMPTY_DICT
			d.push(&dict{})
		case ')': // EMPTY_TUPLE
			d.push(tuple{})
		case '(': // MARK
			d.marks = append(d.marks, len(d.stack))
		case 0x88, 0x89: // NEWTRUE, NEWFALSE
			d.push(op == 0x88)
		case 'K', 'M': // BININT1, BININT2
			n := 1
			if op == 'M' {
				n = 2
			}
			v, err := d.uint(n)
			if err != nil {
				return nil, err
			}
			d.push(int64(v))
		case 'J': // BININT
			v, err := d.uint(4)
			if err != nil {
				return nil, err
			}
			d.push(int64(int32(uint32(v))))
		case 0x8a: // LONG1
			v, err := d.long1()
			if err != nil {
				return nil, err
			}
			d.push(v)
		case 'X', 0x8c, 0x8d: // BINUNICODE, SHORT_BINUNICODE, BINUNICODE8
			width := 4
			switch op {
			case 0x8c:
				width = 1
			case 0x8d:
				width = 8
			}
			n, err := d.uint(width)
			if err != nil {
				return nil, err
			}
			if n > uint64(len(d.p)) {
				return nil, errors.New("pickle: truncated")
			}
			s, err := d.need(int(n))
			if err != nil {
				return nil, err
			}
			if !utf8.Valid(s) {
				return nil, d.errf("string is not UTF-8")
			}
			d.push(string(s))
		case 'c': // GLOBAL
			mod, err := d.line()
			if err != nil {
				return nil, err
			}
			name, err := d.line()
			if err != nil {
				return nil, err
			}
			g, err := d.global(mod, name)
			if err != nil {
				return nil, err
			}
			d.push(g)
		case 0x93: // STACK_GLOBAL
			name, err1 := d.pop()
			mod, err2 := d.pop()
			ms, ok1 := mod.(string)
			ns, ok2 := name.(string)
			if err1 != nil || err2 != nil || !ok1 || !ok2 {
				return nil, d.errf("STACK_GLOBAL without two strings")
			}
			g, err := d.global(ms, ns)
			if err != nil {
				return nil, err
			}
			d.push(g)
		case 'q', 'r', 0x94: // BINPUT, LONG_BINPUT, MEMOIZE
			var k uint64
			switch op {
			case 'q':
				k, err = d.uint(1)
			case 'r':
				k, err = d.uint(4)
			default:
				k = uint64(len(d.memo))
			}
			if err != nil {
				return nil, err
			}
			if len(d.stack) == 0 || (len(d.marks) > 0 && d.marks[len(d.marks)-1] == len(d.stack)) {
				return nil, d.errf("memo of an empty stack")
			}
			d.memo[uint32(k)] = d.stack[len(d.stack)-1]
		case 'h', 'j': // BINGET, LONG_BINGET
			n := 1
			if op == 'j' {
				n = 4
			}
			k, err := d.uint(n)
			if err != nil {
				return nil, err
			}
			v, ok := d.memo[uint32(k)]
			if !ok {
				return nil, d.errf("memo %d unset", k)
			}
			d.push(v)
		case 't': // TUPLE
			items, err := d.popMark()
			if err != nil {
				return nil, err
			}
			d.push(tuple(items))
		case 0x85, 0x86, 0x87: // TUPLE1..3
			n := int(op-0x85) + 1
			t := make(tuple, n)
			for i := n - 1; i >= 0; i-- {
				if t[i], err = d.pop(); err != nil {
					return nil, err
				}
			}
			d.push(t)
		case 'Q': // BINPERSID
			v, err := d.pop()
			if err != nil {
				return nil, err
			}
			pid, err := d.persID(v)
			if err != nil {
				return nil, err
			}
			d.push(pid)
		case 'R': // REDUCE
			args, err1 := d.pop()
			fn, err2 := d.pop()
			if err1 != nil || err2 != nil {
				return nil, d.errf("stack underflow")
			}
			v, err := d.reduce(fn, args)
			if err != nil {
				return nil, err
			}
			d.push(v)
		case 's', 'u': // SETITEM, SETITEMS
			if err := d.setItems(op == 's'); err != nil {
				return nil, err
			}
		case '.': // STOP
			return d.stop()
		case 'b':
			return nil, d.errf("BUILD sets an object's state after it is built: torch.save of plain tensors writes none (a BUILD can re-point a checked tensor at another storage, or rewrite a module)")
		default:
			return nil, d.errf("opcode 0x%02x (%q) is not one torch.save of a tensor dict writes", op, rune(op))
		}
	}
}

// long1 reads a LONG1 integer: little-endian two's complement, at most 8 bytes, which is
// what Python writes for any int64.
func (d *decoder) long1() (int64, error) {
	n, err := d.uint(1)
	if err != nil {
		return 0, err
	}
	if n > 8 {
		return 0, d.errf("integer of %d bytes is outside int64", n)
	}
	b, err := d.need(int(n))
	if err != nil {
		return 0, err
	}
	var x uint64
	for i := len(b) - 1; i >= 0; i-- {
		x = x<<8 | uint64(b[i])
	}
	if n > 0 && n < 8 && b[n-1]&0x80 != 0 {
		x |= ^uint64(0) << (8 * n)
	}
	return int64(x), nil
}
