package torchzip

import (
	"fmt"
	"math"
	"strings"
)

// The shape checks of the decoder: which globals, calls, storages and dict items a plain
// torch.save of a tensor dict has.

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
