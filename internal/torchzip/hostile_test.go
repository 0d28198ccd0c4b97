package torchzip

import (
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/extract-dev/extract/internal/torchzip/torchforge"
)

func TestDecodeRefusesEveryHostileShapeNamingWhy(t *testing.T) {
	for want, p := range torchforge.Hostile() {
		if ts, err := DecodeDict(p); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: decoded %d tensors, err %v; want a refusal naming %q", want, len(ts), err, want)
		}
	}
}

func TestTheOSSystemPayloadRunsUnderTorchLoadAndTheDecoderRefusesIt(t *testing.T) {
	py := realTorch(t)
	dir := t.TempDir()
	marker := filepath.Join(dir, "pwned")
	path := filepath.Join(dir, "data_0.ckpt")
	p := torchforge.OSSystem(3, 4, "touch "+marker)
	if err := torchforge.WriteArchive(path, p, torchforge.Storages(3, 4, false)); err != nil {
		t.Fatal(err)
	}
	// The premise: SpecForge's torch.load(weights_only=False) of such a file runs it.
	out, err := exec.Command(py, "-c", "import sys, torch; torch.load(sys.argv[1], weights_only=False)", path).CombinedOutput()
	if _, serr := os.Stat(marker); serr != nil {
		t.Fatalf("the forged pickle did not run its command under torch.load (%v %s): the test proves nothing", err, out)
	}
	if _, err := DecodeDict(p); err == nil || !strings.Contains(err.Error(), "GLOBAL typing.collections") {
		t.Fatalf("decode of the os.system payload: %v; want it refused at GLOBAL typing.collections", err)
	}
}

func TestATensorRepointedByBUILDLoadsNaNInTorchAndTheDecoderRefusesIt(t *testing.T) {
	py := realTorch(t)
	path := filepath.Join(t.TempDir(), "data_0.ckpt")
	p := torchforge.Repointed(3, 4, "4")
	if err := torchforge.WriteArchive(path, p, torchforge.Storages(3, 4, true)); err != nil {
		t.Fatal(err)
	}
	for _, wo := range []string{"True", "False"} {
		out, err := exec.Command(py, "-c", "import sys, torch; d = torch.load(sys.argv[1], weights_only="+wo+"); print(bool(d['hidden_state'].float().isnan().all()))", path).CombinedOutput()
		if err != nil || !strings.Contains(string(out), "True") {
			t.Fatalf("weights_only=%s: torch did not load the re-pointed NaN storage (%v %s): the test proves nothing", wo, err, out)
		}
	}
	if _, err := DecodeDict(p); err == nil || !strings.Contains(err.Error(), "BUILD") {
		t.Fatalf("decode of the re-pointed tensor: %v; want BUILD refused", err)
	}
}

func TestAStorageOffsetNear2To63IsRefusedInCheckedArithmetic(t *testing.T) {
	ts, err := DecodeDict(torchforge.BigOffset(3, 4))
	if err == nil || !strings.Contains(err.Error(), "lies outside") {
		t.Fatalf("decoded %+v, %v; want the offset refused", ts, err)
	}
	for _, bad := range []Tensor{
		{DType: BFloat16, StorageNumel: 1 << 62, Shape: []int64{1 << 62}, Stride: []int64{1}},         // bytes overflow
		{DType: Int64, StorageNumel: 10, Shape: []int64{1 << 32, 1 << 32}, Stride: []int64{1, 1}},     // numel overflows
		{DType: Int64, StorageNumel: 10, StorageOffset: 5, Shape: []int64{6}, Stride: []int64{1}},     // one past
		{DType: Int64, StorageNumel: 10, Shape: []int64{2, 3}, Stride: []int64{math.MaxInt64 / 2, 1}}, // extent overflows
	} {
		if off, n, err := bad.Span(); err == nil {
			t.Errorf("%+v: span %d+%d accepted", bad, off, n)
		}
	}
	if off, n, err := (Tensor{DType: Int64, StorageNumel: 10, StorageOffset: 4, Shape: []int64{6}, Stride: []int64{1}}).Span(); err != nil || off != 32 || n != 48 {
		t.Fatalf("a view that ends at its storage's end: %d+%d, %v", off, n, err)
	}
}

func TestTorchWritesNoBUILDAndEveryTorchSaveShapeDecodes(t *testing.T) {
	py := realTorch(t)
	dir := t.TempDir()
	out, err := exec.Command(py, "-c", `
import sys, torch, collections
T, H = 5, 4
d = {"input_ids": torch.arange(T), "loss_mask": torch.ones(T, dtype=torch.long),
     "hidden_state": torch.zeros(1, T, H, dtype=torch.bfloat16), "aux_hidden_state": torch.zeros(1, T, 3 * H, dtype=torch.bfloat16),
     "big": torch.zeros(3, dtype=torch.float64), "scalar": torch.tensor(2.5), "grad": torch.ones(2, requires_grad=True)}
torch.save(d, sys.argv[1] + "/p2.pt")
torch.save(d, sys.argv[1] + "/p4.pt", pickle_protocol=4)
torch.save(collections.OrderedDict(d), sys.argv[1] + "/od.pt")
torch.save({"one": torch.arange(3)}, sys.argv[1] + "/one.pt")
`, dir).CombinedOutput()
	if err != nil {
		t.Fatalf("torch.save: %v\n%s", err, out)
	}
	for _, name := range []string{"p2.pt", "p4.pt", "od.pt", "one.pt"} {
		f, err := os.Open(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		st, _ := f.Stat()
		a, err := Open(f, st.Size())
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		rec, _ := a.Get("data.pkl")
		p, err := ReadSmall(f, rec, 1<<20)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		ts, err := DecodeDict(p)
		if err != nil {
			t.Fatalf("%s: a plain torch.save refused: %v", name, err)
		}
		if name != "one.pt" && (len(ts) != 7 || ts[2].Name != "hidden_state" || ts[4].DType != Float64 || len(ts[5].Shape) != 0) {
			t.Fatalf("%s: decoded %+v", name, ts)
		}
	}
}

// realTorch is /usr/bin/python3 when it has torch (Debian's python3-torch). Without it
// the test fails where CI requires torch (EXTRACT_CI_REQUIRE names it), else skips.
func realTorch(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("/usr/bin/python3", "-c", "import torch").CombinedOutput()
	if err == nil {
		return "/usr/bin/python3"
	}
	if strings.Contains(os.Getenv("EXTRACT_CI_REQUIRE"), "torch") {
		t.Fatalf("EXTRACT_CI_REQUIRE names torch but /usr/bin/python3 has none: %v %s", err, out)
	}
	t.Skipf("no torch for /usr/bin/python3 (apt-get install python3-torch): %v %s", err, out)
	return ""
}
