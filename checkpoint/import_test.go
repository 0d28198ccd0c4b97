package checkpoint

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// torchSave has real torch write SpecForge's record for sample s (ids, mask as given,
// zero hidden states of width H) at path; nan puts a NaN in.
func torchSave(t *testing.T, path string, ids, mask []int64, H int, nan bool) {
	t.Helper()
	py := python(t)
	os.MkdirAll(filepath.Dir(path), 0o755)
	list := func(v []int64) string {
		b := []byte{'['}
		for i, x := range v {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, []byte(itoa(x))...)
		}
		return string(append(b, ']'))
	}
	nanArg := "0"
	if nan {
		nanArg = "1"
	}
	out, err := exec.Command(py, "-c", `
import sys, torch
ids, mask, H = eval(sys.argv[2]), eval(sys.argv[3]), int(sys.argv[4])
T = len(ids)
h = torch.arange(T * H, dtype=torch.float32).reshape(1, T, H).to(torch.bfloat16)
if sys.argv[5] == "1":
    h[0, 0, 0] = float("nan")
torch.save({"input_ids": torch.tensor(ids), "loss_mask": torch.tensor(mask),
            "hidden_state": h, "aux_hidden_state": torch.cat([h, h, h], dim=2)}, sys.argv[1])
`, path, list(ids), list(mask), itoa(int64(H)), nanArg).CombinedOutput()
	if err != nil {
		t.Fatalf("torch.save: %v\n%s", err, out)
	}
}

func itoa(v int64) string { return strconv.FormatInt(v, 10) }

func TestImportLinksASpecForgeFileIntoASpecForgeJobAndVerifyChecksItAgainstItsRecord(t *testing.T) {
	from := t.TempDir()
	ids, mask := idsOf(4, 9), []int64{0, 0, 1, 1, 1, 1, 1, 1, 1}
	src := filepath.Join(from, "rows_0-2000", "data_4.ckpt")
	torchSave(t, src, ids, mask, 8, false)
	files, err := FindImportFiles(from, nil)
	if err != nil || len(files) != 1 || files[0].Sample != 4 || files[0].Kind != FormatSpecForge {
		t.Fatalf("found %+v, %v", files, err)
	}
	ix := newIndex(t, 10)
	out := t.TempDir()
	l := Layout{Dir: out, Format: FormatSpecForge}
	if err := ix.Reset(Meta{DatasetFingerprint: "fp-1", DatasetPath: "d", ConfigFingerprint: "cfg-1", Total: 10, OutputFormat: l.Name()}); err != nil {
		t.Fatal(err)
	}
	want := ImportWant{Sample: 4, InputIDs: ids, LossMask: mask, HiddenSize: 8, Layers: "2,30,58", DatasetFingerprint: "fp-1", ConfigFingerprint: "cfg-1"}
	res, err := Import(context.Background(), files[0], l, want, false, t.TempDir())
	if err != nil || res.How != "link" || res.Path != l.Path(4) {
		t.Fatalf("import = %+v, %v; want a link into %s", res, err, l.Path(4))
	}
	a, _ := os.Stat(src)
	b, _ := os.Stat(res.Path)
	if !os.SameFile(a, b) {
		t.Fatal("the output is not a hard link of the source")
	}
	if err := ix.CommitDone(Record{Sample: 4, Bytes: res.Bytes, CRC32C: res.CRC32C, Tokens: res.Tokens, Imported: true}); err != nil {
		t.Fatal(err)
	}
	c, _ := ix.Counters()
	if c.Imported != 1 || c.Done != 1 {
		t.Fatalf("counters %+v", c)
	}
	rep, err := Verify(context.Background(), ix, out, 10, VerifyOptions{Deep: true, Expect: testSource{4: {ids, mask}}})
	if err != nil || rep.OK != 1 {
		t.Fatalf("verify of the linked file: %+v, %v", rep, err)
	}
	// The same file against a dataset line with other ids is left alone, naming why.
	want.InputIDs = idsOf(5, 9)
	if _, err := Import(context.Background(), files[0], Layout{Dir: t.TempDir(), Format: FormatSpecForge}, want, false, t.TempDir()); !isReject(err, "input_ids differ") {
		t.Fatalf("import against other ids = %v", err)
	}
}

func TestImportConvertsIntoAnotherFormatKeepingTheFilesMaskWhenTheDatasetHasNone(t *testing.T) {
	from := t.TempDir()
	ids, mask := idsOf(2, 6), []int64{0, 1, 0, 1, 1, 1}
	torchSave(t, filepath.Join(from, "2.pt"), ids, mask, 8, false)
	torchSave(t, filepath.Join(from, "3.pt"), idsOf(3, 6), mask, 8, true)
	files, _ := FindImportFiles(from, nil)
	l := Layout{Dir: t.TempDir()}
	res, err := Import(context.Background(), files[0], l, ImportWant{Sample: 2, InputIDs: ids, HiddenSize: 8, Layers: "2,30,58"}, false, t.TempDir())
	if err != nil || res.How != "convert" {
		t.Fatalf("import = %+v, %v", res, err)
	}
	ts, err := ReadTensors(res.Path)
	if err != nil || string(ts[tensorLossMask]) != string(int64Bytes(mask)) {
		t.Fatalf("converted file's loss_mask %v, %v", ts[tensorLossMask], err)
	}
	// verify --deep takes the kept mask, not the all-ones default of a line without one.
	if _, err := readOutput(context.Background(), res.Path, true, &fileWant{ids: ids, haveIDs: true, haveSample: true}, make([]byte, 64)); err != nil {
		t.Fatal(err)
	}
	if _, err := Import(context.Background(), files[1], l, ImportWant{Sample: 3, InputIDs: idsOf(3, 6), HiddenSize: 8, Layers: "2,30,58"}, false, t.TempDir()); !isReject(err, "not finite") {
		t.Fatalf("import of a NaN file = %v", err)
	}
}

func isReject(err error, substr string) bool {
	rj, ok := errors.AsType[*RejectError](err)
	return ok && strings.Contains(rj.Reason, substr)
}

type testSource map[int][2][]int64

func (s testSource) Len() int { return 10 }
func (s testSource) Sample(i int) ([]int64, []int64, error) {
	v := s[i]
	return v[0], v[1], nil
}
