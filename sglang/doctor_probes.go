package sglang

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// This file holds what a triage (extract doctor) asks about the server's side of the
// node: who holds a GPU and how to stop it, the model's shape, the Python that would
// run the server, and the port. Each function returns facts; judging them is the
// caller's business.

// maxCmdline bounds a command line quoted in a description: a Python server's argv can
// run to kilobytes.
const maxCmdline = 200

// idleGPUMemory is what a GPU may show used with no process listed (driver reservations,
// ECC, contexts of the driver itself) before a hidden holder is suspected.
const idleGPUMemory = 1 << 30

// HiddenHolder reports whether g's used memory points at a process NVML does not list,
// as happens for a process in another container or VM.
func (g GPU) HiddenHolder() bool {
	return len(g.Processes) == 0 && g.MemoryUsed > idleGPUMemory
}

// Describe names the process for an operator: "pid N (cmdline) [75.0 GiB, systemd unit
// vllm.service]".
func (p GPUProcess) Describe() string {
	var b strings.Builder
	fmt.Fprintf(&b, "pid %d", p.PID)
	if p.Cmdline != nil {
		cmd := strings.Join(p.Cmdline, " ")
		if len(cmd) > maxCmdline {
			cmd = cmd[:maxCmdline] + "…"
		}
		fmt.Fprintf(&b, " (%s)", cmd)
	} else if !p.Exited {
		b.WriteString(" (not visible in /proc here)")
	}
	if p.Exited {
		b.WriteString(" (exited; the driver still lists it)")
	}
	var attrs []string
	if p.MemoryKnown {
		attrs = append(attrs, formatBytes(p.UsedMemory))
	}
	if p.Unit != "" {
		kind := "systemd unit"
		if p.UserUnit {
			kind = "systemd user unit"
		}
		attrs = append(attrs, kind+" "+p.Unit)
	}
	if p.DeviceUnconfirmed {
		attrs = append(attrs, "holds no /dev/nvidia* file here, so NVML's pid may be another PID namespace's")
	}
	if len(attrs) > 0 {
		fmt.Fprintf(&b, " [%s]", strings.Join(attrs, ", "))
	}
	return b.String()
}

// StopHint says how to stop the process for good: a systemd service comes back on the
// next boot (as vLLM did after the incident) unless it is disabled, so it names the unit
// rather than the pid.
func (p GPUProcess) StopHint() string {
	switch {
	case p.Exited && p.Parent == 1:
		return fmt.Sprintf("pid %d has exited and its parent, pid 1, does not reap it: run the container with an init that does (docker run --init, tini)", p.PID)
	case p.Exited:
		return fmt.Sprintf("pid %d has exited and its parent, pid %d, has not reaped it: stop pid %d (its GPU memory is freed with the exited one)", p.PID, p.Parent, p.Parent)
	case p.Cmdline == nil:
		return fmt.Sprintf("pid %d is not visible here (NVML reports host pids inside a container): find and stop it with `nvidia-smi` on the host", p.PID)
	case p.Unit != "" && p.UserUnit:
		return fmt.Sprintf("as the user that owns pid %d: systemctl --user disable --now %s", p.PID, p.Unit)
	case p.Unit != "":
		return fmt.Sprintf("sudo systemctl disable --now %s (stops it and keeps it from starting at boot)", p.Unit)
	case p.DeviceUnconfirmed:
		return fmt.Sprintf("first make sure pid %d is the GPU process (`nvidia-smi` on the host), then: kill %d", p.PID, p.PID)
	}
	return fmt.Sprintf("kill %d (kill -9 %d if it does not exit)", p.PID, p.PID)
}

// formatBytes writes n in binary units as configs.ByteSize does ("75.0 GiB"); sglang
// does not import configs for one formatter.
func formatBytes(n uint64) string {
	v := float64(n)
	for _, u := range []string{"B", "KiB", "MiB", "GiB"} {
		if v < 1024 {
			if u == "B" {
				return fmt.Sprintf("%d B", n)
			}
			return fmt.Sprintf("%.1f %s", v, u)
		}
		v /= 1024
	}
	return fmt.Sprintf("%.1f TiB", v)
}

// ErrModelConfig marks a model folder whose config.json is unreadable as JSON, as
// opposed to one that is missing.
var ErrModelConfig = errors.New("invalid model config")

