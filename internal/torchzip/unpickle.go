package torchzip

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/big"
)

// The decoder's values.
type (
	global  string // "module.name"
	tuple   []any
	list    []any
	mark    struct{}
	persID  tuple
	dict    struct{ keys, vals []any }
	tensorV Tensor
)

// DecodeDict reads a data.pkl that holds a dict (or OrderedDict) of tensors and returns
// them in the pickle's order. It runs no code: it knows the few globals torch's
// weights_only loader allows for dense tensors and refuses anything else.
func DecodeDict(p []byte) ([]Tensor, error) {
	var stack []any
	var marks []int
	memo := map[uint32]any{}
	pos := 0
	need := func(n int) ([]byte, error) {
		if n < 0 || pos+n > len(p) {
			return nil, errors.New("pickle: truncated")
		}
		s := p[pos : pos+n]
		pos += n
		return s, nil
	}
	line := func() (string, error) {
		for i := pos; i < len(p); i++ {
			if p[i] == '\n' {
				s := string(p[pos:i])
				pos = i + 1
				return s, nil
			}
		}
		return "", errors.New("pickle: truncated")
	}
	pop := func() (any, error) {
		if len(stack) == 0 {
			return nil, errors.New("pickle: stack underflow")
		}
		v := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		return v, nil
	}
	popMark := func() ([]any, error) {
		if len(marks) == 0 {
			return nil, errors.New("pickle: no mark")
		}
		m := marks[len(marks)-1]
		marks = marks[:len(marks)-1]
		items := append([]any(nil), stack[m:]...)
		stack = stack[:m]
		return items, nil
	}
	for {
		op, err := need(1)
		if err != nil {
			return nil, err
		}
		switch op[0] {
		case 0x80: // PROTO
			if _, err := need(1); err != nil {
				return nil, err
			}
		case 0x95: // FRAME (protocol 4)
			if _, err := need(8); err != nil {
				return nil, err
			}
		case '}':
			stack = append(stack, &dict{})
		case ']':
			stack = append(stack, &list{})
		case ')':
			stack = append(stack, tuple{})
		case '(':
			marks = append(marks, len(stack))
		case 'N':
			stack = append(stack, nil)
		case 0x88:
			stack = append(stack, true)
		case 0x89:
			stack = append(stack, false)
		case 'K':
			b, err := need(1)
			if err != nil {
				return nil, err
			}
			stack = append(stack, int64(b[0]))
		case 'M':
			b, err := need(2)
			if err != nil {
				return nil, err
			}
			stack = append(stack, int64(binary.LittleEndian.Uint16(b)))
		case 'J':
			b, err := need(4)
			if err != nil {
				return nil, err
			}
			stack = append(stack, int64(int32(binary.LittleEndian.Uint32(b))))
		case 0x8a: // LONG1
			nb, err := need(1)
			if err != nil {
				return nil, err
			}
			b, err := need(int(nb[0]))
			if err != nil {
				return nil, err
			}
			v, err := decodeLong(b)
			if err != nil {
				return nil, err
			}
			stack = append(stack, v)
		case 'G': // BINFLOAT
			b, err := need(8)
			if err != nil {
				return nil, err
			}
			stack = append(stack, math.Float64frombits(binary.BigEndian.Uint64(b)))
		case 'X', 0x8c, 0x8d, 'U', 'T': // BINUNICODE, SHORT_BINUNICODE, BINUNICODE8, SHORT_BINSTRING, BINSTRING
			var n int
			switch op[0] {
			case 'X', 'T':
				b, err := need(4)
				if err != nil {
					return nil, err
				}
				n = int(binary.LittleEndian.Uint32(b))
			case 0x8c, 'U':
				b, err := need(1)
				if err != nil {
					return nil, err
				}
				n = int(b[0])
			case 0x8d:
				b, err := need(8)
				if err != nil {
					return nil, err
				}
				if v := binary.LittleEndian.Uint64(b); v > uint64(len(p)) {
					return nil, errors.New("pickle: string too long")
				} else {
					n = int(v)
				}
			}
			s, err := need(n)
			if err != nil {
				return nil, err
			}
			stack = append(stack, string(s))
		case 'c': // GLOBAL
			mod, err := line()
			if err != nil {
				return nil, err
			}
			name, err := line()
			if err != nil {
				return nil, err
			}
			stack = append(stack, global(mod+"."+name))
		case 0x93: // STACK_GLOBAL
			name, err1 := pop()
			mod, err2 := pop()
			ms, ok1 := mod.(string)
			ns, ok2 := name.(string)
			if err1 != nil || err2 != nil || !ok1 || !ok2 {
				return nil, errors.New("pickle: bad STACK_GLOBAL")
			}
			stack = append(stack, global(ms+"."+ns))
		case 'q', 'r', 0x94: // BINPUT, LONG_BINPUT, MEMOIZE
			var k uint32
			switch op[0] {
			case 'q':
				b, err := need(1)
				if err != nil {
					return nil, err
				}
				k = uint32(b[0])
			case 'r':
				b, err := need(4)
				if err != nil {
					return nil, err
				}
				k = binary.LittleEndian.Uint32(b)
			default:
				k = uint32(len(memo))
			}
			if len(stack) == 0 {
				return nil, errors.New("pickle: memo of empty stack")
			}
			memo[k] = stack[len(stack)-1]
		case 'h', 'j': // BINGET, LONG_BINGET
			var k uint32
			if op[0] == 'h' {
				b, err := need(1)
				if err != nil {
					return nil, err
				}
				k = uint32(b[0])
			} else {
				b, err := need(4)
				if err != nil {
					return nil, err
				}
				k = binary.LittleEndian.Uint32(b)
			}
			v, ok := memo[k]
			if !ok {
				return nil, fmt.Errorf("pickle: memo %d unset", k)
			}
			stack = append(stack, v)
		case 't':
			items, err := popMark()
			if err != nil {
				return nil, err
			}
			stack = append(stack, tuple(items))
		case 0x85, 0x86, 0x87: // TUPLE1..3
			n := int(op[0]-0x85) + 1
			if len(stack) < n {
				return nil, errors.New("pickle: stack underflow")
			}
			t := append(tuple(nil), stack[len(stack)-n:]...)
			stack = append(stack[:len(stack)-n], t)
		case 'Q': // BINPERSID
			v, err := pop()
			if err != nil {
				return nil, err
			}
			t, ok := v.(tuple)
			if !ok {
				return nil, errors.New("pickle: persistent id is not a tuple")
			}
			stack = append(stack, persID(t))
		case 'R': // REDUCE
			args, err1 := pop()
			fn, err2 := pop()
			if err1 != nil || err2 != nil {
				return nil, errors.New("pickle: stack underflow")
			}
			v, err := reduce(fn, args)
			if err != nil {
				return nil, err
			}
			stack = append(stack, v)
		case 'b': // BUILD: state of an OrderedDict or tensor metadata; nothing extract needs
			if _, err := pop(); err != nil {
				return nil, err
			}
		case 's', 'u': // SETITEM, SETITEMS
			var items []any
			if op[0] == 's' {
				if len(stack) < 2 {
					return nil, errors.New("pickle: stack underflow")
				}
				items = append(items, stack[len(stack)-2:]...)
				stack = stack[:len(stack)-2]
			} else if items, err = popMark(); err != nil {
				return nil, err
			}
			if len(stack) == 0 || len(items)%2 != 0 {
				return nil, errors.New("pickle: bad SETITEMS")
			}
			d, ok := stack[len(stack)-1].(*dict)
			if !ok {
				return nil, errors.New("pickle: SETITEMS on a non-dict")
			}
			for i := 0; i < len(items); i += 2 {
				d.keys = append(d.keys, items[i])
				d.vals = append(d.vals, items[i+1])
			}
		case 'a', 'e': // APPEND, APPENDS
			var items []any
			if op[0] == 'a' {
				v, err := pop()
				if err != nil {
					return nil, err
				}
				items = []any{v}
			} else if items, err = popMark(); err != nil {
				return nil, err
			}
			if len(stack) == 0 {
				return nil, errors.New("pickle: stack underflow")
			}
			l, ok := stack[len(stack)-1].(*list)
			if !ok {
				return nil, errors.New("pickle: APPENDS on a non-list")
			}
			*l = append(*l, items...)
		case '.':
			v, err := pop()
			if err != nil {
				return nil, err
			}
			d, ok := v.(*dict)
			if !ok {
				return nil, fmt.Errorf("pickle: top object is %T, want a dict of tensors", v)
			}
			out := make([]Tensor, 0, len(d.keys))
			for i, k := range d.keys {
				name, ok := k.(string)
				if !ok {
					return nil, fmt.Errorf("pickle: dict key %v is not a string", k)
				}
				t, ok := d.vals[i].(tensorV)
				if !ok {
					return nil, fmt.Errorf("pickle: %s is not a tensor (%T)", name, d.vals[i])
				}
				t.Name = name
				out = append(out, Tensor(t))
			}
			return out, nil
		default:
			return nil, fmt.Errorf("pickle: opcode 0x%02x at %d is outside what extract reads", op[0], pos-1)
		}
	}
}

