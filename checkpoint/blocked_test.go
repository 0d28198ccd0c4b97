package checkpoint

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// Something at an output's path that the mover may not replace is a BlockedError naming
// the path (the sample's failure), not a disk error to retry: a directory at the final
// name, a directory at the temp name, a file where the rows_ directory belongs, and (as
// root, with chattr) an immutable file.
func TestAnOutputPathHeldByWhatTheMoverMayNotReplaceIsBlocked(t *testing.T) {
	for _, tc := range []struct {
		name  string
		block func(t *testing.T, out string) string // returns the path the error must name
	}{
		{"a directory at the final name", func(t *testing.T, out string) string {
			p := OutputPath(out, 3)
			mustMkdir(t, filepath.Join(p, "keep"))
			return p
		}},
		{"a directory at the temp name", func(t *testing.T, out string) string {
			p := tempPath(OutputPath(out, 3))
			mustMkdir(t, filepath.Join(p, "keep"))
			return p
		}},
		{"a file where rows_ belongs", func(t *testing.T, out string) string {
			p := filepath.Dir(OutputPath(out, 3))
			mustMkdir(t, out)
			if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
				t.Fatal(err)
			}
			return p
		}},
		{"an immutable file at the final name", func(t *testing.T, out string) string {
			p := OutputPath(out, 3)
			mustMkdir(t, filepath.Dir(p))
			if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
				t.Fatal(err)
			}
			if out, err := exec.Command("chattr", "+i", p).CombinedOutput(); err != nil {
				t.Skipf("chattr +i (needs root and a filesystem with the flag): %v %s", err, out)
			}
			t.Cleanup(func() { _ = exec.Command("chattr", "-i", p).Run() })
			return p
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, shm := t.TempDir(), t.TempDir()
			path := tc.block(t, out)
			m := &Mover{OutputDir: out}
			_, err := m.moveFile(context.Background(), writeDump(t, shm, dumpSpec{sample: 3}), expectFor(3, 5))
			var blocked *BlockedError
			if !errors.As(err, &blocked) || blocked.Path != path {
				t.Fatalf("Move = %v, want a BlockedError naming %s", err, path)
			}
		})
	}
}

func mustMkdir(t *testing.T, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
}
