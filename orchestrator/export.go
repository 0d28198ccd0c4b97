package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/extract-dev/extract/checkpoint"
	"github.com/extract-dev/extract/configs"
)

// ExportOptions are the export command's choices.
type ExportOptions struct {
	// Format is the target: safetensors, specforge, specforge+gzip or modelopt.
	Format   string
	To       string
	Progress func(seen, total int)
}

// Export converts the job's done samples into another format under opt.To (a finished
// or a partial output); crash-safe per file, and a rerun resumes. It takes the run lock.
func Export(ctx context.Context, cfg *configs.Config, opt ExportOptions) (checkpoint.ExportReport, error) {
	var rep checkpoint.ExportReport
	to, err := filepath.Abs(opt.To)
	if err != nil {
		return rep, err
	}
	if to == cfg.OutputDir || strings.HasPrefix(cfg.OutputDir, to+string(filepath.Separator)) || strings.HasPrefix(to, cfg.OutputDir+string(filepath.Separator)) {
		return rep, fmt.Errorf("%w: --to %s overlaps the output dir %s: export writes a separate tree", ErrRefused, to, cfg.OutputDir)
	}
	dst, err := checkpoint.ParseLayout(to, opt.Format)
	if err != nil {
		return rep, fmt.Errorf("%w: --format: %v", ErrRefused, err)
	}
	path := filepath.Join(cfg.StateDir, "index.db")
	if _, err := os.Stat(path); err != nil {
		return rep, fmt.Errorf("%w: no index at %s: nothing to export", ErrRefused, path)
	}
	lock, err := AcquireLock(cfg.StateDir, "export")
	var held *HeldError
	if errors.As(err, &held) {
		return rep, fmt.Errorf("%w: %v; export after it stops", ErrTemporary, held)
	}
	if err != nil {
		return rep, err
	}
	defer lock.Release()
	ix, err := checkpoint.Open(path, checkpoint.OpenOptions{ReadOnly: true, Timeout: 2 * time.Second})
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
	src, err := checkpoint.ParseLayout(cfg.OutputDir, meta.OutputFormat)
	if err != nil {
		return rep, err
	}
	target := *cfg
	target.Output.Format, target.Output.Compress = string(dst.Format), "none"
	if dst.Gzip {
		target.Output.Compress = "gzip"
	}
	scratch := filepath.Join(to, ".extract-export-scratch")
	defer os.RemoveAll(scratch)
	return checkpoint.Export(ctx, ix, src, dst, checkpoint.ExportOptions{
		ConfigFingerprint: target.Fingerprint(), Layers: cfg.LayersString(), Model: cfg.ServedModel(),
		Scratch: scratch, Progress: opt.Progress,
	})
}
