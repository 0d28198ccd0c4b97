package sglang

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/extract-dev/extract/configs"
)

// Server kinds.
const (
	KindSGLang    = "sglang"
	KindSimulator = "simulator"
	// KindTransformers is extract's own Python server over a Hugging Face model
	// (transformers.go, hfserver/).
	KindTransformers = "transformers"
)

// LaunchSpec is everything that determines how the server is started. Two specs with
// the same Fingerprint start the same server.
type LaunchSpec struct {
	Kind        string
	Host        string
	Port        int
	ModelPath   string
	TPSize      int
	GPUs        []int
	MemFraction float64
	ExtraArgs   []string
	Env         map[string]string
	// Python is the interpreter for kind sglang (default "python3").
	Python string
	// Layers is the effective layers_to_capture (SpecForge's ids plus one).
	Layers []int
	ShmDir string
	// HookDir is where the dump hook shipped in this binary is installed for kind sglang;
	// it goes first on the server's PYTHONPATH, where sitecustomize.py activates it.
	HookDir      string
	Simulator    SimulatorSpec
	Transformers TransformersSpec
}

// SimulatorSpec configures kind simulator; Executable is the extract binary, whose hidden
// "simulate" command runs the simulator, and NumLayers is the model's depth it claims.
type SimulatorSpec struct {
	Executable string
	NumLayers  int
	configs.Simulator
}

// captureBreakers are SGLang flags that would break capture (or fight the ones Argv
// sets), mapped to why: the same settings the dump hook refuses at launch, refused here
// in seconds, before a server process exists. argparse accepts unique prefixes, so
// prefixes are refused too. ok, where set, names the one value that is harmless.
var captureBreakers = []struct {
	flag, why string
	ok        string
}{
	{flag: "--chunked-prefill-size", why: "chunked prefill must stay off (Argv sets -1)"},
	{flag: "--enable-two-batch-overlap", why: "two-batch overlap runs the MoE layers outside the capture loop"},
	{flag: "--disable-radix-cache", why: "Argv sets it already (a radix cache hit drops the cached prefix's rows)"},
	{flag: "--enable-dp-attention", why: "with DP attention TP rank 0 holds only its own DP group's rows"},
	{flag: "--pp-size", why: "pipeline parallel leaves no rank with both the captured layers and the final hidden states", ok: "1"},
	{flag: "--pipeline-parallel-size", why: "pipeline parallel leaves no rank with both the captured layers and the final hidden states", ok: "1"},
	{flag: "--attn-cp-size", why: "attention context parallel splits the tokens across ranks", ok: "1"},
	{flag: "--enable-attn-tp-input-scattered", why: "prefill rows would be split across TP ranks"},
	{flag: "--speculative-algorithm", why: "speculative decoding drives the same capture from its draft and verify passes"},
	{flag: "--speculative-draft-model-path", why: "speculative decoding drives the same capture from its draft and verify passes"},
	// Prefill CUDA graphs replay without the Python capture. The hook turns them off by
	// default on every SGLang that has them (#16331 made piecewise graphs default on);
	// these flags would turn them back on.
	{flag: "--enable-piecewise-cuda-graph", why: "a replayed prefill graph skips the capture"},
	{flag: "--enforce-piecewise-cuda-graph", why: "a replayed prefill graph skips the capture"},
	{flag: "--cuda-graph-backend-prefill", why: "a replayed prefill graph skips the capture", ok: "disabled"},
	{flag: "--model-path", why: "set server.model_path instead"},
	{flag: "--tp-size", why: "set server.tp_size instead"},
	{flag: "--tensor-parallel-size", why: "set server.tp_size instead"},
	{flag: "--host", why: "set server.host instead"},
	{flag: "--port", why: "set server.port instead"},
	{flag: "--mem-fraction-static", why: "set server.mem_fraction instead"},
}

// extraArgProblems lists the extra args that captureBreakers refuses. A flag's value is
// the "=value" part or the next argument.
func extraArgProblems(args []string) []string {
	var bad []string
	for i, a := range args {
		name, value, hasValue := strings.Cut(a, "=")
		if !strings.HasPrefix(name, "--") || len(name) <= 2 {
			continue
		}
		if !hasValue && i+1 < len(args) && !strings.HasPrefix(args[i+1], "--") {
			value = args[i+1]
		}
		for _, b := range captureBreakers {
			if !strings.HasPrefix(b.flag, name) {
				continue
			}
			if b.ok != "" && name == b.flag && value == b.ok {
				break
			}
			bad = append(bad, fmt.Sprintf("extra arg %q is not allowed: %s", a, b.why))
			break
		}
		if name == "--cuda-graph-config" && prefillGraphsOn(value) {
			bad = append(bad, fmt.Sprintf("extra arg %q is not allowed: a prefill backend other than \"disabled\" replays graphs that skip the capture", a))
		}
	}
	return bad
}