// ModelShape is what a model folder says about the model: its config.json's
// architecture and the dimensions that decide a dump's width, and how many weight
// files lie beside it.
type ModelShape struct {
	// ConfigPath is the config.json that was read.
	ConfigPath    string
	Architectures []string
	// HiddenSize, NumLayers and VocabSize are 0 when config.json does not give them.
	HiddenSize int
	NumLayers  int
	VocabSize  int
	// Nested names the sub-config the language model's shape came from
	// ("text_config" for Kimi-K2.5), "" when it is at the top level.
	Nested string
	// WeightFiles counts *.safetensors and *.bin files in the folder.
	WeightFiles int
}

// modelDims are the config.json fields of a language model's shape.
type modelDims struct {
	HiddenSize int `json:"hidden_size"`
	NumLayers  int `json:"num_hidden_layers"`
	VocabSize  int `json:"vocab_size"`
}

// nestedConfigs are the keys under which multimodal models keep their language model's
// config, in the order they are tried: transformers' text_config (Kimi-K2.5, Llama 4,
// Qwen2.5-VL), DeepSeek-VL2's language_config, InternVL's llm_config.
var nestedConfigs = []string{"text_config", "language_config", "llm_config"}

// ReadModelShape reads modelPath/config.json. A field missing at the top level is taken
// from the first nested language-model config that has it, so a multimodal wrapper such
// as Kimi-K2.5 (hidden_size and num_hidden_layers under text_config) reports the shape
// of the model whose hidden states are captured. A missing folder or file is an error
// wrapping fs.ErrNotExist; malformed JSON wraps ErrModelConfig.
func ReadModelShape(modelPath string) (ModelShape, error) {
	st, err := os.Stat(modelPath)
	if err != nil {
		return ModelShape{}, fmt.Errorf("model folder: %w", err)
	}
	if !st.IsDir() {
		return ModelShape{}, fmt.Errorf("model path %s is not a folder", modelPath)
	}
	shape := ModelShape{ConfigPath: filepath.Join(modelPath, "config.json")}
	b, err := os.ReadFile(shape.ConfigPath)
	if err != nil {
		return shape, err
	}
	var top struct {
		Architectures []string `json:"architectures"`
		modelDims
	}
	var nested map[string]json.RawMessage
	if err := json.Unmarshal(b, &top); err != nil {
		return shape, fmt.Errorf("%w: %s is not valid JSON: %w", ErrModelConfig, shape.ConfigPath, err)
	}
	if err := json.Unmarshal(b, &nested); err != nil {
		return shape, fmt.Errorf("%w: %s is not a JSON object: %w", ErrModelConfig, shape.ConfigPath, err)
	}
	shape.Architectures = top.Architectures
	dims := top.modelDims
	for _, key := range nestedConfigs {
		raw, ok := nested[key]
		if !ok || dims.HiddenSize != 0 && dims.NumLayers != 0 {
			continue
		}
		var sub modelDims
		if err := json.Unmarshal(raw, &sub); err != nil {
			return shape, fmt.Errorf("%w: %s: %s: %w", ErrModelConfig, shape.ConfigPath, key, err)
		}
		took := false
		for _, f := range []struct{ dst, src *int }{
			{&dims.HiddenSize, &sub.HiddenSize},
			{&dims.NumLayers, &sub.NumLayers},
			{&dims.VocabSize, &sub.VocabSize},
		} {
			if *f.dst == 0 && *f.src != 0 {
				*f.dst, took = *f.src, true
			}
		}
		if took && shape.Nested == "" {
			shape.Nested = key
		}
	}
	shape.HiddenSize, shape.NumLayers, shape.VocabSize = dims.HiddenSize, dims.NumLayers, dims.VocabSize
	for _, pat := range []string{"*.safetensors", "*.bin"} {
		m, _ := filepath.Glob(filepath.Join(modelPath, pat))
		shape.WeightFiles += len(m)
	}
	return shape, nil
}

// ErrNoSGLang: the interpreter runs but has no sglang package.
var ErrNoSGLang = errors.New("cannot import sglang")

// pythonProbe prints the installed SGLang's version without importing it (an import
// takes seconds and may touch the GPUs), or "missing".
const pythonProbe = `import importlib.util, importlib.metadata
spec = importlib.util.find_spec("sglang")
if spec is None or spec.origin is None:  # None, or a bare folder named sglang (namespace package)
    print("missing")
else:
    try:
        print(importlib.metadata.version("sglang"))
    except importlib.metadata.PackageNotFoundError:
        print("unknown version")
`

