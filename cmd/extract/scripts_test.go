package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// Each of the project's scripts parses its arguments before it does anything: --help
// prints its usage and exits 0, an argument it does not take exits 2. A script that
// acted on --help (bench.sh measures, device_transformers.sh empties its work dir, the
// Slurm one starts a run) would be a trap; this runs every one of them that way.
func TestEveryScriptAnswersHelpAndRefusesAnUnknownArgument(t *testing.T) {
	var scripts []string
	for _, pat := range []string{"../../scripts/*.sh", "../../scripts/*.py", "../../scripts/*/*.sh"} {
		m, err := filepath.Glob(pat)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range m {
			abs, err := filepath.Abs(f)
			if err != nil {
				t.Fatal(err)
			}
			scripts = append(scripts, abs)
		}
	}
	if len(scripts) < 5 {
		t.Fatalf("found only %v", scripts)
	}
	python, err := exec.LookPath("python3")
	if err != nil {
		python = "/usr/bin/python3"
	}
	for _, s := range scripts {
		t.Run(filepath.Base(s), func(t *testing.T) {
			run := func(arg string) (int, string) {
				var cmd *exec.Cmd
				if strings.HasSuffix(s, ".py") {
					cmd = exec.Command(python, s, arg)
				} else {
					cmd = exec.Command("bash", s, arg)
				}
				// Whatever a script would write goes nowhere that matters if it did act.
				cmd.Dir = t.TempDir()
				cmd.Env = append(slices.Clip(os.Environ()), "BENCH_OUT="+t.TempDir(), "DEVRUN_DIR="+t.TempDir(), "PATH=/nonexistent:/usr/bin:/bin")
				out, err := cmd.CombinedOutput()
				code := 0
				if ee, ok := err.(*exec.ExitError); ok {
					code = ee.ExitCode()
				} else if err != nil {
					t.Fatal(err)
				}
				return code, string(out)
			}
			if code, out := run("--help"); code != 0 || len(strings.TrimSpace(out)) < 40 {
				t.Errorf("%s --help: exit %d, %q; want its usage and exit 0", s, code, out)
			}
			if code, out := run("--no-such-argument"); code != 2 {
				t.Errorf("%s --no-such-argument: exit %d, %q; want 2", s, code, out)
			}
		})
	}
}
