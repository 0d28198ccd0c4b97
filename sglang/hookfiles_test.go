package sglang

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestHookSitecustomizeRunsTheOneItShadows puts the installed hook first on PYTHONPATH
// and another sitecustomize.py after it, as a conda env or Debian has: Python imports only
// the first, so ours must run the other, armed or not.
func TestHookSitecustomizeRunsTheOneItShadows(t *testing.T) {
	python, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 is not on PATH")
	}
	hook, site := filepath.Join(t.TempDir(), "hook"), t.TempDir()
	if err := InstallHook(hook); err != nil {
		t.Fatal(err)
	}
	marker := filepath.Join(t.TempDir(), "ran")
	if err := os.WriteFile(filepath.Join(site, "sitecustomize.py"), []byte("import os\nopen(os.environ['MARKER'], 'a').write('x')\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, armed := range []bool{false, true} {
		os.Remove(marker)
		cmd := exec.Command(python, "-c", "import sitecustomize, sys; print(sitecustomize.__file__)")
		cmd.Env = append(hookTestEnv(), "PYTHONPATH="+hook+":"+site, "MARKER="+marker)
		if armed {
			cmd.Env = append(cmd.Env, "SGLANG_HS_DIR="+t.TempDir(), "SGLANG_HS_LAYERS=2,30,58")
		}
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("armed=%v: python3: %v\n%s", armed, err, out)
		}
		if !strings.HasPrefix(string(out), hook) {
			t.Fatalf("armed=%v: python imported %s, want the hook's sitecustomize first", armed, out)
		}
		if b, err := os.ReadFile(marker); err != nil || string(b) != "x" {
			t.Fatalf("armed=%v: the shadowed sitecustomize.py ran %q times (%v), want once\n%s", armed, b, err, out)
		}
	}
}
