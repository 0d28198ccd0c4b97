package torchzip

import (
	"archive/zip"
	"bytes"
	"encoding/binary"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/extract-dev/extract/internal/testsupport"
)

// writeArchive writes a dict of an int64 [3] and a bf16 [1,2,3] tensor to path.
func writeArchive(t *testing.T, path string, force64 bool) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	z := NewWriter(f, f)
	z.Force64 = force64
	ts := []Tensor{
		{Name: "ids", DType: Int64, Key: "0", StorageNumel: 3, Shape: []int64{3}, Stride: []int64{1}},
		{Name: "h", DType: BFloat16, Key: "1", StorageNumel: 6, Shape: []int64{1, 2, 3}, Stride: []int64{6, 3, 1}},
	}
	if err := z.WriteRecord("archive/data.pkl", EncodeDict(ts)); err != nil {
		t.Fatal(err)
	}
	ids := make([]byte, 24)
	for i, v := range []int64{7, -1, 1 << 40} {
		binary.LittleEndian.PutUint64(ids[i*8:], uint64(v))
	}
	r, err := z.Create("archive/data/0", 24, nil)
	if err != nil {
		t.Fatal(err)
	}
	r.Write(ids[:10])
	r.Write(ids[10:])
	// bf16 1.0, 2.0, -0.5, 3.0, 0, 65280 (0x4780)
	h := []byte{0x80, 0x3f, 0x00, 0x40, 0x00, 0xbf, 0x40, 0x40, 0, 0, 0x7f, 0x47}
	if err := z.WriteRecord("archive/data/1", h); err != nil {
		t.Fatal(err)
	}
	for name, v := range map[string]string{"archive/version": "3\n", "archive/byteorder": "little"} {
		if err := z.WriteRecord(name, []byte(v)); err != nil {
			t.Fatal(err)
		}
	}
	if err := z.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestAnArchiveReadsBackThroughGoZipAndOurReaderAligned(t *testing.T) {
	for _, force := range []bool{false, true} {
		path := filepath.Join(t.TempDir(), "a.pt")
		writeArchive(t, path, force)
		zr, err := zip.OpenReader(path)
		if err != nil {
			t.Fatalf("zip64=%v: archive/zip: %v", force, err)
		}
		zr.Close()
		f, _ := os.Open(path)
		st, _ := f.Stat()
		a, err := Open(f, st.Size())
		if err != nil {
			t.Fatalf("zip64=%v: %v", force, err)
		}
		for name, rec := range a.Files {
			if rec.Offset%Alignment != 0 {
				t.Errorf("zip64=%v: %s data at %d, not 64-aligned", force, name, rec.Offset)
			}
		}
		pkl, _ := a.Get("data.pkl")
		b, err := ReadSmall(f, pkl, 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		ts, err := DecodeDict(b)
		if err != nil {
			t.Fatal(err)
		}
		if len(ts) != 2 || ts[1].Name != "h" || ts[1].DType != BFloat16 || ts[1].Numel() != 6 || !ts[1].Contiguous() {
			t.Fatalf("decoded %+v", ts)
		}
		f.Seek(0, 0)
		var names []string
		if err := Walk(f, func(name string, size int64, _ io.Reader) error { names = append(names, name); return nil }); err != nil {
			t.Fatalf("zip64=%v: walk: %v", force, err)
		}
		if strings.Join(names, ",") != strings.Join(a.Order, ",") {
			t.Errorf("walk saw %v, directory has %v", names, a.Order)
		}
		f.Close()
	}
}

func TestRealTorchLoadsAGoWrittenArchiveWithWeightsOnly(t *testing.T) {
	testsupport.Require(t, testsupport.Torch)
	for _, force := range []bool{false, true} {
		path := filepath.Join(t.TempDir(), "a.pt")
		writeArchive(t, path, force)
		out, err := exec.Command("/usr/bin/python3", "-c", `
import sys, torch
d = torch.load(sys.argv[1], weights_only=True)
assert list(d) == ["ids", "h"], list(d)
assert d["ids"].tolist() == [7, -1, 1 << 40], d["ids"]
assert d["h"].dtype == torch.bfloat16 and tuple(d["h"].shape) == (1, 2, 3)
assert d["h"].float().flatten().tolist() == [1.0, 2.0, -0.5, 3.0, 0.0, 65280.0], d["h"]
print("ok")
`, path).CombinedOutput()
		if err != nil || !bytes.Contains(out, []byte("ok")) {
			t.Fatalf("zip64=%v: torch.load: %v\n%s", force, err, out)
		}
	}
}

func TestTorchWrittenPicklesDecode(t *testing.T) {
	testsupport.Require(t, testsupport.Torch)
	path := filepath.Join(t.TempDir(), "t.ckpt")
	out, err := exec.Command("/usr/bin/python3", "-c", `
import sys, torch
torch.save({"input_ids": torch.arange(5), "loss_mask": torch.ones(5, dtype=torch.long),
            "hidden_state": torch.zeros(1, 5, 4, dtype=torch.bfloat16),
            "aux_hidden_state": torch.zeros(1, 5, 12, dtype=torch.bfloat16)[:, :, :].clone()}, sys.argv[1])
`, path).CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	f, _ := os.Open(path)
	defer f.Close()
	st, _ := f.Stat()
	a, err := Open(f, st.Size())
	if err != nil {
		t.Fatal(err)
	}
	pkl, ok := a.Get("data.pkl")
	if !ok {
		t.Fatalf("records %v", a.Order)
	}
	b, _ := ReadSmall(f, pkl, 1<<20)
	ts, err := DecodeDict(b)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, x := range ts {
		got = append(got, x.Name+":"+string(x.DType))
	}
	if strings.Join(got, ",") != "input_ids:LongStorage,loss_mask:LongStorage,hidden_state:BFloat16Storage,aux_hidden_state:BFloat16Storage" {
		t.Fatalf("decoded %v", got)
	}
}
