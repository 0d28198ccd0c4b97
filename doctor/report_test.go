package doctor

import (
	"errors"
	"testing"

	"github.com/extract-dev/extract/internal/errclass"
)

func TestAReportWithFailedChecksIsAPreflightErrorNamingEachWithItsFix(t *testing.T) {
	rep := Report{Checks: []Check{
		okCheck("gpus", "8 free"),
		failCheck("server port", "stop it", "30000 is taken by pid %d", 7),
		warnCheck("config file", "move it", "under /tmp"),
		failCheck("model", "", "no config.json"),
	}}
	err := rep.Err()
	if !errors.Is(err, errclass.ErrPreflight) {
		t.Fatalf("Err() = %v, want ErrPreflight (exit 3)", err)
	}
	const want = "preflight failed: server port: 30000 is taken by pid 7 (fix: stop it); model: no config.json"
	if err.Error() != want {
		t.Errorf("Err() = %q\nwant    %q", err, want)
	}
	if got := len(rep.Failed()); got != 2 {
		t.Errorf("Failed() has %d checks, want 2", got)
	}
	if err := (Report{Checks: rep.Checks[:1]}).Err(); err != nil {
		t.Errorf("a report without a failed check: Err() = %v, want nil", err)
	}
}
