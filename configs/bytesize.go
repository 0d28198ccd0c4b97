package configs

import (
	"fmt"
	"math"
	"reflect"
	"strconv"
	"strings"
)

// ByteSize is a size in bytes that config accepts as plain bytes or with a unit:
// "500GiB", "1.5TB", "64m".
type ByteSize int64

var units = []struct {
	suffix string
	mult   float64
}{
	{"kib", 1 << 10}, {"mib", 1 << 20}, {"gib", 1 << 30}, {"tib", 1 << 40},
	{"kb", 1e3}, {"mb", 1e6}, {"gb", 1e9}, {"tb", 1e12},
	{"k", 1 << 10}, {"m", 1 << 20}, {"g", 1 << 30}, {"t", 1 << 40},
	{"b", 1},
}

// ParseByteSize parses a size such as "1073741824", "100GiB" or "1.5 TB".
func ParseByteSize(s string) (ByteSize, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	mult := 1.0
	for _, u := range units {
		if strings.HasSuffix(t, u.suffix) {
			t, mult = strings.TrimSpace(strings.TrimSuffix(t, u.suffix)), u.mult
			break
		}
	}
	f, err := strconv.ParseFloat(t, 64)
	if err != nil || f < 0 {
		return 0, fmt.Errorf("size %q: want bytes or a number with a unit (KiB, MiB, GiB, TiB, KB, MB, GB, TB)", s)
	}
	return fromFloat(f*mult, s)
}

// fromFloat refuses what ByteSize cannot hold: converting NaN, ±Inf or a float past
// int64 to an integer gives an arbitrary value in Go, not an error.
func fromFloat(f float64, orig any) (ByteSize, error) {
	if math.IsNaN(f) || f < 0 || f > maxByteSize {
		return 0, fmt.Errorf("size %v: want 0..%d bytes", orig, int64(maxByteSize))
	}
	return ByteSize(f), nil
}

func (b ByteSize) String() string {
	v := float64(b)
	for _, u := range []string{"B", "KiB", "MiB", "GiB", "TiB"} {
		if v < 1024 || u == "TiB" {
			if u == "B" {
				return fmt.Sprintf("%d B", int64(b))
			}
			return fmt.Sprintf("%.1f %s", v, u)
		}
		v /= 1024
	}
	return ""
}

func byteSizeHook(from, to reflect.Type, data any) (any, error) {
	if to != reflect.TypeOf(ByteSize(0)) {
		return data, nil
	}
	switch v := data.(type) {
	case string:
		return ParseByteSize(v)
	case int:
		return ByteSize(v), nil
	case int64:
		return ByteSize(v), nil
	case float64:
		return fromFloat(v, v)
	}
	return data, nil
}
