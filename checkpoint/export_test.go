package checkpoint

import (
	"bytes"
	"context"
	"path/filepath"
	"testing"
)

func TestExportRoundTripSafetensorsToSpecForgeAndBackIsByteIdenticalInTensors(t *testing.T) {
	j := newJob(t)
	j.commit(t, j.move(t, 7))
	samples := []int{0, 1, 2, 3, 4, 7}
	src := Layout{Dir: j.out}
	for _, mid := range []Layout{{Format: FormatSpecForge}, {Format: FormatSpecForge, Gzip: true}, {Format: FormatModelOpt}} {
		mid.Dir = filepath.Join(t.TempDir(), "mid")
		back := Layout{Dir: filepath.Join(t.TempDir(), "back")}
		rep, err := Export(context.Background(), j.ix, src, mid, ExportOptions{ConfigFingerprint: "cfg-mid", Scratch: t.TempDir()})
		if err != nil || rep.Exported != len(samples) || rep.Failed != 0 {
			t.Fatalf("%s: export = %+v, %v", mid.Name(), rep, err)
		}
		// A rerun finds every file in place: resumable, nothing rewritten.
		if rep, err := Export(context.Background(), j.ix, src, mid, ExportOptions{ConfigFingerprint: "cfg-mid"}); err != nil || rep.Skipped != len(samples) || rep.Exported != 0 {
			t.Fatalf("%s: second export = %+v, %v", mid.Name(), rep, err)
		}
		if rep, err := Export(context.Background(), j.ix, mid, back, ExportOptions{ConfigFingerprint: "cfg-1", Scratch: t.TempDir()}); err != nil || rep.Exported != len(samples) {
			t.Fatalf("%s: export back = %+v, %v", mid.Name(), rep, err)
		}
		for _, s := range samples {
			a, err := ReadTensors(src.Path(s))
			if err != nil {
				t.Fatal(err)
			}
			b, err := ReadTensors(back.Path(s))
			if err != nil {
				t.Fatal(err)
			}
			for name, want := range a {
				if !bytes.Equal(b[name], want) {
					t.Fatalf("%s: sample %d: %s differs after the round trip", mid.Name(), s, name)
				}
			}
			if _, err := ReadOutput(back.Path(s), true); err != nil {
				t.Fatalf("%s: sample %d: %v", mid.Name(), s, err)
			}
		}
	}
}
