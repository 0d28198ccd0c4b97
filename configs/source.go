package configs

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"os"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/go-viper/mapstructure/v2"
	"github.com/spf13/viper"
	"go.yaml.in/yaml/v3"
)

// keyError is a problem with one key's value. Load prefixes it with where the value came
// from (file:line, env variable, flag), so the operator edits the right place: an env
// override blamed on the YAML file sends them to a file that is right.
type keyError struct{ key, msg string }

func (e keyError) Error() string { return e.key + ": " + e.msg }

// fileKey is where a key is written in the config file.
type fileKey struct {
	line  int
	value string // the value as written, for a key that has one
}

// origin says, for each key, which of flag, env and file gave its value (viper's order
// of precedence) and what that value was as written.
type origin struct {
	file   string
	keys   map[string]fileKey
	flags  []Flag
	lookup func(string) (string, bool)
}

// where names the source of key's value and the value as written there; ok is false
// when the key kept its default.
func (o origin) where(key string) (src, raw string, ok bool) {
	for _, f := range o.flags {
		if f.Key == key && f.Flag.Changed {
			return "flag --" + f.Flag.Name + "=" + f.Flag.Value.String(), f.Flag.Value.String(), true
		}
	}
	if v, ok := o.lookup(EnvName(key)); ok {
		return "env " + EnvName(key) + "=" + v, v, true
	}
	if k, ok := o.keys[key]; ok {
		return fmt.Sprintf("%s:%d", o.file, k.line), k.value, true
	}
	return "", "", false
}

// explain prefixes each keyError in err (one or joined) with its source and makes sure
// the value is in the message; other errors get the config's name, as before.
func (o origin) explain(err error) error {
	var list []error
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		list = j.Unwrap()
	} else {
		list = []error{err}
	}
	// File errors in the order of the file's lines, then the rest as they came.
	line := func(e error) int {
		var ke keyError
		if errors.As(e, &ke) {
			if k, ok := o.keys[ke.key]; ok {
				return k.line
			}
		}
		return math.MaxInt
	}
	list = slices.Clone(list)
	slices.SortStableFunc(list, func(a, b error) int { return cmp.Compare(line(a), line(b)) })
	out := make([]error, 0, len(list))
	for _, e := range list {
		var ke keyError
		if !errors.As(e, &ke) {
			out = append(out, fmt.Errorf("%s: %w", describe(o.file), e))
			continue
		}
		src, raw, ok := o.where(ke.key)
		if !ok {
			out = append(out, fmt.Errorf("%s: %w", describe(o.file), e))
			continue
		}
		msg := ke.msg
		if raw != "" && !strings.Contains(msg, raw) {
			msg += fmt.Sprintf(" (value %q)", raw)
		}
		out = append(out, fmt.Errorf("%s: %s: %s", src, ke.key, msg))
	}
	return errors.Join(out...)
}

// keyShape is what the Config struct allows: its leaf keys with their types, and the
// sections that hold them.
type keyShape struct {
	leaves   map[string]reflect.Type
	sections map[string]bool
}

func shapeOf(c Config) keyShape {
	s := keyShape{leaves: map[string]reflect.Type{}, sections: map[string]bool{}}
	for key, val := range flatten(c) {
		s.leaves[key] = reflect.TypeOf(val)
		for i := strings.IndexByte(key, '.'); i >= 0; i = nextDot(key, i) {
			s.sections[key[:i]] = true
		}
	}
	return s
}

func nextDot(s string, i int) int {
	j := strings.IndexByte(s[i+1:], '.')
	if j < 0 {
		return -1
	}
	return i + 1 + j
}

// nearest is the known key (leaf or section) closest to key, "" when none is close
// enough to be the one meant. A key written under the wrong section (port at the top
// level) finds the leaf of the same name elsewhere.
func (s keyShape) nearest(key string) string {
	best, bestD := "", math.MaxInt
	consider := func(cand string) {
		d := editDistance(key, cand)
		if last(key) == last(cand) {
			d = min(d, 1)
		}
		if d < bestD || d == bestD && cand < best {
			best, bestD = cand, d
		}
	}
	for k := range s.leaves {
		consider(k)
	}
	for k := range s.sections {
		consider(k)
	}
	if bestD <= max(2, len(last(key))/3) {
		return best
	}
	return ""
}