func decodeLong(b []byte) (int64, error) {
	if len(b) > 8 {
		// Two's complement beyond 64 bits: only sign extension may follow.
		v := new(big.Int)
		rev := make([]byte, len(b))
		for i := range b {
			rev[len(b)-1-i] = b[i]
		}
		v.SetBytes(rev)
		if b[len(b)-1]&0x80 != 0 || !v.IsInt64() {
			return 0, errors.New("pickle: integer out of range")
		}
		return v.Int64(), nil
	}
	var x uint64
	for i := len(b) - 1; i >= 0; i-- {
		x = x<<8 | uint64(b[i])
	}
	if len(b) > 0 && len(b) < 8 && b[len(b)-1]&0x80 != 0 {
		x |= ^uint64(0) << (8 * len(b))
	}
	return int64(x), nil
}

func ints(v any) ([]int64, bool) {
	t, ok := v.(tuple)
	if !ok {
		return nil, false
	}
	out := make([]int64, len(t))
	for i, x := range t {
		n, ok := x.(int64)
		if !ok {
			return nil, false
		}
		out[i] = n
	}
	return out, true
}

// reduce applies the only callables a tensor dict needs.
func reduce(fn, args any) (any, error) {
	g, ok := fn.(global)
	a, ok2 := args.(tuple)
	if !ok || !ok2 {
		return nil, fmt.Errorf("pickle: REDUCE of %v", fn)
	}
	switch g {
	case "collections.OrderedDict":
		return &dict{}, nil
	case "torch._utils._rebuild_tensor_v2", "torch._utils._rebuild_tensor":
		if len(a) < 4 {
			return nil, fmt.Errorf("pickle: %s with %d args", g, len(a))
		}
		pid, ok := a[0].(persID)
		if !ok || len(pid) != 5 || pid[0] != "storage" {
			return nil, errors.New("pickle: tensor without a storage")
		}
		st, ok1 := pid[1].(global)
		key, ok2 := pid[2].(string)
		numel, ok3 := pid[4].(int64)
		off, ok4 := a[1].(int64)
		shape, ok5 := ints(a[2])
		stride, ok6 := ints(a[3])
		if !ok1 || !ok2 || !ok3 || !ok4 || !ok5 || !ok6 || len(shape) != len(stride) {
			return nil, errors.New("pickle: malformed tensor")
		}
		mod, name := string(st)[:min(len(st), 6)], string(st)[min(len(st), 6):]
		if mod != "torch." || DType(name).Size() == 0 {
			return nil, fmt.Errorf("pickle: storage type %s is outside what extract reads", st)
		}
		return tensorV{DType: DType(name), Key: key, StorageNumel: numel, StorageOffset: off, Shape: shape, Stride: stride}, nil
	}
	return nil, fmt.Errorf("pickle: call of %s is outside what extract reads", g)
}
