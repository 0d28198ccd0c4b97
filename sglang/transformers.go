package sglang

import (
	"context"
	"embed"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/extract-dev/extract/internal/atomicfile"
)

// hfServerFiles is the transformers server (hfserver/extract_hfserver), installed next to
// the dump hook so that it imports the hook's writer.py: one writer for both servers.
//
//go:embed hfserver/extract_hfserver/*.py
var hfServerFiles embed.FS

// TransformersSpec configures kind transformers.
type TransformersSpec struct {
	// MaxBatchTokens bounds one forward: the longest prompt of a batch times its number
	// of prompts (right padding). A longer prompt runs alone.
	MaxBatchTokens   int
	MaxBatchRequests int
	// Dtype is the torch dtype the weights load in ("bfloat16").
	Dtype string
	// AttnImplementation is passed to from_pretrained when set ("sdpa", "eager").
	AttnImplementation string
}

// transformersEnv keeps the server off the network whatever the environment says: a
// model folder that is incomplete fails at load instead of downloading.
var transformersEnv = []string{"HF_HUB_OFFLINE=1", "TRANSFORMERS_OFFLINE=1"}

// transformersOwnFlags are set by transformersArgv from the config; an extra arg naming
// one would override the config behind its back.
var transformersOwnFlags = map[string]string{
	"--model-path": "server.model_path", "--host": "server.host", "--port": "server.port",
	"--tp-size": "server.tp_size", "--shm-dir": "shm_dir", "--layers": "server.layers",
	"--max-batch-tokens": "server.transformers.max_batch_tokens", "--max-batch-requests": "server.transformers.max_batch_requests",
	"--dtype": "server.transformers.dtype", "--attn-implementation": "server.transformers.attn_implementation",
}

func (t TransformersSpec) problems(extra []string) []string {
	var bad []string
	if t.MaxBatchTokens < 1 || t.MaxBatchRequests < 1 {
		bad = append(bad, fmt.Sprintf("transformers max batch tokens %d and requests %d must be positive", t.MaxBatchTokens, t.MaxBatchRequests))
	}
	if t.Dtype == "" {
		bad = append(bad, "transformers dtype is empty")
	}
	for _, a := range extra {
		name, _, _ := strings.Cut(a, "=")
		if key, ok := transformersOwnFlags[name]; ok {
			bad = append(bad, fmt.Sprintf("extra arg %q is not allowed: set %s instead", a, key))
		}
	}
	return bad
}

func (s LaunchSpec) transformersArgv(python, port string) []string {
	t := s.Transformers
	argv := []string{python, "-m", "extract_hfserver",
		"--model-path", s.ModelPath, "--host", s.Host, "--port", port,
		"--tp-size", strconv.Itoa(s.TPSize), "--shm-dir", s.ShmDir, "--layers", joinLayers(s.Layers),
		"--max-batch-tokens", strconv.Itoa(t.MaxBatchTokens), "--max-batch-requests", strconv.Itoa(t.MaxBatchRequests),
		"--dtype", t.Dtype}
	if t.AttnImplementation != "" {
		argv = append(argv, "--attn-implementation", t.AttnImplementation)
	}
	return argv
}

// installPython writes the Python the server of this kind imports into HookDir: the
// dump hook for SGLang; the hook (for its writer) and the transformers server for kind
// transformers.
func (s LaunchSpec) installPython() error {
	switch s.Kind {
	case KindSGLang:
		return InstallHook(s.HookDir)
	case KindTransformers:
		if err := InstallHook(s.HookDir); err != nil {
			return err
		}
		return InstallTransformersServer(s.HookDir)
	}
	return nil
}

// TransformersServerFS is the transformers server shipped in this binary, rooted so
// that extract_hfserver/ is at its top.
func TransformersServerFS() fs.FS {
	sub, err := fs.Sub(hfServerFiles, "hfserver")
	if err != nil {
		panic(err) // "hfserver" is a constant, valid path
	}
	return sub
}

// InstallTransformersServer writes extract_hfserver into dir, each file atomically.
func InstallTransformersServer(dir string) error {
	return fs.WalkDir(TransformersServerFS(), ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		dst := filepath.Join(dir, path)
		if d.IsDir() {
			return os.MkdirAll(dst, 0o755)
		}
		b, err := fs.ReadFile(TransformersServerFS(), path)
		if err != nil {
			return err
		}
		if err := atomicfile.WriteFile(dst, b, 0o644); err != nil {
			return fmt.Errorf("install transformers server: %w", err)
		}
		return nil
	})
}

