package main

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/extract-dev/extract/checkpoint"
	"github.com/extract-dev/extract/internal/safetensors"
	"github.com/extract-dev/extract/internal/testsupport"
)

// These tests run server.kind transformers through the real orchestrator and the real
// Python server (sglang/hfserver), with its model call swapped for a tiny torch module
// through server.env HFSERVER_BACKEND. That module is NOT transformers (CI has no
// transformers): its hidden states are a closed form (sglang/hfserver/tinymodel.py),
// so every output can be checked exactly. scripts/device_transformers.sh runs a real
// transformers model on a GPU.

const (
	tinyLayers = 4
	tinyHidden = 16
)

var tinyCaptured = []int{1, 2, 3}

// torchPython finds a Python that imports torch (Debian's python3-torch), or skips.
func torchPython(t *testing.T) string {
	t.Helper()
	testsupport.Require(t, testsupport.TransformersServer)
	return testsupport.TorchPython()
}

// newTransformersJob is newJob with a config for kind transformers over the tiny module.
func newTransformersJob(t *testing.T, n int, delay string) *job {
	t.Helper()
	py := torchPython(t)
	j := newJob(t, n, 0)
	j.hidden = tinyHidden
	hfserver, err := filepath.Abs(filepath.Join("..", "..", "sglang", "hfserver"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := fmt.Sprintf(`dataset: data.jsonl
output_dir: out
server:
  kind: transformers
  model_path: tiny-model
  python: %s
  num_layers: %d
  hidden_size: %d
  layers: [1, 2, 3]
  startup_timeout: 2m
  health_interval: 1s
  env:
    HFSERVER_BACKEND: "tinymodel:load"
    PYTHONPATH: %s
    TINY_DELAY: "%s"
  transformers:
    max_batch_tokens: 4096
    max_batch_requests: 8
run:
  max_inflight: 16
  movers: 2
  dump_timeout: 20s
disk:
  reserve: 1MiB
`, py, tinyLayers, tinyHidden, hfserver, delay)
	if err := os.WriteFile(j.config, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	return j
}

// bf16 encodes v, which the tiny module keeps exact in bf16 (integers and halves < 256).
func bf16(v float64) uint16 { return uint16(math.Float32bits(float32(v)) >> 16) }

// tinyRows are the tiny module's rows for one prompt: aux [T, 3H] and final [T, H].
func tinyRows(ids []int64) (aux, final []byte) {
	for p, tok := range ids {
		step := float64((p + 1) % 8)
		base := make([]float64, tinyHidden)
		for c := range base {
			base[c] = float64((tok + int64(c)) % 64)
		}
		for _, k := range tinyCaptured {
			for _, b := range base {
				aux = binary.LittleEndian.AppendUint16(aux, bf16(b+float64(k)*step))
			}
		}
		for _, b := range base {
			final = binary.LittleEndian.AppendUint16(final, bf16((b+tinyLayers*step)/2))
		}
	}
	return aux, final
}

// checkTiny checks every output against the dataset and the tiny module's closed form,
// and that nothing else is in the output or staging dirs.
func (j *job) checkTiny() (bad int) {
	j.t.Helper()
	for i, s := range j.samples {
		if err := j.checkTinyFile(checkpoint.OutputPath(j.out, i), i, s); err != nil {
			j.t.Errorf("sample %d: %v", i, err)
			bad++
		}
	}
	files := 0
	filepath.WalkDir(j.out, func(path string, d os.DirEntry, err error) error {
		if d != nil && d.IsDir() && path == j.state {
			return filepath.SkipDir
		}
		if err == nil && !d.IsDir() {
			files++
		}
		return err
	})
	if files != len(j.samples) {
		j.t.Errorf("%d files in the output for %d samples", files, len(j.samples))
		bad++
	}
	entries, _ := os.ReadDir(j.shmDir)
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), ".hook-") {
			j.t.Errorf("staging dir not empty: %s", e.Name())
			bad++
		}
	}
	return bad
}

