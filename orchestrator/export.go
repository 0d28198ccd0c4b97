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
	"github.com/extract-dev/extract/shm"
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
	// Compared where they really are: a symlink (at --to or above it) into the output
	// dir must not make export write into the job's own tree.
	for _, d := range []struct{ name, dir string }{{"output dir", cfg.OutputDir}, {"state dir", cfg.StateDir}} {
		if overlaps(resolveExisting(to), resolveExisting(d.dir)) {
			return rep, fmt.Errorf("%w: --to %s overlaps the %s %s: export writes a separate tree", ErrRefused, opt.To, d.name, d.dir)
		}
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
	rep, err = checkpoint.Export(ctx, ix, src, dst, checkpoint.ExportOptions{
		ConfigFingerprint: target.Fingerprint(), Layers: cfg.LayersString(), Model: cfg.ServedModel(),
		Scratch: scratch, Progress: opt.Progress,
	})
	switch {
	case errors.Is(err, checkpoint.ErrForeignTarget):
		return rep, fmt.Errorf("%w: %w", ErrRefused, err)
	case errors.Is(err, checkpoint.ErrTargetFull):
		free := "unknown"
		if fs, serr := shm.StatFS(to); serr == nil {
			free = fmt.Sprintf("%d bytes", fs.Free)
		}
		return rep, fmt.Errorf("%w: %w (%s free at %s, %d samples exported this time): free room on the target disk or choose another --to, then run export again: it resumes; the source files are fine",
			ErrTemporary, err, free, to, rep.Exported)
	}
	return rep, err
}

// resolveExisting is path with every symlink of its longest existing prefix resolved;
// the missing rest is appended as it is.
func resolveExisting(path string) string {
	path = filepath.Clean(path)
	var rest []string
	for p := path; ; p = filepath.Dir(p) {
		if r, err := filepath.EvalSymlinks(p); err == nil {
			return filepath.Join(append([]string{r}, rest...)...)
		}
		if filepath.Dir(p) == p {
			return path
		}
		rest = append([]string{filepath.Base(p)}, rest...)
	}
}

// overlaps says whether a and b are the same folder or one holds the other.
func overlaps(a, b string) bool {
	sep := string(filepath.Separator)
	return a == b || strings.HasPrefix(a, strings.TrimSuffix(b, sep)+sep) || strings.HasPrefix(b, strings.TrimSuffix(a, sep)+sep)
}