// TransformersFacts is what the server's Python says about itself and the model, for
// doctor to judge: each field is a fact, Err* fields say why one could not be had.
type TransformersFacts struct {
	Python       string `json:"python"`
	Torch        string `json:"torch"`
	TorchErr     string `json:"torch_error"`
	Transformers string `json:"transformers"`
	TransErr     string `json:"transformers_error"`
	CUDA         bool   `json:"cuda"`
	CUDAErr      string `json:"cuda_error"`
	// Devices are the GPUs visible to the server (after CUDA_VISIBLE_DEVICES).
	Devices []struct {
		Name  string `json:"name"`
		Total int64  `json:"total"`
		Free  int64  `json:"free"`
	} `json:"devices"`
	ModelType     string   `json:"model_type"`
	Architectures []string `json:"architectures"`
	HiddenSize    int      `json:"hidden_size"`
	NumLayers     int      `json:"num_layers"`
	ConfigErr     string   `json:"config_error"`
	// WeightBytes is the size of the weights in Dtype: parameter count from the
	// safetensors headers times the dtype's width; 0 when there are no safetensors files.
	WeightBytes int64  `json:"weight_bytes"`
	WeightErr   string `json:"weight_error"`
}

// probeTransformersPy prints TransformersFacts as JSON. It must run in any Python 3:
// every import that can fail is caught and reported.
const probeTransformersPy = `
import glob, json, os, struct, sys
model, dtype = sys.argv[1], sys.argv[2]
os.environ["HF_HUB_OFFLINE"] = "1"; os.environ["TRANSFORMERS_OFFLINE"] = "1"
f = {"python": sys.version.split()[0]}
try:
    import torch
    f["torch"] = torch.__version__
    try:
        f["cuda"] = bool(torch.cuda.is_available())
        f["devices"] = []
        for i in range(torch.cuda.device_count() if f["cuda"] else 0):
            free, total = torch.cuda.mem_get_info(i)
            f["devices"].append({"name": torch.cuda.get_device_name(i), "total": total, "free": free})
    except Exception as e:
        f["cuda_error"] = "%s: %s" % (type(e).__name__, e)
except Exception as e:
    f["torch_error"] = "%s: %s" % (type(e).__name__, e)
try:
    import transformers
    f["transformers"] = transformers.__version__
    try:
        c = transformers.AutoConfig.from_pretrained(model, local_files_only=True)
        t = c.get_text_config() if hasattr(c, "get_text_config") else c
        f["model_type"] = getattr(c, "model_type", "")
        f["architectures"] = list(getattr(c, "architectures", None) or [])
        f["hidden_size"] = int(getattr(t, "hidden_size", 0) or 0)
        f["num_layers"] = int(getattr(t, "num_hidden_layers", 0) or 0)
    except Exception as e:
        f["config_error"] = "%s: %s" % (type(e).__name__, str(e).splitlines()[0] if str(e) else "")
except Exception as e:
    f["transformers_error"] = "%s: %s" % (type(e).__name__, e)
width = {"bfloat16": 2, "float16": 2, "float32": 4}.get(dtype, 2)
try:
    n = 0
    for p in sorted(glob.glob(os.path.join(model, "*.safetensors"))):
        with open(p, "rb") as fh:
            (size,) = struct.unpack("<Q", fh.read(8))
            for k, v in json.loads(fh.read(size)).items():
                if k != "__metadata__":
                    c = 1
                    for d in v["shape"]:
                        c *= d
                    n += c
    f["weight_bytes"] = n * width
except Exception as e:
    f["weight_error"] = "%s: %s" % (type(e).__name__, e)
print(json.dumps(f))
`

// ProbeTransformers runs python (with env) to find torch, transformers, the visible
// GPUs and their free memory, the model folder's config and the size of its weights.
func ProbeTransformers(ctx context.Context, python string, env []string, modelPath, dtype string) (TransformersFacts, error) {
	cmd := exec.CommandContext(ctx, python, "-c", probeTransformersPy, modelPath, dtype)
	cmd.Env = env
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		if cause := context.Cause(ctx); cause != nil {
			err = fmt.Errorf("%w (%w)", err, cause)
		}
		return TransformersFacts{}, fmt.Errorf("%s: %w: %s", python, err, lastLine([]byte(stderr.String())))
	}
	var f TransformersFacts
	if err := json.Unmarshal(out, &f); err != nil {
		return TransformersFacts{}, fmt.Errorf("%s: probe printed %q: %w", python, lastLine(out), err)
	}
	return f, nil
}
