package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/extract-dev/extract/checkpoint"
	"github.com/extract-dev/extract/configs"
)

// Verify checks the output files against the index (and, deep, their checksums); with
// repair it returns bad samples to pending and adopts valid files the index lacks. It
// takes the run lock, so it never races a running job.
func Verify(ctx context.Context, cfg *configs.Config, opt checkpoint.VerifyOptions) (checkpoint.VerifyReport, error) {
	var rep checkpoint.VerifyReport
	path := filepath.Join(cfg.StateDir, "index.db")
	if _, err := os.Stat(path); err != nil {
		return rep, fmt.Errorf("%w: no index at %s: nothing to verify (has a job run with this config?)", ErrRefused, path)
	}
	lock, err := AcquireLock(cfg.StateDir)
	var held *HeldError
	if errors.As(err, &held) {
		return rep, fmt.Errorf("%w: %v; verify after it stops (`extract status` shows its progress)", ErrTemporary, held)
	}
	if err != nil {
		return rep, err
	}
	defer lock.Release()
	ix, err := checkpoint.Open(path, checkpoint.OpenOptions{ReadOnly: !opt.Repair, Timeout: 2 * time.Second})
	if err != nil {
		return rep, err
	}
	defer ix.Close()
	meta, ok, err := ix.Meta()
	if err != nil {
		return rep, err
	}
	if !ok {
		return rep, fmt.Errorf("%w: index %s has no job", ErrRefused, path)
	}
	return checkpoint.Verify(ctx, ix, cfg.OutputDir, meta.Total, opt)
}