func (j *job) checkTinyFile(path string, idx int, s sample) error {
	info, err := checkpoint.ReadOutput(path, true)
	if err != nil {
		return err
	}
	if info.Sample != idx || info.Tokens != len(s.ids) || info.Layers != "1,2,3" || info.HiddenSize != tinyHidden {
		return fmt.Errorf("metadata says sample %d, %d tokens, layers %s, hidden %d", info.Sample, info.Tokens, info.Layers, info.HiddenSize)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	h, err := safetensors.ReadHeader(bytes.NewReader(b), int64(len(b)))
	if err != nil {
		return err
	}
	read := func(name string) []byte {
		t, _ := h.Tensor(name)
		return b[h.DataStart+t.Begin : h.DataStart+t.End]
	}
	ids := make([]byte, 0, 8*len(s.ids))
	for _, id := range s.ids {
		ids = binary.LittleEndian.AppendUint64(ids, uint64(id))
	}
	if !bytes.Equal(read("input_ids"), ids) {
		return fmt.Errorf("input_ids differ from the dataset")
	}
	aux, final := tinyRows(s.ids)
	if !bytes.Equal(read("aux_hidden_state"), aux) {
		return fmt.Errorf("aux_hidden_state differs from the tiny module's layers 1,2,3")
	}
	if !bytes.Equal(read("hidden_state"), final) {
		return fmt.Errorf("hidden_state differs from the tiny module's final state")
	}
	return nil
}

func TestTransformersKindRunsThroughTheOrchestratorAndEveryOutputIsExact(t *testing.T) {
	j := newTransformersJob(t, 60, "0.02")
	r := j.run("run")
	if r.code != 0 {
		t.Fatalf("run exit %d\n%s", r.code, r.stderr)
	}
	if bad := j.checkTiny(); bad > 0 {
		t.Fatalf("%d outputs wrong", bad)
	}
	log := mustRead(t, filepath.Join(j.state, "logs", "server.log"))
	if !strings.Contains(log, "tiny-test-module (not transformers)") || !strings.Contains(log, "extract_hfserver") {
		t.Errorf("server log does not show the transformers server with the tiny module:\n%s", log)
	}
	// run.max_inflight 16 against the server's window of 256 and batches of 8: the run
	// says, once, that 272 would fill it.
	if n := strings.Count(mustRead(t, filepath.Join(j.state, "logs", "extract.log")), `"want_max_inflight":272`); n != 1 {
		t.Errorf("the short sort window was warned of %d times, want once", n)
	}
}

// outputs counts the finished output files.
func (j *job) outputs() int {
	n := 0
	for i := range j.samples {
		if _, err := os.Stat(checkpoint.OutputPath(j.out, i)); err == nil {
			n++
		}
	}
	return n
}

func TestTransformersServerAndOrchestratorKilledMidRunResumeToExactOutputs(t *testing.T) {
	j := newTransformersJob(t, 80, "0.1")
	cmd := j.command("run")
	var errb bytes.Buffer
	cmd.Stderr = &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	waitOutputs := func(n int) {
		t.Helper()
		for deadline := time.Now().Add(2 * time.Minute); j.outputs() < n; time.Sleep(50 * time.Millisecond) {
			select {
			case err := <-exited:
				t.Fatalf("run exited before %d outputs: %v\n%s", n, err, errb.String())
			default:
			}
			if time.Now().After(deadline) {
				t.Fatalf("no %d outputs in time\n%s", n, errb.String())
			}
		}
	}
	waitOutputs(10)
	first := serverPID(j.state)
	// The server dies as a GPU fault or an OOM kill would take it: the run restarts it.
	if err := syscall.Kill(-first, syscall.SIGKILL); err != nil {
		t.Fatalf("kill server group %d: %v", first, err)
	}
	waitOutputs(30)
	second := serverPID(j.state)
	if second == first || !alive(second) {
		t.Fatalf("server pid %d after killing %d: not a new live server", second, first)
	}
	// Now the orchestrator: the server keeps running and the resumed run adopts it.
	cmd.Process.Signal(syscall.SIGKILL)
	<-exited
	r := j.run("run", "--resume")
	if r.code != 0 {
		t.Fatalf("resumed run exit %d\n%s", r.code, r.stderr)
	}
	if bad := j.checkTiny(); bad > 0 {
		t.Fatalf("%d outputs wrong after the kills", bad)
	}
	if !strings.Contains(r.stderr+mustRead(t, filepath.Join(j.state, "logs", "extract.log")), "adopting server") {
		t.Errorf("the resumed run did not adopt the live server pid %d", second)
	}
}
