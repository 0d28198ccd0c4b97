// Package testsupport decides what a test does when this machine lacks what it needs
// (root, FUSE, torch, Slurm, ../shared): on a laptop it skips, saying why; where
// EXTRACT_CI_REQUIRE names the kind (CI, .ci/run) it fails, so that CI cannot pass with
// the power-cut, disk-full or real-torch invariants quietly unchecked. Each use is
// recorded in EXTRACT_CI_REPORT, when set, so the run can say how many of each kind ran.
package testsupport

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
)

// Kind is a capability a test needs and a machine may lack.
type Kind string

const (
	// FUSE: /dev/fuse and the right to mount it (lazyfs, the power-cut tests).
	FUSE Kind = "fuse"
	// Root: euid 0, for tmpfs mounts (disk full) and files owned by another user.
	Root Kind = "root"
	// Torch: /usr/bin/python3 imports torch (Debian's python3-torch), for files that
	// torch itself must load.
	Torch Kind = "torch"
	// Slurm: slurm-wlm and munge installed, and root to run their daemons.
	Slurm Kind = "slurm"
	// TransformersServer: a python3 that imports torch, to run extract's own server
	// (sglang/hfserver) over a tiny module.
	TransformersServer Kind = "transformers-server"
	// Chromium: a headless browser, for the HTML report's tests.
	Chromium Kind = "chromium"
	// SGLangSrc: ../shared/sglang-src, the SGLang commits the dump hook is tested against.
	SGLangSrc Kind = "sglang-src"
	// PythonJinja: a python3 that imports jinja2, for the prepare worker
	// (sglang/tokenizer) over a stand-in transformers.
	PythonJinja Kind = "python-jinja2"
)

// Kinds are every kind, in the order a report lists them.
var Kinds = []Kind{FUSE, Root, Torch, Slurm, TransformersServer, Chromium, SGLangSrc, PythonJinja}

const (
	// EnvRequire lists, comma-separated, the kinds whose tests must run here.
	EnvRequire = "EXTRACT_CI_REQUIRE"
	// EnvReport names a file each recorded test appends "<kind> <ran|skipped|failed> <n> <test>" to.
	EnvReport = "EXTRACT_CI_REPORT"
)

// Required says whether EXTRACT_CI_REQUIRE names kind.
func Required(kind Kind) bool {
	return slices.Contains(strings.Split(os.Getenv(EnvRequire), ","), string(kind))
}

// Require checks that this machine has kind. Without it the test skips with the reason,
// or fails where kind is required. Either way the outcome is recorded when t ends.
func Require(t testing.TB, kind Kind) {
	t.Helper()
	record(t, kind, 1)
	if why := probe(kind); why != "" {
		Unavailable(t, kind, "%s", why)
	}
}

// Unavailable ends a test that found out part way that kind is missing here (a mount
// refused, a daemon that did not come up): a skip, or a failure where kind is required.
func Unavailable(t testing.TB, kind Kind, format string, args ...any) {
	t.Helper()
	record(t, kind, 1)
	msg := fmt.Sprintf(format, args...)
	if Required(kind) {
		t.Fatalf("%s is required here (%s=%s) but unavailable: %s", kind, EnvRequire, os.Getenv(EnvRequire), msg)
	}
	t.Skipf("needs %s, unavailable here: %s", kind, msg)
}

// Count records that t ran n cases of kind in a suite of its own (the hook's Python
// tests against each SGLang commit), so the report counts cases, not Go tests.
func Count(t testing.TB, kind Kind, n int) {
	t.Helper()
	writeReport(kind, "ran", n, t.Name())
}

var recorded sync.Map // "<kind>\x00<test>" → true: one line per test and kind

func record(t testing.TB, kind Kind, n int) {
	if _, dup := recorded.LoadOrStore(string(kind)+"\x00"+t.Name(), true); dup {
		return
	}
	t.Cleanup(func() {
		outcome := "ran"
		switch {
		case t.Skipped():
			outcome = "skipped"
		case t.Failed():
			outcome = "failed"
		}
		writeReport(kind, outcome, n, t.Name())
	})
}

