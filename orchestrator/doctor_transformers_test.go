package orchestrator

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/extract-dev/extract/configs"
	"github.com/extract-dev/extract/doctor"
	"github.com/extract-dev/extract/internal/testsupport"
	"github.com/extract-dev/extract/sglang"
)

// transformersDoctorConfig is a kind transformers job on GPU 0 whose server.python is a
// stand-in that prints the probe's facts as given.
func transformersDoctorConfig(t *testing.T, facts map[string]any) *configs.Config {
	cfg := doctorConfig(t, sglang.KindTransformers, tokenLines(4, 10))
	dir := t.TempDir()
	cfg.Server.GPUs, cfg.Server.TPSize = []int{0}, 1
	cfg.Server.ModelPath = filepath.Join(dir, "model")
	mustWriteFile(t, filepath.Join(cfg.Server.ModelPath, "config.json"), fmt.Sprintf(`{"architectures":["LlamaForCausalLM"],"hidden_size":%d,"num_hidden_layers":61}`, testHidden))
	mustWriteFile(t, filepath.Join(cfg.Server.ModelPath, "model.safetensors"), "weights")
	b, _ := json.Marshal(facts)
	cfg.Server.Python = filepath.Join(dir, "python3")
	mustWriteFile(t, cfg.Server.Python, "#!/bin/sh\ncat <<'EOF'\n"+string(b)+"\nEOF\n")
	if err := os.Chmod(cfg.Server.Python, 0o755); err != nil {
		t.Fatal(err)
	}
	return cfg
}

func TestDoctorForTransformersJudgesThePythonsFactsAndNamesOurServerOnTheGPU(t *testing.T) {
	cfg := transformersDoctorConfig(t, map[string]any{
		"python": "3.12.3", "torch": "2.11.0", "transformers": "5.17.0", "cuda": true,
		"devices":    []map[string]any{{"name": "NVIDIA H200", "total": 150 << 30, "free": 10 << 30}},
		"model_type": "llama", "architectures": []string{"LlamaForCausalLM"}, "hidden_size": testHidden, "num_layers": 61,
		"weight_bytes": 20 << 30,
	})
	const serverID = "0123456789abcdef"
	pid := startSleep(t, "EXTRACT_SERVER_ID="+serverID)
	boot, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		t.Fatal(err)
	}
	rec, _ := json.Marshal(map[string]any{"pid": pid, "pgid": pid, "boot_id": strings.TrimSpace(string(boot)), "server_id": serverID, "port": cfg.Server.Port, "argv": []string{"sleep", "60"}})
	mustWriteFile(t, filepath.Join(cfg.StateDir, "server.json"), string(rec))
	holders := map[int][]nvml.ProcessInfo{0: {{Pid: uint32(pid), UsedGpuMemory: 40 * gpuGiB}}}

	rep := runDoctor(t, cfg, doctor.Options{GPUs: sglang.NewGPUInspector(h200Node(holders))})

	wantCheck(t, rep, "gpu 0", doctor.CheckOK, fmt.Sprintf("held by our server (pid %d)", pid))
	wantCheck(t, rep, "torch", doctor.CheckOK, "torch 2.11.0")
	wantCheck(t, rep, "transformers", doctor.CheckOK, "transformers 5.17.0")
	wantCheck(t, rep, "cuda", doctor.CheckOK, "NVIDIA H200")
	wantCheck(t, rep, "model config", doctor.CheckOK, "llama")
	wantCheck(t, rep, "gpu memory", doctor.CheckFail, "weights need 20.0 GiB", "10.0 GiB free")
	if rep.OK {
		t.Errorf("weights that do not fit pass the report:\n%s", reportJSON(rep))
	}
}

func TestDoctorForTransformersFailsWithoutCUDAOrTransformers(t *testing.T) {
	cfg := transformersDoctorConfig(t, map[string]any{
		"python": "3.12.3", "torch": "2.11.0+cpu", "transformers_error": "ModuleNotFoundError: No module named 'transformers'", "cuda": false,
	})
	rep := runDoctor(t, cfg, doctor.Options{GPUs: sglang.NewGPUInspector(h200Node(nil))})
	wantCheck(t, rep, "transformers", doctor.CheckFail, "No module named 'transformers'")
	wantCheck(t, rep, "cuda", doctor.CheckFail, "sees no CUDA device")
	wantCheck(t, rep, "model config", doctor.CheckFail, "transformers is missing")
}

// The e2e tests swap the model for a tiny torch module (not transformers) through
// server.env; doctor then needs neither transformers nor a GPU, and says so.
func TestDoctorForTransformersWithATestModuleChecksOnlyTorch(t *testing.T) {
	py := ""
	for _, c := range []string{"python3", "/usr/bin/python3"} {
		if p, err := exec.LookPath(c); err == nil && exec.Command(p, "-c", "import torch").Run() == nil {
			py = p
			break
		}
	}
	if py == "" {
		testsupport.Unavailable(t, testsupport.TransformersServer, "no python3 here imports torch (apt-get install python3-torch)")
	}
	cfg := doctorConfig(t, sglang.KindTransformers, tokenLines(4, 10))
	cfg.Server.Python, cfg.Server.ModelPath = py, "tiny"
	cfg.Server.Env = map[string]string{"HFSERVER_BACKEND": "tinymodel:load"}
	rep := runDoctor(t, cfg, doctor.Options{})
	wantCheck(t, rep, "gpu", doctor.CheckOK, "none needed")
	wantCheck(t, rep, "torch", doctor.CheckOK, "torch ")
	wantCheck(t, rep, "transformers", doctor.CheckWarn, "not checked", "HFSERVER_BACKEND=tinymodel:load")
}
