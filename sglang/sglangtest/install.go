// Package sglangtest builds SGLang installs for tests: a real Python package named
// sglang, with no server in it, installed as pip installs a wheel (RECORD and all) or
// checked out in a git work tree, so that InspectInstall's probe and audit run for real.
package sglangtest

import (
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// Files is a small sglang package: enough for `import sglang` and for an audit to
// have files under sglang/srt to check, among them a seam module and the model file
// that the incident's hand patch edited.
func Files(version string) map[string]string {
	return map[string]string{
		"sglang/__init__.py":                        fmt.Sprintf("__version__ = %q\n", version),
		"sglang/srt/__init__.py":                    "",
		"sglang/srt/models/__init__.py":             "",
		"sglang/srt/models/deepseek_v2.py":          "class DeepseekV2ForCausalLM:\n    pass\n",
		"sglang/srt/layers/__init__.py":             "",
		"sglang/srt/layers/logits_processor.py":     "class LogitsProcessor:\n    pass\n",
		"sglang/lang/__init__.py":                   "",
		"sglang/lang/interpreter.py":                "# outside sglang/srt: not audited\n",
		"sglang/srt/model_executor/__init__.py":     "",
		"sglang/srt/model_executor/model_runner.py": "class ModelRunner:\n    pass\n",
		// The one seam the fake supports, as SGLang's ScheduleBatch has it since #25516.
		"sglang/srt/managers/__init__.py":       "",
		"sglang/srt/managers/schedule_batch.py": scheduleBatch,
	}
}

const scheduleBatch = `import dataclasses


class Req:
    def __init__(self, ids):
        self.origin_input_ids = ids


@dataclasses.dataclass
class ScheduleBatch:
    reqs: list
`

func write(t testing.TB, root string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		p := filepath.Join(root, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// Wheel installs files into a new site folder as pip installs a wheel: the files, and
// sglang-<version>.dist-info with METADATA, INSTALLER and a RECORD of every file's
// sha256 (urlsafe base64, no padding) and size. Put the folder on PYTHONPATH.
func Wheel(t testing.TB, version string, files map[string]string) (site string) {
	t.Helper()
	site = t.TempDir()
	write(t, site, files)
	dist := fmt.Sprintf("sglang-%s.dist-info", version)
	write(t, site, map[string]string{
		dist + "/METADATA":  fmt.Sprintf("Metadata-Version: 2.1\nName: sglang\nVersion: %s\n", version),
		dist + "/INSTALLER": "pip\n",
	})
	names := make([]string, 0, len(files)+3)
	for name := range files {
		names = append(names, name)
	}
	names = append(names, dist+"/METADATA", dist+"/INSTALLER")
	slices.Sort(names)
	var record strings.Builder
	for _, name := range names {
		b, err := os.ReadFile(filepath.Join(site, filepath.FromSlash(name)))
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(b)
		fmt.Fprintf(&record, "%s,sha256=%s,%d\n", name, base64.RawURLEncoding.EncodeToString(sum[:]), len(b))
	}
	// As pip writes them: bytecode with no hash, RECORD itself with neither.
	fmt.Fprintf(&record, "sglang/srt/__pycache__/__init__.cpython-311.pyc,,\n%s/RECORD,,\n", dist)
	write(t, site, map[string]string{dist + "/RECORD": record.String()})
	return site
}

// Checkout commits files under python/ in a new git repository, as SGLang's own
// repository lays them out, and returns the repository and the folder to put on
// PYTHONPATH (root/python). HEAD is the returned commit.
func Checkout(t testing.TB, files map[string]string) (root, pythonDir, head string) {
	t.Helper()
	if _, err := exec.LookPath("git"); err != nil {
		t.Skipf("no git: %v", err)
	}
	root = t.TempDir()
	pythonDir = filepath.Join(root, "python")
	write(t, pythonDir, files)
	write(t, root, map[string]string{".gitignore": "__pycache__/\n*.pyc\n"})
	Git(t, root, "init", "-q")
	Git(t, root, "add", "-A")
	Git(t, root, "commit", "-q", "-m", "sglang")
	head = strings.TrimSpace(Git(t, root, "rev-parse", "HEAD"))
	return root, pythonDir, head
}

// Git runs git in dir with a fixed identity and none of the user's config.
func Git(t testing.TB, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", append([]string{"-C", dir}, args...)...)
	cmd.Env = append(os.Environ(), "GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_NOSYSTEM=1",
		"GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@example.com", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@example.com")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %v: %v\n%s", args, err, out)
	}
	return string(out)
}
