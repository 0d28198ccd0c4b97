package doctor

import (
	"context"
	"fmt"
	"os/exec"
	"strings"

	"github.com/extract-dev/extract/sglang"
)

// hfTestBackendEnv is the server.env key that swaps the model for a test module
// (sglang/hfserver/extract_hfserver/backend.py): then neither transformers nor a GPU is
// needed, and doctor says so instead of failing.
const hfTestBackendEnv = "HFSERVER_BACKEND"

func (d *doctor) kindTransformers() bool { return d.cfg.Server.Kind == sglang.KindTransformers }

func (d *doctor) hfTestBackend() string {
	if !d.kindTransformers() {
		return ""
	}
	return d.cfg.Server.Env[hfTestBackendEnv]
}

// usesGPUs says whether the GPU checks apply: SGLang, and a transformers server that
// loads a real model.
func (d *doctor) usesGPUs() bool {
	return d.kindSGLang() || (d.kindTransformers() && d.hfTestBackend() == "")
}

// checkTransformers asks the server's own Python, in the environment the server will
// get (CUDA_VISIBLE_DEVICES from server.gpus, server.env), whether torch and
// transformers import, CUDA sees the GPUs, the model folder's config loads and matches
// the job, and the weights fit in the free GPU memory.
func (d *doctor) checkTransformers(ctx context.Context) []Check {
	if !d.kindTransformers() {
		return nil
	}
	s := d.cfg.Server
	fixPy := "install torch and transformers into a Python 3 and set server.python to it"
	path, err := exec.LookPath(s.Python)
	if err != nil {
		return []Check{failCheck("python", fixPy, "server.python %q: %v", s.Python, err)}
	}
	spec := d.opt.Job.Launch
	ctx, cancel := context.WithTimeoutCause(ctx, doctorPythonTimeout, fmt.Errorf("no answer in %v", doctorPythonTimeout))
	defer cancel()
	f, err := sglang.ProbeTransformers(ctx, path, spec.Environ(), s.ModelPath, s.Transformers.Dtype)
	if err != nil {
		return []Check{failCheck("python", fixPy, "%v", err)}
	}
	var checks []Check
	if f.TorchErr != "" {
		return append(checks, failCheck("torch", fixPy, "%s (Python %s) cannot import torch: %s", path, f.Python, f.TorchErr))
	}
	checks = append(checks, okCheck("torch", "torch %s in %s (Python %s)", f.Torch, path, f.Python))
	if b := d.hfTestBackend(); b != "" {
		return append(checks, warnCheck("transformers", "remove "+hfTestBackendEnv+" from server.env to load server.model_path",
			"not checked: server.env %s=%s loads a test module instead of a transformers model", hfTestBackendEnv, b))
	}
	if f.TransErr != "" {
		checks = append(checks, failCheck("transformers", fixPy, "%s cannot import transformers: %s", path, f.TransErr))
	} else {
		checks = append(checks, okCheck("transformers", "transformers %s", f.Transformers))
	}
	visible := "all"
	if len(s.GPUs) > 0 {
		visible = joinGPUIndices(s.GPUs)
	}
	switch {
	case f.CUDAErr != "":
		checks = append(checks, failCheck("cuda", "check the driver with nvidia-smi and that torch is a CUDA build", "torch %s: %s", f.Torch, f.CUDAErr))
	case !f.CUDA:
		checks = append(checks, failCheck("cuda", "install a CUDA build of torch and check the driver with nvidia-smi",
			"torch %s sees no CUDA device (GPUs %s visible); the model would load on the CPU", f.Torch, visible))
	case len(f.Devices) < s.TPSize:
		checks = append(checks, failCheck("cuda", "set server.gpus and server.tp_size to GPUs this node has",
			"torch sees %d GPU(s) (%s visible), server.tp_size is %d", len(f.Devices), visible, s.TPSize))
	default:
		checks = append(checks, okCheck("cuda", "torch sees %d GPU(s): %s", len(f.Devices), f.Devices[0].Name))
	}
	checks = append(checks, d.checkTransformersModel(f))
	if f.CUDA && len(f.Devices) > 0 {
		checks = append(checks, d.checkTransformersMemory(f))
	}
	return checks
}

func (d *doctor) checkTransformersModel(f sglang.TransformersFacts) Check {
	const name = "model config"
	s := d.cfg.Server
	if f.ConfigErr != "" {
		return failCheck(name, "set server.model_path to a local model folder with config.json (nothing is downloaded)",
			"transformers cannot load the config of %s: %s", s.ModelPath, f.ConfigErr)
	}
	if f.TransErr != "" {
		return failCheck(name, "install transformers", "config of %s not read: transformers is missing", s.ModelPath)
	}
	var wrong []string
	if f.HiddenSize != s.HiddenSize {
		wrong = append(wrong, fmt.Sprintf("hidden_size %d (server.hidden_size is %d)", f.HiddenSize, s.HiddenSize))
	}
	if f.NumLayers != s.NumLayers {
		wrong = append(wrong, fmt.Sprintf("num_hidden_layers %d (server.num_layers is %d)", f.NumLayers, s.NumLayers))
	}
	if len(wrong) > 0 {
		return failCheck(name, "set server.hidden_size, server.num_layers and server.layers for this model",
			"%s (%s) says %s", s.ModelPath, f.ModelType, strings.Join(wrong, ", "))
	}
	return okCheck(name, "%s (%s %s, hidden %d, %d layers)", s.ModelPath, f.ModelType, strings.Join(f.Architectures, ","), f.HiddenSize, f.NumLayers)
}

// checkTransformersMemory compares the weights, in the dtype they load in, with the free
// memory of the GPUs the server will see: one for tp_size 1, all of them split by
// device_map otherwise. Activations of a batch come on top (server.transformers.max_batch_tokens).
func (d *doctor) checkTransformersMemory(f sglang.TransformersFacts) Check {
	const name = "gpu memory"
	s := d.cfg.Server
	if f.WeightErr != "" || f.WeightBytes == 0 {
		why := f.WeightErr
		if why == "" {
			why = "no *.safetensors weights"
		}
		return warnCheck(name, "keep the weights as *.safetensors in server.model_path", "weight size of %s unknown: %s", s.ModelPath, why)
	}
	n := min(max(s.TPSize, 1), len(f.Devices))
	var free int64
	for _, dev := range f.Devices[:n] {
		free += dev.Free
	}
	if f.WeightBytes > free {
		return failCheck(name, "free the GPUs, add GPUs (server.tp_size, server.gpus), or use a smaller model",
			"weights need %s in %s, the %d GPU(s) the server uses have %s free", fmtSize(f.WeightBytes), s.Transformers.Dtype, n, fmtSize(free))
	}
	return okCheck(name, "weights %s in %s, %s free on %d GPU(s)", fmtSize(f.WeightBytes), s.Transformers.Dtype, fmtSize(free), n)
}