// under lists the keys directly inside section ("" for the top level).
func (s keyShape) under(section string) []string {
	prefix := ""
	if section != "" {
		prefix = section + "."
	}
	set := map[string]bool{}
	for _, keys := range []map[string]bool{s.sections, leafSet(s.leaves)} {
		for k := range keys {
			if rest, ok := strings.CutPrefix(k, prefix); ok && !strings.Contains(rest, ".") {
				set[rest] = true
			}
		}
	}
	out := make([]string, 0, len(set))
	for k := range set {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func leafSet(m map[string]reflect.Type) map[string]bool {
	out := make(map[string]bool, len(m))
	for k := range m {
		out[k] = true
	}
	return out
}

func last(key string) string { return key[strings.LastIndexByte(key, '.')+1:] }

// readFileKeys finds the line of every key in the config file and refuses a key that
// names nothing, at any depth, with the nearest valid key: mapstructure's own text
// ("” has invalid keys: servr") names neither the place nor the fix.
func readFileKeys(file string, data []byte, shape keyShape) (map[string]fileKey, []error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, []error{fmt.Errorf("%s: %v", file, err)}
	}
	keys := map[string]fileKey{}
	var errs []error
	var walk func(n *yaml.Node, section string)
	walk = func(n *yaml.Node, section string) {
		for n != nil && (n.Kind == yaml.DocumentNode || n.Kind == yaml.AliasNode) {
			if n.Kind == yaml.AliasNode {
				n = n.Alias
			} else if len(n.Content) > 0 {
				n = n.Content[0]
			} else {
				return
			}
		}
		if n == nil || n.Kind != yaml.MappingNode {
			return
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			name := strings.ToLower(k.Value)
			if name == "<<" { // a YAML merge key: its entries are checked where they are defined
				continue
			}
			key := name
			if section != "" {
				key = section + "." + name
			}
			switch {
			case shape.leaves[key] != nil:
				keys[key] = fileKey{line: k.Line, value: written(v)}
			case shape.sections[key]:
				keys[key] = fileKey{line: k.Line}
				if v.Kind == yaml.ScalarNode && v.Tag != "!!null" || v.Kind == yaml.SequenceNode {
					errs = append(errs, fmt.Errorf("%s:%d: %s is a section (keys %s), got %q", file, k.Line, key, strings.Join(shape.under(key), ", "), written(v)))
					continue
				}
				walk(v, key)
			default:
				msg := fmt.Sprintf("%s:%d: unknown key %s", file, k.Line, key)
				if near := shape.nearest(key); near != "" {
					msg += "; did you mean " + near + "?"
				} else {
					where := "at the top level"
					if section != "" {
						where = "in " + section
					}
					msg += fmt.Sprintf(" (the keys %s: %s)", where, strings.Join(shape.under(section), ", "))
				}
				errs = append(errs, errors.New(msg))
			}
		}
	}
	walk(&doc, "")
	return keys, errs
}

// written is a YAML value as the file spells it, for messages.
func written(n *yaml.Node) string {
	switch n.Kind {
	case yaml.ScalarNode:
		return n.Value
	case yaml.SequenceNode:
		parts := make([]string, len(n.Content))
		for i, c := range n.Content {
			parts[i] = written(c)
		}
		return "[" + strings.Join(parts, ", ") + "]"
	case yaml.AliasNode:
		if n.Alias != nil {
			return written(n.Alias)
		}
	}
	return ""
}

// decodeHook turns what YAML, env and flags give (strings, numbers, lists) into the
// Config's types.
func decodeHook() mapstructure.DecodeHookFunc {
	return mapstructure.ComposeDecodeHookFunc(
		durationHook,
		mapstructure.StringToWeakSliceHookFunc(","),
		byteSizeHook,
	)
}

// durationHook parses durations such as "90s" or "1h30m". A bare number is refused
// (but 0): decoded as is it would be nanoseconds, so `startup_timeout: 300` meant as
// seconds would give up after 300ns.
func durationHook(_, to reflect.Type, data any) (any, error) {
	if to != reflect.TypeOf(time.Duration(0)) {
		return data, nil
	}
	switch v := data.(type) {
	case time.Duration:
		return v, nil
	case string:
		d, err := time.ParseDuration(strings.TrimSpace(v))
		if err != nil {
			return nil, fmt.Errorf("duration %q: want a number with a unit, e.g. 90s, 5m, 1h30m", v)
		}
		return d, nil
	case int, int64, uint64, float64:
		if reflect.ValueOf(v).IsZero() {
			return time.Duration(0), nil
		}
		return nil, fmt.Errorf("duration %v has no unit: write e.g. %vs or %vm", v, v, v)
	}
	return data, nil
}

// decodeKeys decodes every key on its own, so that a value of the wrong type is one
// error naming its key, its value and where it came from, not mapstructure's text
// about the whole struct.
func decodeKeys(v *viper.Viper, shape keyShape) []error {
	var errs []error
	for key, t := range shape.leaves {
		raw := v.Get(key)
		if raw == nil {
			continue
		}
		out := reflect.New(t)
		dec, err := mapstructure.NewDecoder(&mapstructure.DecoderConfig{
			Result: out.Interface(), WeaklyTypedInput: true, DecodeHook: decodeHook(),
		})
		if err != nil {
			return []error{err}
		}
		if err := dec.Decode(raw); err != nil {
			errs = append(errs, keyError{key, describeDecodeError(err, t, raw)})
		}
	}
	slices.SortFunc(errs, func(a, b error) int { return strings.Compare(a.Error(), b.Error()) })
	return errs
}

// describeDecodeError says what the key wants: a hook's own message when it has one
// (sizes, durations), else the type in words.
func describeDecodeError(err error, t reflect.Type, raw any) string {
	switch t {
	case reflect.TypeOf(time.Duration(0)):
		if _, herr := durationHook(nil, t, raw); herr != nil {
			return herr.Error()
		}
	case reflect.TypeOf(ByteSize(0)):
		if _, herr := byteSizeHook(nil, t, raw); herr != nil {
			return herr.Error()
		}
	}
	want := map[reflect.Kind]string{
		reflect.Int: "an integer", reflect.Int64: "an integer", reflect.Float64: "a number",
		reflect.Bool: "true or false", reflect.String: "a string", reflect.Slice: "a list",
		reflect.Map: "a map of names to values",
	}[t.Kind()]
	if want == "" {
		return err.Error()
	}
	return fmt.Sprintf("want %s, got %s", want, shown(raw))
}

func shown(raw any) string {
	if s, ok := raw.(string); ok {
		return fmt.Sprintf("%q", s)
	}
	return fmt.Sprint(raw)
}

// newOrigin reads the config file's key positions (and its key errors) for Load.
func newOrigin(file string, flags []Flag) (origin, []error) {
	o := origin{file: file, flags: flags, lookup: os.LookupEnv, keys: map[string]fileKey{}}
	if file == "" {
		return o, nil
	}
	data, err := os.ReadFile(file)
	if err != nil {
		return o, []error{fmt.Errorf("read %s: %v", file, err)}
	}
	keys, errs := readFileKeys(file, data, shapeOf(Default()))
	if keys != nil {
		o.keys = keys
	}
	return o, errs
}
