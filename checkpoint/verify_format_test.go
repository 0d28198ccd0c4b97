package checkpoint

import (
	"context"
	"os"
	"path/filepath"
	"testing"
)

func TestVerifyFindsCorruptMissingAndOrphanFilesInEveryFormat(t *testing.T) {
	for _, l := range append([]Layout{{}}, torchLayouts...) {
		t.Run(l.Name(), func(t *testing.T) {
			j := &job{ix: newIndex(t, 10), out: t.TempDir(), shm: t.TempDir()}
			l.Dir = j.out
			if err := j.ix.Reset(Meta{DatasetFingerprint: "fp-1", DatasetPath: "d", ConfigFingerprint: "cfg-1", Total: 10, OutputFormat: l.Name()}); err != nil {
				t.Fatal(err)
			}
			j.m = &Mover{Layout: l}
			for s := range 5 {
				j.commit(t, j.move(t, s))
			}
			orphan := j.move(t, 6) // written, never committed
			if rep := j.verify(t, VerifyOptions{Deep: true}); rep.OK != 5 || rep.Orphans != 1 {
				t.Fatalf("clean verify: %+v", rep)
			}
			// Flip one byte of sample 1's file, remove sample 2's file.
			p := l.Path(1)
			b, _ := os.ReadFile(p)
			at := len(b) / 2
			if l.format() == FormatSafetensors {
				at = len(b) - 10 // past the header, whose padding no check covers
			}
			b[at] ^= 0x55
			os.WriteFile(p, b, 0o644)
			os.Remove(l.Path(2))
			os.WriteFile(filepath.Join(filepath.Dir(orphan.Path), "."+filepath.Base(l.Path(9))+".tmp"), []byte("x"), 0o644)
			rep := j.verify(t, VerifyOptions{Deep: true, Repair: true})
			if rep.Corrupt != 1 || rep.Missing != 1 || rep.Orphans != 1 || rep.TempFiles != 1 || rep.Repaired != 4 {
				t.Fatalf("repair: %+v", rep)
			}
			if rep := j.verify(t, VerifyOptions{Deep: true}); rep.OK != 4 || rep.Orphans+rep.Corrupt+rep.Missing+rep.TempFiles != 0 {
				t.Fatalf("after repair: %+v", rep)
			}
		})
	}
}

func TestAnIndexWithoutOutputFormatReadsAsSafetensors(t *testing.T) {
	j := newJob(t)
	if m, _, err := j.ix.Meta(); err != nil || m.OutputFormat != "" {
		t.Fatalf("meta %+v %v", m, err)
	}
	if rep := j.verify(t, VerifyOptions{Deep: true}); rep.OK != 5 {
		t.Fatalf("%+v", rep)
	}
	_ = context.Background
}
