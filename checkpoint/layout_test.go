package checkpoint

import (
	"path/filepath"
	"testing"
)

func TestOutputPathGroupsSamplesByTwoThousand(t *testing.T) {
	for _, tc := range []struct {
		sample int
		want   string
	}{
		{0, "rows_0-2000/data_0.safetensors"},
		{1999, "rows_0-2000/data_1999.safetensors"},
		{2000, "rows_2000-4000/data_2000.safetensors"},
		{18421, "rows_18000-20000/data_18421.safetensors"},
		{37311, "rows_36000-38000/data_37311.safetensors"},
	} {
		if got := OutputPath("/out", tc.sample); got != filepath.Join("/out", tc.want) {
			t.Errorf("OutputPath(%d) = %s, want /out/%s", tc.sample, got, tc.want)
		}
	}
}

func TestTempPathIsHiddenAndDeterministic(t *testing.T) {
	final := OutputPath("/out", 12)
	want := "/out/rows_0-2000/.data_12.safetensors.tmp"
	if got := tempPath(final); got != want || tempPath(final) != got {
		t.Fatalf("tempPath = %s, want %s every time", got, want)
	}
	if !isTempName(filepath.Base(want)) {
		t.Fatalf("isTempName(%s) = false", filepath.Base(want))
	}
}

func TestParseDataNameAcceptsOnlyCanonicalNames(t *testing.T) {
	for _, tc := range []struct {
		name   string
		sample int
		ok     bool
	}{
		{"data_0.safetensors", 0, true},
		{"data_18421.safetensors", 18421, true},
		{"data_007.safetensors", 0, false},
		{"data_-1.safetensors", 0, false},
		{"data_1.safetensors.tmp", 0, false},
		{".data_1.safetensors.tmp", 0, false},
		{"data_.safetensors", 0, false},
		{"notes.txt", 0, false},
	} {
		s, ok := parseDataName(tc.name)
		if ok != tc.ok || s != tc.sample {
			t.Errorf("parseDataName(%q) = %d, %v; want %d, %v", tc.name, s, ok, tc.sample, tc.ok)
		}
	}
}