// ProbePython asks the interpreter python (a name on PATH or a path), run with env (nil:
// ours) as the server would be, which SGLang it has. The version is "unknown version"
// when the package carries no metadata; an interpreter without SGLang gives ErrNoSGLang.
// ctx bounds the probe: an interpreter on a hung network filesystem never answers.
func ProbePython(ctx context.Context, python string, env []string) (version string, err error) {
	path, err := exec.LookPath(python)
	if err != nil {
		return "", err
	}
	cmd := exec.CommandContext(ctx, path, "-c", pythonProbe)
	// Not our working dir: Python puts it first on sys.path, and a folder there named
	// sglang (as in extract's own source tree) would pass for the package.
	cmd.Env, cmd.Dir = env, "/"
	// The probe's whole group goes when ctx ends, and a child that kept stdout open
	// cannot hold us past it either.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = time.Second
	out, err := cmd.Output()
	if err != nil {
		if ctx.Err() != nil {
			return "", fmt.Errorf("%s -c <probe>: %w", path, context.Cause(ctx))
		}
		var ee *exec.ExitError
		if errors.As(err, &ee) && len(ee.Stderr) > 0 {
			return "", fmt.Errorf("%s -c <probe>: %w: %s", path, err, lastLine(ee.Stderr))
		}
		return "", fmt.Errorf("%s -c <probe>: %w", path, err)
	}
	v := strings.TrimSpace(string(out))
	if v == "missing" {
		return "", fmt.Errorf("%s: %w", path, ErrNoSGLang)
	}
	return v, nil
}

func lastLine(b []byte) string {
	s := strings.TrimSpace(string(b))
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	return s
}

// PortUse is whether the server's address can be listened on, and who holds it when not.
type PortUse struct {
	Addr  string
	InUse bool
	// Holder is "pid N (cmdline)", or "" when /proc does not tell (another user's
	// process, another network namespace); HolderPID is N.
	Holder    string
	HolderPID int
	// ServerID is the holder's EXTRACT_SERVER_ID: a server that an extract launched
	// (another job's, another shard's), not a stranger.
	ServerID string
	// TimeWait: connections in TIME_WAIT hold the port and no process does; the
	// kernel frees it within a minute.
	TimeWait bool
}

// Who says who holds the port, for messages: a process, which extract did not start
// unless it carries a server id; connections in TIME_WAIT; or someone /proc does not name.
func (u PortUse) Who() string {
	switch {
	case u.Holder != "" && u.ServerID != "":
		return fmt.Sprintf("%s, a server that extract launched (server id %s) for another job or shard, or before its record was lost", u.Holder, u.ServerID)
	case u.Holder != "":
		return u.Holder + ", which extract did not start"
	case u.TimeWait:
		return "connections in TIME_WAIT and no process (the kernel frees the port within a minute of their close)"
	}
	return "a process that /proc does not name (another user's, or in another network namespace)"
}

// ProbePort tries to listen on host:port as the server would. An address in use is a
// fact (InUse); any other failure, such as a host that is not this machine's, is the error.
func ProbePort(host string, port int) (PortUse, error) {
	u := PortUse{Addr: net.JoinHostPort(host, strconv.Itoa(port))}
	// A listener that no /proc entry names is a process in the middle of exiting (an
	// OOM-killed server whose fds are being torn down): give it a moment before calling
	// the port taken, or a cron restart right after the kill would be refused.
	deadline := time.Now().Add(unnamedHolderWait)
	for {
		ln, err := net.Listen("tcp", u.Addr)
		if err == nil {
			return PortUse{Addr: u.Addr}, ln.Close()
		}
		if !errors.Is(err, syscall.EADDRINUSE) {
			return u, err
		}
		u.InUse = true
		pid, cmd, timeWait := portHolder(port)
		u.Holder, u.HolderPID, u.TimeWait, u.ServerID = "", pid, timeWait, ""
		if pid > 0 {
			u.Holder, u.ServerID = fmt.Sprintf("pid %d (%s)", pid, cmd), serverIDOf(pid)
		}
		if pid > 0 || time.Now().After(deadline) {
			return u, nil
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// unnamedHolderWait bounds the wait for a port held by a process that /proc no longer names.
const unnamedHolderWait = 3 * time.Second
