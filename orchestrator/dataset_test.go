package orchestrator

import (
	"os"
	"path/filepath"
	"testing"
)

// writeDataset writes body as a JSONL dataset and returns its path.
func writeDataset(t *testing.T, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "data.jsonl")
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}
