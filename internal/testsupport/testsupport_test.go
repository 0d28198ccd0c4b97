package testsupport

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// absent is a kind no machine has: its probe always says why it is missing.
const absent Kind = "never-present"

// TestHelperNeedsAbsent is what the tests below run in a child test binary.
func TestHelperNeedsAbsent(t *testing.T) {
	if os.Getenv("TESTSUPPORT_CHILD") == "" {
		t.Skip("run by the tests below in a child process")
	}
	Require(t, absent)
	t.Log("ran past Require")
}

func TestHelperHasRoot(t *testing.T) {
	if os.Getenv("TESTSUPPORT_CHILD") == "" {
		t.Skip("run by the tests below in a child process")
	}
	Count(t, SGLangSrc, 3)
}

func child(t *testing.T, run, require string) (string, error, string) {
	t.Helper()
	report := filepath.Join(t.TempDir(), "report")
	cmd := exec.Command(os.Args[0], "-test.run=^"+run+"$", "-test.v")
	cmd.Env = append(os.Environ(), "TESTSUPPORT_CHILD=1", EnvRequire+"="+require, EnvReport+"="+report)
	out, err := cmd.CombinedOutput()
	b, _ := os.ReadFile(report)
	return string(out), err, string(b)
}

func TestAMissingKindSkipsWhereItIsNotRequired(t *testing.T) {
	out, err, report := child(t, "TestHelperNeedsAbsent", "fuse,root")
	if err != nil || !strings.Contains(out, "SKIP") || strings.Contains(out, "ran past Require") {
		t.Fatalf("not required: %v\n%s", err, out)
	}
	if !strings.HasPrefix(report, "never-present skipped 1 testsupport/TestHelperNeedsAbsent") {
		t.Errorf("report %q does not record the skip", report)
	}
}

func TestAMissingKindFailsWhereItIsRequired(t *testing.T) {
	out, err, report := child(t, "TestHelperNeedsAbsent", "fuse,never-present,root")
	if err == nil || !strings.Contains(out, "is required here") || strings.Contains(out, "ran past Require") {
		t.Fatalf("required: err %v, want a failure naming the kind\n%s", err, out)
	}
	if !strings.HasPrefix(report, "never-present failed 1") {
		t.Errorf("report %q does not record the failure", report)
	}
}

func TestCountRecordsTheCasesASuiteRan(t *testing.T) {
	_, err, report := child(t, "TestHelperHasRoot", "")
	if err != nil || !strings.HasPrefix(report, "sglang-src ran 3 testsupport/TestHelperHasRoot") {
		t.Fatalf("err %v, report %q", err, report)
	}
}