// prefillGraphsOn says whether a --cuda-graph-config JSON value turns a prefill CUDA
// graph on; a value that does not parse counts as on.
func prefillGraphsOn(value string) bool {
	var cfg struct {
		Prefill *struct {
			Backend *string `json:"backend"`
		} `json:"prefill"`
	}
	if err := json.Unmarshal([]byte(value), &cfg); err != nil {
		return true
	}
	return cfg.Prefill != nil && cfg.Prefill.Backend != nil && *cfg.Prefill.Backend != "disabled"
}

func (s LaunchSpec) validate() error {
	var bad []string
	if s.Host == "" {
		bad = append(bad, "host is empty")
	}
	if s.Port < 1 || s.Port > 65535 {
		bad = append(bad, fmt.Sprintf("port %d outside 1..65535", s.Port))
	}
	if s.ModelPath == "" {
		bad = append(bad, "model path is empty")
	}
	if s.TPSize < 1 {
		bad = append(bad, fmt.Sprintf("tp size %d must be at least 1", s.TPSize))
	}
	if len(s.Layers) != 3 {
		bad = append(bad, fmt.Sprintf("layers %v: protocol v1 captures exactly three", s.Layers))
	}
	if s.ShmDir == "" {
		bad = append(bad, "shm dir is empty")
	}
	if s.MemFraction < 0 || s.MemFraction >= 1 {
		bad = append(bad, fmt.Sprintf("mem fraction %g outside [0,1)", s.MemFraction))
	}
	switch s.Kind {
	case KindSGLang:
		bad = append(bad, extraArgProblems(s.ExtraArgs)...)
	case KindTransformers:
		bad = append(bad, s.Transformers.problems(s.ExtraArgs)...)
	case KindSimulator:
		if s.Simulator.Executable == "" {
			bad = append(bad, "simulator executable is empty")
		}
		if s.Simulator.HiddenSize <= 0 || s.Simulator.NumLayers <= 0 {
			bad = append(bad, "simulator hidden size and num layers must be positive")
		}
	default:
		bad = append(bad, fmt.Sprintf("kind %q is not %q, %q or %q", s.Kind, KindSGLang, KindTransformers, KindSimulator))
	}
	if len(bad) > 0 {
		return errors.New("server launch spec: " + strings.Join(bad, "; "))
	}
	return nil
}

// Argv is the server's command line, never a shell string. For kind sglang the capture
// flags are always present and extra args that would undo them are refused.
func (s LaunchSpec) Argv() ([]string, error) {
	if err := s.validate(); err != nil {
		return nil, err
	}
	port := strconv.Itoa(s.Port)
	if s.Kind == KindSimulator {
		sim := s.Simulator
		argv := []string{sim.Executable, "simulate",
			"--host", s.Host, "--port", port, "--shm-dir", s.ShmDir, "--model", s.ModelPath,
			"--tp-size", strconv.Itoa(s.TPSize), "--hidden-size", strconv.Itoa(sim.HiddenSize),
			"--num-layers", strconv.Itoa(sim.NumLayers), "--layers", joinLayers(s.Layers),
			"--tokens-per-second", strconv.FormatFloat(sim.TokensPerSecond, 'g', -1, 64),
			"--startup-delay", sim.StartupDelay.String(),
		}
		for _, f := range []struct {
			name string
			set  bool
			val  string
		}{
			{"--exit-after", sim.ExitAfter != 0, strconv.Itoa(sim.ExitAfter)},
			{"--hang-after", sim.HangAfter != 0, strconv.Itoa(sim.HangAfter)},
			{"--fail-503-every", sim.Fail503Every != 0, strconv.Itoa(sim.Fail503Every)},
			{"--corrupt-every", sim.CorruptEvery != 0, strconv.Itoa(sim.CorruptEvery)},
			{"--late-dump-delay", sim.LateDumpDelay != 0, sim.LateDumpDelay.String()},
			{"--decode-delay", sim.DecodeDelay != 0, sim.DecodeDelay.String()},
			{"--request-log", sim.RequestLog != "", sim.RequestLog},
			{"--crash-on-samples", len(sim.CrashOnSamples) > 0, joinLayers(sim.CrashOnSamples)},
			{"--gen-reply-tokens", sim.ReplyTokens != 0, strconv.Itoa(sim.ReplyTokens)},
			{"--gen-empty-every", sim.EmptyEvery != 0, strconv.Itoa(sim.EmptyEvery)},
			{"--gen-think-every", sim.ThinkEvery != 0, strconv.Itoa(sim.ThinkEvery)},
			{"--gen-context-length", sim.ContextLength != 0, strconv.Itoa(sim.ContextLength)},
			{"--crash-on-rid", len(sim.CrashOnRID) > 0, strings.Join(sim.CrashOnRID, ",")},
		} {
			if f.set {
				argv = append(argv, f.name, f.val)
			}
		}
		return append(argv, s.ExtraArgs...), nil
	}
	python := s.Python
	if python == "" {
		python = "python3"
	}
	if s.Kind == KindTransformers {
		return append(s.transformersArgv(python, port), s.ExtraArgs...), nil
	}
	argv := []string{python, "-m", "sglang.launch_server",
		"--model-path", s.ModelPath, "--tp-size", strconv.Itoa(s.TPSize),
		"--host", s.Host, "--port", port}
	if s.MemFraction > 0 {
		argv = append(argv, "--mem-fraction-static", strconv.FormatFloat(s.MemFraction, 'g', -1, 64))
	}
	argv = append(argv, "--disable-radix-cache", "--chunked-prefill-size", "-1")
	return append(argv, s.ExtraArgs...), nil
}

