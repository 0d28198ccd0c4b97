package main

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/extract-dev/extract/internal/testsupport"
)

// finishedJob runs a small job of hidden size H to completion.
func finishedJob(t *testing.T, H int) *job {
	t.Helper()
	j := newJob(t, 12, 50000)
	j.hidden = H
	j.env = append(j.env, "EXTRACT_SERVER_SIMULATOR_HIDDEN_SIZE="+strconv.Itoa(H))
	if r := j.run("run"); r.code != 0 {
		t.Fatalf("run: exit %d: %s", r.code, r.stderr)
	}
	return j
}

func TestExportRefusesAnotherJobsFolderASymlinkIntoTheOutputAndAdvisesAboutAFullTarget(t *testing.T) {
	a, b := finishedJob(t, 32), finishedJob(t, 64) // job B: another hidden size, another config
	to := filepath.Join(t.TempDir(), "trainer")
	if s := a.exportJSON("specforge", to); s.Exported != 12 {
		t.Fatalf("export of job A: %+v", s)
	}
	r := b.run("export", "--format", "specforge", "--to", to)
	if r.code != 2 || !strings.Contains(r.stderr, "holds the export of config") {
		t.Fatalf("job B's export into job A's folder: exit %d, want 2 naming the other job\n%s%s", r.code, r.stdout, r.stderr)
	}
	if s := a.exportJSON("specforge", to); s.Skipped != 12 || s.Exported != 0 {
		t.Fatalf("job A's rerun after B was refused: %+v; want all 12 still A's", s)
	}

	// --to through a symlink into the output dir.
	link := filepath.Join(t.TempDir(), "link")
	if err := os.Symlink(a.out, link); err != nil {
		t.Fatal(err)
	}
	for _, target := range []string{link, filepath.Join(link, "sub")} {
		if r := a.run("export", "--format", "modelopt", "--to", target); r.code != 2 || !strings.Contains(r.stderr, "overlaps the output dir") {
			t.Fatalf("export --to %s: exit %d, want 2\n%s", target, r.code, r.stderr)
		}
	}
	if entries, _ := os.ReadDir(a.out); len(entries) == 0 {
		t.Fatal("output dir emptied")
	}
	for _, e := range mustReadDir(t, a.out) {
		if strings.HasSuffix(e.Name(), ".pt") || e.Name() == "sub" {
			t.Fatalf("export wrote %s into the output dir", e.Name())
		}
	}

	// A full target disk: advice about the target, exit 75.
	mnt := filepath.Join(t.TempDir(), "small")
	os.MkdirAll(mnt, 0o755)
	if err := syscall.Mount("tmpfs", mnt, "tmpfs", 0, "size=64k"); err != nil {
		testsupport.Unavailable(t, testsupport.Root, "cannot mount a tmpfs here: %v", err)
	}
	defer syscall.Unmount(mnt, syscall.MNT_DETACH)
	r = a.run("export", "--format", "modelopt", "--to", filepath.Join(mnt, "x"))
	if r.code != 75 || !strings.Contains(r.stderr, "free room on the target disk") || strings.Contains(r.stderr, "verify --deep") {
		t.Fatalf("export onto a full disk: exit %d, want 75 with advice about the target\n%s%s", r.code, r.stdout, r.stderr)
	}
}

func mustReadDir(t *testing.T, dir string) []os.DirEntry {
	t.Helper()
	e, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	return e
}
