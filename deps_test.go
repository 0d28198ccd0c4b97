package extract_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/extract-dev/extract"

// goPackage is the part of `go list -json` the rules read.
type goPackage struct {
	ImportPath string
	Imports    []string // direct, without test files
	Deps       []string // transitive, without test files
}

// listPackages runs `go list -json ./...` on the module.
func listPackages(t *testing.T) map[string]goPackage {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("no go command to list the packages: %v", err)
	}
	out, err := exec.Command(goBin, "list", "-json", "./...").Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("go list: %v\n%s", err, ee.Stderr)
		}
		t.Fatalf("go list: %v", err)
	}
	pkgs := map[string]goPackage{}
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p goPackage
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("decode go list output: %v", err)
		}
		pkgs[p.ImportPath] = p
	}
	return pkgs
}

// within reports whether path is pkg or a package below it.
func within(path, pkg string) bool { return path == pkg || strings.HasPrefix(path, pkg+"/") }

// TestPackagesKeepTheirBoundaries holds the layering of docs/design.md: the dataset, the
// server side and the index know nothing of the coordinator or of each other, and orchestrator
// composes the server's facts instead of asking NVML itself.
func TestPackagesKeepTheirBoundaries(t *testing.T) {
	pkgs := listPackages(t)
	m := func(p string) string { return module + "/" + p }
	for _, rule := range []struct {
		pkg    string
		bad    []string
		direct bool // only the package's own imports count, not what they import
		why    string
	}{
		{m("dataset"), []string{m("orchestrator"), m("doctor"), m("sglang"), m("shm"), m("checkpoint")}, false, "the dataset is read first: it knows nothing of the pipeline that consumes it"},
		{m("sglang"), []string{m("checkpoint"), m("orchestrator"), m("doctor")}, false, "the server side knows nothing of the index or the run loop"},
		{m("sglang/simulator"), []string{m("checkpoint"), m("orchestrator"), m("doctor")}, false, "the simulator stands in for the server and knows no more than it"},
		{m("orchestrator"), []string{"github.com/NVIDIA/go-nvml"}, true, "GPU facts come from sglang; orchestrator only judges them"},
		{m("doctor"), []string{"github.com/NVIDIA/go-nvml"}, true, "GPU facts come from sglang; doctor only judges them"},
		{m("checkpoint"), []string{m("orchestrator"), m("doctor"), m("sglang")}, false, "the index and the output layout are readable without the run loop or the server"},
		{m("configs"), []string{m("orchestrator"), m("doctor"), m("dataset"), m("checkpoint"), m("shm"), m("sglang")}, false, "every layer reads the config, so it reads none of them (the simulator embeds configs.Simulator, not the other way)"},
		{m("shm"), []string{m("orchestrator"), m("doctor"), m("checkpoint"), m("sglang")}, false, "the staging dir is a leaf the pipeline builds on"},
		{m("internal/history"), []string{m("orchestrator"), m("checkpoint"), m("sglang"), m("shm")}, false, "the history is records and a file: readable without the pipeline"},
		{m("internal/report"), []string{m("orchestrator"), m("checkpoint"), m("sglang"), m("shm")}, false, "drawing a report needs the history and the facts it is given, nothing else"},
	} {
		p, ok := pkgs[rule.pkg]
		if !ok {
			t.Errorf("go list does not show %s: the rule for it checks nothing", rule.pkg)
			continue
		}
		imports := p.Deps
		if rule.direct {
			imports = p.Imports
		}
		for _, imp := range imports {
			for _, bad := range rule.bad {
				if within(imp, bad) {
					t.Errorf("%s imports %s: %s", rule.pkg, imp, rule.why)
				}
			}
		}
	}
	// internal/ holds leaves: small helpers any package may use, which use none of them.
	internal := m("internal")
	seen := 0
	for path, p := range pkgs {
		if !within(path, internal) {
			continue
		}
		seen++
		for _, imp := range p.Deps {
			if within(imp, module) && !within(imp, internal) {
				t.Errorf("%s imports %s: internal packages are leaves", path, imp)
			}
		}
	}
	if seen == 0 {
		t.Errorf("go list shows no package under %s", internal)
	}
}
