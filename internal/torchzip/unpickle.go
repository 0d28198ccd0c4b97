package torchzip

import (
	"errors"
	"fmt"
	"math"
	"strings"
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

// global admits only the names a plain tensor dict refers to.
func (d *decoder) global(mod, name string) (any, error) {
	full := mod + "." + name
	switch {
	case full == globalOrderedDict, full == globalRebuild:
		return global(full), nil
	case mod == "torch":
		if dt, ok := storageDTypes[name]; ok {
			return storage(dt), nil
		}
	}
	return nil, d.errf("GLOBAL %s is not one torch.save of a tensor dict refers to", strings.ToValidUTF8(full, "?"))
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

// persID checks a storage reference: ('storage', torch.<T>Storage, key, location, numel).
func (d *decoder) persID(v any) (persID, error) {
	t, ok := v.(tuple)
	if !ok || len(t) != 5 || t[0] != "storage" {
		return persID{}, d.errf("persistent id %v is not a storage reference", describe(v))
	}
	st, ok1 := t[1].(storage)
	key, ok2 := t[2].(string)
	loc, ok3 := t[3].(string)
	numel, ok4 := t[4].(int64)
	if !ok1 || !ok2 || !ok3 || !ok4 {
		return persID{}, d.errf("malformed storage reference")
	}
	if !isDecimal(key) {
		return persID{}, d.errf("storage key %q is not a record number", key)
	}
	if !isLocation(loc) {
		return persID{}, d.errf("storage %s location %q is not cpu or cuda", key, loc)
	}
	if numel < 0 || numel > math.MaxInt64/DType(st).Size() {
		return persID{}, d.errf("storage %s of %d elements", key, numel)
	}
	return persID{dtype: DType(st), key: key, numel: numel}, nil
}

func isDecimal(s string) bool {
	if s == "" || len(s) > maxKeyBytes {
		return false
	}
	for _, c := range []byte(s) {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

func isLocation(s string) bool {
	if s == "cpu" || s == "cuda" {
		return true
	}
	n, ok := strings.CutPrefix(s, "cuda:")
	return ok && isDecimal(n)
}

// reduce applies the only two calls a plain tensor dict makes.
func (d *decoder) reduce(fn, args any) (any, error) {
	g, ok := fn.(global)
	a, ok2 := args.(tuple)
	if !ok || !ok2 {
		return nil, d.errf("REDUCE of %s is not a call torch.save of a tensor dict makes", describe(fn))
	}
	switch g {
	case globalOrderedDict:
		if len(a) != 0 {
			return nil, d.errf("collections.OrderedDict called with %d arguments: torch.save calls it with none", len(a))
		}
		return &dict{ordered: true}, nil
	case globalRebuild:
		return d.rebuild(a)
	}
	return nil, d.errf("REDUCE of %s is not a call torch.save of a tensor dict makes", g)
}

// rebuild checks _rebuild_tensor_v2's arguments as a plain tensor has them: (storage,
// offset, size, stride, requires_grad, an empty OrderedDict of hooks), the view inside
// its storage, the storage used by no other tensor.
func (d *decoder) rebuild(a tuple) (any, error) {
	if len(a) != 6 {
		return nil, d.errf("%s with %d arguments: a plain tensor has 6 (no metadata)", globalRebuild, len(a))
	}
	pid, ok := a[0].(persID)
	if !ok {
		return nil, d.errf("tensor without a storage reference")
	}
	off, ok1 := a[1].(int64)
	shape, ok2 := ints(a[2])
	stride, ok3 := ints(a[3])
	_, ok4 := a[4].(bool)
	hooks, ok5 := a[5].(*dict)
	if !ok1 || !ok2 || !ok3 || !ok4 || !ok5 || len(shape) != len(stride) || len(shape) > maxRank {
		return nil, d.errf("malformed tensor on storage %s", pid.key)
	}
	if !hooks.ordered || len(hooks.keys) > 0 {
		return nil, d.errf("tensor on storage %s has backward hooks: torch.save writes an empty OrderedDict", pid.key)
	}
	hooks.hooks = true
	if d.keys[pid.key] {
		return nil, d.errf("storage %s is used by two tensors", pid.key)
	}
	d.keys[pid.key] = true
	t := Tensor{DType: pid.dtype, Key: pid.key, StorageNumel: pid.numel, StorageOffset: off, Shape: shape, Stride: stride}
	if _, _, err := t.Span(); err != nil {
		return nil, d.errf("%v", err)
	}
	return &tensorV{Tensor: t}, nil
}

// setItems stores key/tensor pairs into the dict below them: string keys, each once,
// each value a tensor not stored before.
func (d *decoder) setItems(one bool) error {
	var items []any
	if one {
		v, err1 := d.pop()
		k, err2 := d.pop()
		if err1 != nil || err2 != nil {
			return d.errf("stack underflow")
		}
		items = []any{k, v}
	} else {
		var err error
		if items, err = d.popMark(); err != nil {
			return err
		}
	}
	if len(d.stack) == 0 || len(items)%2 != 0 {
		return d.errf("SETITEMS without a dict and pairs")
	}
	dt, ok := d.stack[len(d.stack)-1].(*dict)
	if !ok || dt.hooks {
		return d.errf("SETITEMS on %s: only the top-level dict of tensors holds items", describe(d.stack[len(d.stack)-1]))
	}
	for i := 0; i < len(items); i += 2 {
		k, ok := items[i].(string)
		if !ok {
			return d.errf("dict key %s is not a string", describe(items[i]))
		}
		t, ok := items[i+1].(*tensorV)
		if !ok {
			return d.errf("%s is %s, not a tensor", k, describe(items[i+1]))
		}
		if t.placed {
			return d.errf("%s is a tensor already stored under another key", k)
		}
		for _, have := range dt.keys {
			if have == k {
				return d.errf("key %s appears twice", k)
			}
		}
		t.placed = true
		dt.keys = append(dt.keys, k)
		dt.vals = append(dt.vals, t)
	}
	return nil
}

// stop returns the tensors of the dict that is the stack's only value.
func (d *decoder) stop() ([]Tensor, error) {
	if len(d.stack) != 1 || len(d.marks) != 0 {
		return nil, d.errf("STOP with %d values and %d open MARKs: want the dict alone", len(d.stack), len(d.marks))
	}
	dt, ok := d.stack[0].(*dict)
	if !ok || dt.hooks {
		return nil, d.errf("top object is %s, want a dict of tensors", describe(d.stack[0]))
	}
	out := make([]Tensor, len(dt.keys))
	for i, k := range dt.keys {
		out[i] = dt.vals[i].Tensor
		out[i].Name = k
	}
	return out, nil
}

func ints(v any) ([]int64, bool) {
	t, ok := v.(tuple)
	if !ok {
		return nil, false
	}
	out := make([]int64, len(t))
	for i, x := range t {
		n, ok := x.(int64)
		if !ok || n < 0 {
			return nil, false
		}
		out[i] = n
	}
	return out, true
}

// describe names a decoded value's kind for messages (never its content: it may be huge
// or hostile).
func describe(v any) string {
	switch x := v.(type) {
	case global:
		return string(x)
	case storage:
		return "torch." + string(x)
	case *dict:
		if x.hooks {
			return "a tensor's hooks"
		}
		return "a dict"
	case *tensorV:
		return "a tensor"
	case tuple:
		return fmt.Sprintf("a tuple of %d", len(x))
	case persID:
		return "a storage"
	case string:
		return "a string"
	case int64:
		return "an integer"
	case bool:
		return "a bool"
	}
	return fmt.Sprintf("%T", v)
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
