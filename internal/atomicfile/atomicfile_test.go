package atomicfile

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestWriteFileReplacesTheFileAndLeavesNoTemp(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "run.json")
	for _, body := range []string{"first", "second"} {
		if err := WriteFile(path, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		if b, _ := os.ReadFile(path); string(b) != body {
			t.Fatalf("file holds %q, want %q", b, body)
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("dir holds %d entries, want only run.json", len(entries))
	}
	err := WriteFile(filepath.Join(dir, "missing", "x"), nil, 0o644)
	if err == nil || !strings.Contains(err.Error(), "missing") {
		t.Errorf("write into a missing dir: %v, want an error naming the path", err)
	}
}

func TestMkdirAllCreatesMissingParents(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "out", "rows_0-2000")
	if err := MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		t.Fatalf("stat %s: %v", dir, err)
	}
	if err := MkdirAll(dir, 0o755); err != nil {
		t.Fatalf("second MkdirAll: %v", err)
	}
}
