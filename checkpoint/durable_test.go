package checkpoint

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestWriteFileAtomicReplacesTheFileAndLeavesNoTemp(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "run.json")
	for _, body := range []string{"first", "second"} {
		if err := WriteFileAtomic(path, []byte(body)); err != nil {
			t.Fatal(err)
		}
		if b, _ := os.ReadFile(path); string(b) != body {
			t.Fatalf("file holds %q, want %q", b, body)
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("dir holds %d entries, want only run.json", len(entries))
	}
	err := WriteFileAtomic(filepath.Join(dir, "missing", "x"), nil)
	if err == nil || !strings.Contains(err.Error(), "missing") {
		t.Errorf("write into a missing dir: %v, want an error naming the path", err)
	}
}