func writeReport(kind Kind, outcome string, n int, test string) {
	path := os.Getenv(EnvReport)
	if path == "" {
		return
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		fmt.Fprintf(os.Stderr, "testsupport: %s: %v\n", EnvReport, err)
		return
	}
	pkg, _ := os.Getwd()
	// One write a line: lines of test binaries running at once do not interleave.
	_, err = fmt.Fprintf(f, "%s %s %d %s/%s\n", kind, outcome, n, filepath.Base(pkg), test)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "testsupport: %s: %v\n", EnvReport, err)
	}
}

var (
	probeMu sync.Mutex
	probes  = map[Kind]string{}
)

// probe says why kind is missing here, "" when it is present; each kind is probed
// once per test binary.
func probe(kind Kind) string {
	probeMu.Lock()
	defer probeMu.Unlock()
	if why, ok := probes[kind]; ok {
		return why
	}
	why := probeOnce(kind)
	probes[kind] = why
	return why
}

func probeOnce(kind Kind) string {
	switch kind {
	case Root:
		if os.Geteuid() != 0 {
			return "not root (tmpfs mounts and other users' files need it)"
		}
	case FUSE:
		f, err := os.OpenFile("/dev/fuse", os.O_RDWR, 0)
		if err != nil {
			return fmt.Sprintf("cannot open /dev/fuse: %v", err)
		}
		if err := f.Close(); err != nil {
			return fmt.Sprintf("close /dev/fuse: %v", err)
		}
	case Torch:
		if out, err := exec.Command("/usr/bin/python3", "-c", "import torch").CombinedOutput(); err != nil {
			return fmt.Sprintf("/usr/bin/python3 cannot import torch (apt-get install python3-torch): %v %s", err, lastLine(out))
		}
	case TransformersServer:
		if TorchPython() == "" {
			return "no python3 here imports torch (apt-get install python3-torch)"
		}
	case Slurm:
		if os.Geteuid() != 0 {
			return "slurmctld and slurmd need root (SlurmUser=root)"
		}
		for _, bin := range []string{"munged", "munge", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "sinfo"} {
			if _, err := exec.LookPath(bin); err != nil {
				if _, err := os.Stat("/usr/sbin/" + bin); err != nil {
					return bin + " not installed (.ci/run installs Debian's slurm-wlm and munge)"
				}
			}
		}
	case Chromium:
		if ChromiumPath() == "" {
			return "no chromium or chromium-browser on PATH (apt-get install chromium)"
		}
	case PythonJinja:
		if out, err := exec.Command("python3", "-c", "import jinja2").CombinedOutput(); err != nil {
			return fmt.Sprintf("python3 cannot import jinja2 (apt-get install python3-jinja2): %v %s", err, lastLine(out))
		}
	case SGLangSrc:
		if SGLangSource() == "" {
			return "../shared/sglang-src (with its COMMITS file) is absent"
		}
	default:
		return fmt.Sprintf("unknown kind %q", kind)
	}
	return ""
}

// TorchPython is a python3 that imports torch: the one on PATH, else Debian's; "" when
// neither does.
func TorchPython() string {
	for _, py := range []string{"python3", "/usr/bin/python3"} {
		if path, err := exec.LookPath(py); err == nil && exec.Command(path, "-c", "import torch").Run() == nil {
			return path
		}
	}
	return ""
}

// ChromiumPath is the headless browser's path, "" when there is none.
func ChromiumPath() string {
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if path, err := exec.LookPath(name); err == nil {
			return path
		}
	}
	return ""
}

// SGLangSource is ../shared/sglang-src beside the module's root (or shared/sglang-src
// in it), "" when absent.
func SGLangSource() string {
	dir, err := os.Getwd()
	if err != nil {
		return ""
	}
	for ; ; dir = filepath.Dir(dir) {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			for _, d := range []string{filepath.Join(dir, "shared", "sglang-src"), filepath.Join(dir, "..", "shared", "sglang-src")} {
				if _, err := os.Stat(filepath.Join(d, "COMMITS")); err == nil {
					return filepath.Clean(d)
				}
			}
			return ""
		}
		if filepath.Dir(dir) == dir {
			return ""
		}
	}
}

func lastLine(b []byte) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return lines[len(lines)-1]
}
