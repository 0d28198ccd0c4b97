package sglang

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/extract-dev/extract/internal/testsupport"
)

// torchPython is a Python that imports torch (Debian's python3-torch on CI), or "".
func torchPython() string {
	for _, py := range []string{"python3", "/usr/bin/python3"} {
		if path, err := exec.LookPath(py); err == nil && exec.Command(path, "-c", "import torch").Run() == nil {
			return path
		}
	}
	return ""
}

func transformersSpec(t *testing.T) LaunchSpec {
	return LaunchSpec{Kind: KindTransformers, Host: "127.0.0.1", Port: 31234, ModelPath: "/models/llama", TPSize: 2,
		GPUs: []int{2, 3}, Python: "/opt/py/bin/python3", Layers: []int{2, 16, 29}, ShmDir: "/dev/shm/hs",
		HookDir: t.TempDir(), Env: map[string]string{"PYTHONPATH": "/extra"},
		Transformers: TransformersSpec{MaxBatchTokens: 8192, MaxBatchRequests: 32, Dtype: "bfloat16", AttnImplementation: "sdpa"}}
}

// TestTransformersServerUnitTestsPassWithTheTinyModule runs hfserver/test_server.py:
// the server's HTTP, batching, dumps and refusals with a tiny torch module standing in
// for the model (not transformers; CI has none).
func TestTransformersServerUnitTestsPassWithTheTinyModule(t *testing.T) {
	py := torchPython()
	if py == "" {
		testsupport.Unavailable(t, testsupport.TransformersServer, "no python3 here imports torch (apt-get install python3-torch): the server's tests need it")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, py, "-m", "unittest", "-v")
	cmd.Dir, cmd.Env = "hfserver", hookTestEnv()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s -m unittest in hfserver: %v\n%s", py, err, out)
	}
	if strings.Contains(string(out), "skipped") {
		t.Fatalf("server tests skipped with torch present:\n%s", out)
	}
}

func TestTransformersArgvCarriesTheConfigAndKeepsTheServerOffline(t *testing.T) {
	s := transformersSpec(t)
	argv, err := s.Argv()
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"/opt/py/bin/python3", "-m", "extract_hfserver", "--model-path", "/models/llama", "--host", "127.0.0.1",
		"--port", "31234", "--tp-size", "2", "--shm-dir", "/dev/shm/hs", "--layers", "2,16,29",
		"--max-batch-tokens", "8192", "--max-batch-requests", "32", "--dtype", "bfloat16", "--attn-implementation", "sdpa"}
	if !slices.Equal(argv, want) {
		t.Fatalf("argv\n got %q\nwant %q", argv, want)
	}
	env := s.addedEnv()
	for _, kv := range []string{"HF_HUB_OFFLINE=1", "TRANSFORMERS_OFFLINE=1", "CUDA_VISIBLE_DEVICES=2,3", "PYTHONPATH=" + s.HookDir + ":/extra"} {
		if !slices.Contains(env, kv) {
			t.Errorf("env %q lacks %s", env, kv)
		}
	}
	for _, kv := range env {
		if strings.HasPrefix(kv, "SGLANG_HS_") {
			t.Errorf("env has %s: the SGLang hook must stay idle in the transformers server", kv)
		}
	}
	s.ExtraArgs = []string{"--port=1", "--batch-wait", "0.01"}
	if _, err := s.Argv(); err == nil || !strings.Contains(err.Error(), "server.port") {
		t.Errorf("extra arg --port accepted: %v", err)
	}
	s.ExtraArgs = []string{"--batch-wait", "0.01"}
	if _, err := s.Argv(); err != nil {
		t.Errorf("a server flag the config does not set is refused: %v", err)
	}
}

// TestInstalledTransformersServerImportsTheHooksWriter installs what a launch installs
// and imports the server from there, in a Python without torch if that is what is here:
// the server and the writer it shares with the hook import without torch.
func TestInstalledTransformersServerImportsTheHooksWriter(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 is not on PATH")
	}
	s := transformersSpec(t)
	if err := s.installPython(); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"extract_hook/writer.py", "extract_hfserver/server.py", "extract_hfserver/__main__.py", "extract_hfserver/backend.py"} {
		if _, err := os.Stat(filepath.Join(s.HookDir, f)); err != nil {
			t.Errorf("not installed: %v", err)
		}
	}
	if _, err := os.Stat(filepath.Join(s.HookDir, "tinymodel.py")); err == nil {
		t.Error("the tiny test module is installed: it must stay out of the binary")
	}
	cmd := exec.Command(py, "-c", "import extract_hfserver.server as s, extract_hook.writer as w; assert s.writer is w; print(s.SERVER_VERSION)")
	cmd.Env = append(hookTestEnv(), "PYTHONPATH="+s.HookDir)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("import installed server: %v\n%s", err, out)
	}
}

func TestTransformersProbeReportsTorchAndAMissingTransformersAsFacts(t *testing.T) {
	py := torchPython()
	if py == "" {
		testsupport.Unavailable(t, testsupport.TransformersServer, "no python3 here imports torch (apt-get install python3-torch)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir := t.TempDir()
	f, err := ProbeTransformers(ctx, py, hookTestEnv(), dir, "bfloat16")
	if err != nil {
		t.Fatal(err)
	}
	if f.Torch == "" || f.TorchErr != "" {
		t.Errorf("torch not found by the probe: %+v", f)
	}
	if exec.Command(py, "-c", "import transformers").Run() != nil && f.TransErr == "" {
		t.Errorf("transformers is missing here but the probe says %q", f.Transformers)
	}
	if f.WeightBytes != 0 || f.WeightErr != "" {
		t.Errorf("an empty folder has %d weight bytes (%s)", f.WeightBytes, f.WeightErr)
	}
}
