package orchestrator

import (
	"fmt"
	"net"
	"os"
	"testing"

	"github.com/extract-dev/extract/doctor"
	"github.com/extract-dev/extract/sglang"
)

// A run that cannot listen on status.listen refuses to start: doctor must not pass it.
func TestDoctorFailsWhenTheStatusPortIsTakenNamingWho(t *testing.T) {
	cfg := doctorConfig(t, sglang.KindSimulator, tokenLines(4, 10))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	cfg.Status.Listen = ln.Addr().String()
	rep := runDoctor(t, cfg, doctor.Options{})
	c := wantCheck(t, rep, "status port", doctor.CheckFail, ln.Addr().String()+" is taken by "+fmt.Sprintf("pid %d (", os.Getpid()), "which extract did not start")
	if rep.OK || c.Fix == "" {
		t.Errorf("report OK %v, fix %q; want a failed check with a fix", rep.OK, c.Fix)
	}
	ln.Close()
	wantCheck(t, runDoctor(t, cfg, doctor.Options{}), "status port", doctor.CheckOK, "is free")
	cfg.Status.Listen = "127.0.0.1:0"
	wantCheck(t, runDoctor(t, cfg, doctor.Options{}), "status port", doctor.CheckOK, "a free port is picked at start")
}
