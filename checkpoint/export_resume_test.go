package checkpoint

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestExportIntoAFolderHoldingAnotherJobsExportIsRefusedAndLeavesItsFiles(t *testing.T) {
	j := newJob(t)
	j.commit(t, j.move(t, 7))
	src := Layout{Dir: j.out}
	dst := Layout{Dir: filepath.Join(t.TempDir(), "export"), Format: FormatSpecForge}
	if rep, err := Export(context.Background(), j.ix, src, dst, ExportOptions{ConfigFingerprint: "job-A"}); err != nil || rep.Exported != 6 {
		t.Fatalf("export of job A: %+v, %v", rep, err)
	}
	before, _ := os.Stat(dst.Path(7))
	// Job B (other layers: another config fingerprint) into the same folder.
	rep, err := Export(context.Background(), j.ix, src, dst, ExportOptions{ConfigFingerprint: "job-B"})
	if !errors.Is(err, ErrForeignTarget) || !strings.Contains(err.Error(), "job-A") || rep.Skipped+rep.Exported != 0 {
		t.Fatalf("export of job B over A's: %+v, %v; want it refused naming job A", rep, err)
	}
	// The same without the folder's marker: each file's record says whose it is.
	os.Remove(filepath.Join(dst.Dir, exportMarkerName))
	rep, err = Export(context.Background(), j.ix, src, dst, ExportOptions{ConfigFingerprint: "job-B"})
	if !errors.Is(err, ErrForeignTarget) || !strings.Contains(err.Error(), "another job's file") {
		t.Fatalf("export of job B over A's unmarked files: %+v, %v", rep, err)
	}
	if after, err := os.Stat(dst.Path(7)); err != nil || !os.SameFile(before, after) || after.ModTime() != before.ModTime() {
		t.Fatalf("job A's file was replaced: %v", err)
	}
	if info, err := ReadOutput(dst.Path(7), true); err != nil || info.ConfigFingerprint != "job-A" {
		t.Fatalf("job A's file: %+v, %v", info, err)
	}
	// A file another tool put under a name export would write is never replaced.
	other := Layout{Dir: filepath.Join(t.TempDir(), "other"), Format: FormatSpecForge}
	os.MkdirAll(filepath.Dir(other.Path(7)), 0o755)
	os.WriteFile(other.Path(7), []byte("not ours"), 0o644)
	if _, err := Export(context.Background(), j.ix, src, other, ExportOptions{ConfigFingerprint: "job-B"}); !errors.Is(err, ErrForeignTarget) {
		t.Fatalf("export over another tool's file: %v", err)
	}
	if b, _ := os.ReadFile(other.Path(7)); string(b) != "not ours" {
		t.Fatal("another tool's file was replaced")
	}
}

func TestAnExportRerunRewritesATargetWithAFlippedByteAndKeepsTheSoundOnes(t *testing.T) {
	j := newJob(t)
	j.commit(t, j.move(t, 7))
	src := Layout{Dir: j.out}
	for _, dst := range []Layout{{Format: FormatSpecForge}, {Format: FormatModelOpt}, {Format: FormatSafetensors}} {
		dst.Dir = filepath.Join(t.TempDir(), "export")
		opt := ExportOptions{ConfigFingerprint: "job-A", Scratch: t.TempDir()}
		if rep, err := Export(context.Background(), j.ix, src, dst, opt); err != nil || rep.Exported != 6 {
			t.Fatalf("%s: export: %+v, %v", dst.Name(), rep, err)
		}
		flipTensorByte(t, dst.Path(7))
		rep, err := Export(context.Background(), j.ix, src, dst, opt)
		if err != nil || rep.Exported != 1 || rep.Skipped != 5 {
			t.Fatalf("%s: rerun over a flipped byte: %+v, %v; want that one rewritten, 5 kept", dst.Name(), rep, err)
		}
		if _, err := ReadOutput(dst.Path(7), true); err != nil {
			t.Fatalf("%s: the rewritten target: %v", dst.Name(), err)
		}
	}
}
