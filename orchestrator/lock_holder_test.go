package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/extract-dev/extract/checkpoint"
	"github.com/extract-dev/extract/doctor"
	"github.com/extract-dev/extract/sglang"
)

// verify --repair (import, export) holds the run lock and the index: a run, status and
// doctor must name it, not take it for a run going.
func TestVerifyHoldingTheLockIsNotARunToRunStatusOrDoctor(t *testing.T) {
	cfg := doctorConfig(t, sglang.KindSimulator, tokenLines(4, 10))
	indexJob(t, cfg, []int{0})
	lock, err := AcquireLock(cfg.StateDir, "verify")
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Release()
	ix, err := checkpoint.Open(filepath.Join(cfg.StateDir, "index.db"), checkpoint.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer ix.Close()
	who := fmt.Sprintf("extract verify (pid %d)", os.Getpid())

	res, err := Run(context.Background(), cfg, RunOptions{Resume: true})
	if !errors.Is(err, ErrTemporary) || !strings.Contains(err.Error(), who) || res.Outcome == AlreadyRunning {
		t.Errorf("run while verify holds the lock: outcome %v, err %v; want a temporary failure naming %s", res.Outcome, err, who)
	}

	st, err := QueryStatus(context.Background(), cfg)
	if err != nil || st.State == "running" || st.LockHolder != who || st.PID != 0 {
		t.Errorf("status while verify holds the lock: %+v, %v; want not running, lock_holder %q", st, err, who)
	}

	rep := runDoctor(t, cfg, doctor.Options{})
	wantCheck(t, rep, "index", doctor.CheckWarn, who+" holds the lock")
	if rep.RunningPID != 0 {
		t.Errorf("doctor reports running pid %d while only verify holds the lock", rep.RunningPID)
	}
}