// addedEnv is what Environ adds to our own environment, sorted; the managed keys come
// last so they win over Env (exec keeps the last of duplicate keys).
func (s LaunchSpec) addedEnv() []string {
	var env []string
	for k, v := range s.Env {
		env = append(env, k+"="+v)
	}
	sort.Strings(env)
	if len(s.GPUs) > 0 {
		ids := make([]string, len(s.GPUs))
		for i, g := range s.GPUs {
			ids[i] = strconv.Itoa(g)
		}
		// CUDA numbers GPUs fastest first by default; server.gpus, doctor and the GPU
		// sampler use NVML's numbers, which are PCI bus order: without this the server
		// could run on GPUs other than the ones doctor checked were free.
		env = append(env, "CUDA_DEVICE_ORDER=PCI_BUS_ID", "CUDA_VISIBLE_DEVICES="+strings.Join(ids, ","))
	}
	if (s.Kind == KindSGLang || s.Kind == KindTransformers) && s.HookDir != "" {
		path := s.HookDir
		if prev := s.Env["PYTHONPATH"]; prev != "" {
			path += ":" + prev
		} else if prev := os.Getenv("PYTHONPATH"); prev != "" {
			path += ":" + prev
		}
		env = append(env, "PYTHONPATH="+path)
	}
	if s.Kind == KindTransformers {
		// The server takes the staging dir and layers from its argv; without
		// SGLANG_HS_DIR the hook's sitecustomize.py on the same path stays idle.
		return append(env, transformersEnv...)
	}
	return append(env, "SGLANG_HS_DIR="+s.ShmDir, "SGLANG_HS_LAYERS="+joinLayers(s.Layers))
}

// Environ is the server's environment: ours, then Env, CUDA_VISIBLE_DEVICES from GPUs
// (in PCI bus order, as NVML numbers them),
// and the dump hook's SGLANG_HS_DIR and SGLANG_HS_LAYERS.
func (s LaunchSpec) Environ() []string {
	return append(os.Environ(), s.addedEnv()...)
}

// Fingerprint is the sha256 of the argv and the added environment: any change that
// matters to the running server changes it and forces a relaunch. It is empty for a
// spec that Argv refuses.
func (s LaunchSpec) Fingerprint() string {
	argv, err := s.Argv()
	if err != nil {
		return ""
	}
	h := sha256.New()
	for _, part := range [][]string{argv, s.addedEnv()} {
		for _, a := range part {
			h.Write([]byte(a))
			h.Write([]byte{0})
		}
		h.Write([]byte{1})
	}
	return hex.EncodeToString(h.Sum(nil))
}

// BaseURL is where the client reaches the server. A wildcard listen address is reached
// through loopback.
func (s LaunchSpec) BaseURL() string {
	host := s.Host
	if slices.Contains([]string{"", "0.0.0.0", "::", "[::]"}, host) {
		host = "127.0.0.1"
	}
	return "http://" + net.JoinHostPort(strings.Trim(host, "[]"), strconv.Itoa(s.Port))
}

func joinLayers(layers []int) string {
	s := make([]string, len(layers))
	for i, l := range layers {
		s[i] = strconv.Itoa(l)
	}
	return strings.Join(s, ",")
}
