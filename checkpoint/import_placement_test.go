package checkpoint

import "testing"

func TestPlacementLinksOnlyAFileExactlyInTheJobsFormatOfThisJob(t *testing.T) {
	specforge := Layout{Dir: "/out", Format: FormatSpecForge}
	file := func(path string, edit func(*sampleFile)) *sampleFile {
		sf := &sampleFile{path: path, hasMask: true}
		for r, name := range specforge.tensorNames() {
			sf.t[r] = fileTensor{name: name, shape: []int64{5}}
			if r >= 2 {
				sf.t[r].shape = []int64{1, 5, 4}
			}
		}
		if edit != nil {
			edit(sf)
		}
		return sf
	}
	want := ImportWant{DatasetFingerprint: "fp", ConfigFingerprint: "cfg"}
	ours := func(cfg string) func(*sampleFile) {
		return func(sf *sampleFile) {
			sf.md = map[string]string{"dataset_fingerprint": "fp", "config_fingerprint": cfg}
		}
	}
	for _, c := range []struct {
		name     string
		sf       *sampleFile
		copyOnly bool
		l        Layout
		want     string
	}{
		{"another tool's exact SpecForge file", file("/in/data_1.ckpt", nil), false, specforge, howLink},
		{"the same, --copy", file("/in/data_1.ckpt", nil), true, specforge, howCopy},
		{"extract's own file of this job", file("/in/data_1.ckpt", ours("cfg")), false, specforge, howLink},
		{"extract's own file of another job", file("/in/data_1.ckpt", ours("other")), false, specforge, howConvert},
		{"an extra tensor or record", file("/in/data_1.ckpt", func(sf *sampleFile) { sf.inexact = "tensor junk" }), false, specforge, howConvert},
		{"no loss_mask", file("/in/data_1.ckpt", func(sf *sampleFile) { sf.hasMask = false }), false, specforge, howConvert},
		{"no batch dim", file("/in/data_1.ckpt", func(sf *sampleFile) { sf.t[2].shape = []int64{5, 4} }), false, specforge, howConvert},
		{"Model-Optimizer's names", file("/in/1.pt", nil), false, Layout{Format: FormatModelOpt}, howConvert},
		{"another container", file("/in/data_1.ckpt", nil), false, Layout{}, howConvert},
	} {
		if got := placement(c.sf, c.l, want, c.copyOnly); got != c.want {
			t.Errorf("%s: %s, want %s", c.name, got, c.want)
		}
	}
}
