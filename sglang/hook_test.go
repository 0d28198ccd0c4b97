package sglang

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/extract-dev/extract/internal/safetensors"
	"github.com/extract-dev/extract/internal/testsupport"
)

// writeDumpPy writes one dump with the hook's own writer.py from hex-encoded tensor
// bytes and prints the hook version.
const writeDumpPy = `
import sys
from extract_hook import HOOK_VERSION, writer
directory, rid, aux, hidden, ids, tokens, hidden_size = sys.argv[1:8]
writer.write_dump(
    directory, rid,
    aux=bytes.fromhex(aux), hidden=bytes.fromhex(hidden), input_ids=bytes.fromhex(ids),
    tokens=int(tokens), hidden_size=int(hidden_size),
    layers=writer.parse_layers("2,30,58"), model="/models/Kimi-K2.5",
)
print(HOOK_VERSION)
`

// TestHookWriterMakesProtocolV1Dumps runs the Python hook's unit tests and checks that
// a dump its writer makes is one that the orchestrator's safetensors reader accepts,
// with every byte where protocol v1 puts it.
func TestHookWriterMakesProtocolV1Dumps(t *testing.T) {
	python, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 is not on PATH")
	}
	hookDir, err := filepath.Abs("hook")
	if err != nil {
		t.Fatal(err)
	}
	// The real-SGLang cases drive a model per commit: minutes on a loaded machine.
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	pyEnv := hookTestEnv()

	unit := exec.CommandContext(ctx, python, "-m", "unittest", "-v")
	unit.Dir, unit.Env = hookDir, pyEnv
	unitOut, err := unit.CombinedOutput()
	if err != nil {
		t.Fatalf("python3 -m unittest in %s: %v\n%s", hookDir, err, unitOut)
	}
	checkRealSGLangCases(t, unitOut)

	const tokens, hidden = 3, 4
	aux := hookPattern(tokens*3*hidden*2, 1)
	hid := hookPattern(tokens*hidden*2, 2)
	ids := make([]byte, tokens*8)
	for i, id := range []int64{163839, 0, 42} {
		binary.LittleEndian.PutUint64(ids[i*8:], uint64(id))
	}
	dir := t.TempDir()
	const rid = "s000018421-a2"
	cmd := exec.CommandContext(ctx, python, "-c", writeDumpPy, dir, rid,
		hex.EncodeToString(aux), hex.EncodeToString(hid), hex.EncodeToString(ids), "3", "4")
	cmd.Dir, cmd.Env = hookDir, pyEnv
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("write a dump with writer.py: %v\n%s", err, stderr.String())
	}
	hookVersion := strings.TrimSpace(string(out))

	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 || entries[0].Name() != rid+".safetensors" {
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Fatalf("staging dir holds %v, want only %s.safetensors (no .partial)", names, rid)
	}
	raw, err := os.ReadFile(filepath.Join(dir, rid+".safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	h, err := safetensors.ReadHeader(bytes.NewReader(raw), int64(len(raw)))
	if err != nil {
		t.Fatalf("ReadHeader: %v", err)
	}
	if h.DataStart%8 != 0 {
		t.Errorf("data section starts at %d, not 8-aligned", h.DataStart)
	}
	var at int64
	for _, want := range []struct {
		name  string
		dtype safetensors.DType
		shape []int64
		data  []byte
	}{
		{"aux_hidden_state", safetensors.BF16, []int64{tokens, 3 * hidden}, aux},
		{"hidden_state", safetensors.BF16, []int64{tokens, hidden}, hid},
		{"input_ids", safetensors.I64, []int64{tokens}, ids},
	} {
		got, ok := h.Tensor(want.name)
		if !ok {
			t.Errorf("no tensor %s", want.name)
			continue
		}
		if got.DType != want.dtype || !slices.Equal(got.Shape, want.shape) {
			t.Errorf("%s is %s %v, want %s %v", want.name, got.DType, got.Shape, want.dtype, want.shape)
		}
		if got.Begin != at {
			t.Errorf("%s starts at %d, want %d (protocol order: aux, hidden, ids)", want.name, got.Begin, at)
		}
		at += int64(len(want.data))
		if data := raw[h.DataStart+got.Begin : h.DataStart+got.End]; !bytes.Equal(data, want.data) {
			t.Errorf("%s bytes differ:\n got %x\nwant %x", want.name, data, want.data)
		}
	}
	if len(h.Tensors) != 3 {
		t.Errorf("%d tensors, want 3", len(h.Tensors))
	}
	wantMeta := map[string]string{
		"rid": rid, "protocol": "1", "layers": "2,30,58",
		"model": "/models/Kimi-K2.5", "hook_version": hookVersion,
	}
	if len(h.Metadata) != len(wantMeta) {
		t.Errorf("metadata %v, want exactly %v", h.Metadata, wantMeta)
	}
	for k, v := range wantMeta {
		if h.Metadata[k] != v {
			t.Errorf("metadata %s = %q, want %q", k, h.Metadata[k], v)
		}
	}
	if hookVersion == "" {
		t.Error("writer printed no hook version")
	}
}

// hookTestEnv is our environment without the variables that arm the hook, and with no
// bytecode written into the source tree.
func hookTestEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "SGLANG_HS_") && !strings.HasPrefix(kv, "PYTHONPATH=") {
			env = append(env, kv)
		}
	}
	return append(env, "PYTHONDONTWRITEBYTECODE=1")
}

// checkRealSGLangCases counts the cases test_real_sglang.py ran (one per SGLang commit
// and model) in unittest's -v output and says so; where ../shared is present, or the
// kind is required, none is a failure: the file adds zero tests without a word when its
// discovery goes wrong.
func checkRealSGLangCases(t *testing.T, out []byte) {
	t.Helper()
	ran, skipped := 0, 0
	for _, line := range strings.Split(string(out), "\n") {
		if !strings.Contains(line, "(test_real_sglang.RealSGLangTest.") {
			continue
		}
		switch {
		case strings.HasSuffix(line, " ok"):
			ran++
		case strings.Contains(line, "skipped"):
			skipped++
		}
	}
	t.Logf("real-SGLang hook tests: %d ran, %d skipped", ran, skipped)
	testsupport.Count(t, testsupport.SGLangSrc, ran)
	if ran > 0 {
		return
	}
	if src := testsupport.SGLangSource(); src != "" {
		t.Errorf("%s is present but the real-SGLang hook tests ran none (%d skipped):\n%s", src, skipped, out)
	} else if testsupport.Required(testsupport.SGLangSrc) {
		t.Errorf("%s is required but ../shared/sglang-src is absent: no real-SGLang hook test ran", testsupport.SGLangSrc)
	}
}

// hookPattern is n bytes that differ from one tensor to the next, so that a swapped or
// shifted tensor cannot compare equal.
func hookPattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i)*31 + seed*7
	}
	return b
}
