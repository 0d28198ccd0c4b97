package sglang

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// kimiK25Config is the shape of moonshotai/Kimi-K2.5's config.json, abridged: a
// multimodal wrapper whose language model (DeepSeek-V3 architecture) sits under
// text_config, with no hidden_size or num_hidden_layers at the top level.
const kimiK25Config = `{
  "architectures": ["KimiK25ForConditionalGeneration"],
  "model_type": "kimi_k25",
  "text_config": {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "kimi_k2",
    "hidden_size": 7168,
    "num_hidden_layers": 61,
    "vocab_size": 163840,
    "n_routed_experts": 384
  },
  "vision_config": {"hidden_size": 1152, "num_hidden_layers": 27}
}`

func writeModel(t *testing.T, config string, weights ...string) string {
	t.Helper()
	dir := t.TempDir()
	if config != "" {
		if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(config), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, w := range weights {
		if err := os.WriteFile(filepath.Join(dir, w), []byte("w"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestReadModelShapeFindsKimiK25sLanguageModelUnderTextConfig(t *testing.T) {
	dir := writeModel(t, kimiK25Config, "model-00001-of-00064.safetensors", "model-00002-of-00064.safetensors")

	got, err := ReadModelShape(dir)
	if err != nil {
		t.Fatal(err)
	}

	// Not the vision tower's 1152 × 27: the captured hidden states are the text model's.
	if got.HiddenSize != 7168 || got.NumLayers != 61 || got.VocabSize != 163840 {
		t.Errorf("shape = hidden %d, %d layers, vocab %d; want 7168, 61, 163840", got.HiddenSize, got.NumLayers, got.VocabSize)
	}
	if got.Nested != "text_config" {
		t.Errorf("Nested = %q, want text_config", got.Nested)
	}
	if len(got.Architectures) != 1 || got.Architectures[0] != "KimiK25ForConditionalGeneration" {
		t.Errorf("Architectures = %v, want the top level's", got.Architectures)
	}
	if got.WeightFiles != 2 {
		t.Errorf("WeightFiles = %d, want 2", got.WeightFiles)
	}
	if got.ConfigPath != filepath.Join(dir, "config.json") {
		t.Errorf("ConfigPath = %q", got.ConfigPath)
	}
}

func TestReadModelShapePrefersTheTopLevelAndFillsOnlyWhatItLacks(t *testing.T) {
	for _, tc := range []struct {
		name, config        string
		hidden, layers, voc int
		nested              string
	}{
		{"flat DeepSeek-V3", `{"architectures":["DeepseekV3ForCausalLM"],"hidden_size":7168,"num_hidden_layers":61,"vocab_size":129280}`, 7168, 61, 129280, ""},
		{"top level wins over text_config", `{"hidden_size":4096,"num_hidden_layers":32,"text_config":{"hidden_size":7168,"num_hidden_layers":61}}`, 4096, 32, 0, ""},
		{"layers from text_config only", `{"hidden_size":7168,"text_config":{"hidden_size":1,"num_hidden_layers":61}}`, 7168, 61, 0, "text_config"},
		{"DeepSeek-VL2 language_config", `{"language_config":{"hidden_size":2560,"num_hidden_layers":30}}`, 2560, 30, 0, "language_config"},
		{"shape not given", `{"architectures":["Mystery"]}`, 0, 0, 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ReadModelShape(writeModel(t, tc.config))
			if err != nil {
				t.Fatal(err)
			}
			if got.HiddenSize != tc.hidden || got.NumLayers != tc.layers || got.VocabSize != tc.voc || got.Nested != tc.nested {
				t.Errorf("got hidden %d, layers %d, vocab %d, nested %q; want %d, %d, %d, %q",
					got.HiddenSize, got.NumLayers, got.VocabSize, got.Nested, tc.hidden, tc.layers, tc.voc, tc.nested)
			}
		})
	}
}

func TestReadModelShapeTellsAMissingConfigFromABrokenOne(t *testing.T) {
	_, err := ReadModelShape(writeModel(t, ""))
	if !errors.Is(err, fs.ErrNotExist) || errors.Is(err, ErrModelConfig) {
		t.Errorf("no config.json: err = %v; want fs.ErrNotExist", err)
	}
	_, err = ReadModelShape(filepath.Join(t.TempDir(), "absent"))
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("no folder: err = %v; want fs.ErrNotExist", err)
	}
	for _, bad := range []string{`{`, `[1,2]`, `{"text_config":"7168"}`} {
		_, err = ReadModelShape(writeModel(t, bad))
		if !errors.Is(err, ErrModelConfig) {
			t.Errorf("config.json %s: err = %v; want ErrModelConfig", bad, err)
		}
	}
}

// fakePython writes an executable shell script standing in for the server's Python.
func fakePython(t *testing.T, script string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "python3")
	if err := os.WriteFile(path, []byte("#!/bin/sh\n"+script+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestProbePythonReportsTheVersionOrWhyNot(t *testing.T) {
	v, err := ProbePython(context.Background(), fakePython(t, `echo "  0.5.8 "`), nil)
	if err != nil || v != "0.5.8" {
		t.Errorf("ProbePython = %q, %v; want 0.5.8", v, err)
	}

	_, err = ProbePython(context.Background(), fakePython(t, "echo missing"), nil)
	if !errors.Is(err, ErrNoSGLang) {
		t.Errorf("an interpreter without sglang: err = %v; want ErrNoSGLang", err)
	}

	_, err = ProbePython(context.Background(), fakePython(t, "echo 'ModuleNotFoundError: No module named importlib' >&2; exit 1"), nil)
	if err == nil || !strings.Contains(err.Error(), "No module named importlib") {
		t.Errorf("a failing interpreter: err = %v; want its last stderr line", err)
	}

	_, err = ProbePython(context.Background(), filepath.Join(t.TempDir(), "nowhere", "python3"), nil)
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("no interpreter: err = %v; want fs.ErrNotExist", err)
	}
}

func TestProbePythonRunsWithTheGivenEnvironmentOutsideOurWorkingDir(t *testing.T) {
	py := fakePython(t, `echo "$SGLANG_TEST_MARK@$(pwd)"`)

	v, err := ProbePython(context.Background(), py, []string{"PATH=/usr/bin:/bin", "SGLANG_TEST_MARK=from-env"})

	if err != nil || v != "from-env@/" {
		t.Errorf("ProbePython = %q, %v; want from-env@/", v, err)
	}
}

func TestProbePythonEndsTheProbeAndItsChildrenWhenItsContextEnds(t *testing.T) {
	// sleep inherits the script's stdout: were it left running, Output would wait for it.
	childPID := filepath.Join(t.TempDir(), "child.pid")
	py := fakePython(t, "sleep 30 & echo $! > "+childPID+"; wait; echo 0.5.8")
	ctx, cancel := context.WithTimeoutCause(context.Background(), 200*time.Millisecond, errors.New("probe took too long"))
	defer cancel()

	start := time.Now()
	_, err := ProbePython(ctx, py, nil)

	if err == nil || !strings.Contains(err.Error(), "probe took too long") {
		t.Errorf("err = %v; want the context's cause", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("ProbePython took %v after its context ended", took)
	}
	b, err := os.ReadFile(childPID)
	if err != nil {
		t.Fatal(err)
	}
	var pid int
	if _, err := fmt.Sscan(string(b), &pid); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(3 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		st, err := readStat(pid)
		if err != nil || st.dead() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the probe's child (pid %d) outlived it", pid)
		}
	}
}

func TestProbePortNamesTheProcessListeningThere(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port

	busy, err := ProbePort("127.0.0.1", port)
	if err != nil {
		t.Fatal(err)
	}
	if !busy.InUse || !strings.HasPrefix(busy.Holder, fmt.Sprintf("pid %d (", os.Getpid())) {
		t.Errorf("ProbePort on our listener = %+v; want in use by pid %d", busy, os.Getpid())
	}

	ln.Close()
	free, err := ProbePort("127.0.0.1", port)
	if err != nil || free.InUse || free.Addr != fmt.Sprintf("127.0.0.1:%d", port) {
		t.Errorf("ProbePort on a closed port = %+v, %v; want free", free, err)
	}

	if _, err := ProbePort("192.0.2.1", port); err == nil {
		t.Error("ProbePort on an address of no interface here succeeded")
	}
}

func TestGPUProcessDescribesItselfAndHowToStopItForGood(t *testing.T) {
	for _, tc := range []struct {
		name       string
		p          GPUProcess
		describe   []string
		stop, omit string
	}{
		{
			name:     "a systemd service comes back at boot unless disabled",
			p:        GPUProcess{PID: 4242, Cmdline: []string{"python3", "-m", "vllm.entrypoints.openai.api_server"}, UsedMemory: 75 << 30, MemoryKnown: true, Unit: "vllm.service"},
			describe: []string{"pid 4242 (python3 -m vllm.entrypoints.openai.api_server)", "[75.0 GiB, systemd unit vllm.service]"},
			stop:     "sudo systemctl disable --now vllm.service",
			omit:     "kill",
		},
		{
			name:     "a user unit is stopped by its user",
			p:        GPUProcess{PID: 7, Cmdline: []string{"jupyter"}, Unit: "lab.service", UserUnit: true},
			describe: []string{"pid 7 (jupyter) [systemd user unit lab.service]"},
			stop:     "systemctl --user disable --now lab.service",
		},
		{
			name:     "a pid /proc does not show is the host's",
			p:        GPUProcess{PID: 99},
			describe: []string{"pid 99 (not visible in /proc here)"},
			stop:     "`nvidia-smi` on the host",
			omit:     "kill 99",
		},
		{
			name:     "a pid that holds no NVIDIA device may be another namespace's",
			p:        GPUProcess{PID: 12, Cmdline: []string{"bash"}, DeviceUnconfirmed: true},
			describe: []string{"another PID namespace's"},
			stop:     "first make sure pid 12 is the GPU process",
		},
		{
			name:     "a plain process is killed",
			p:        GPUProcess{PID: 5, Cmdline: []string{strings.Repeat("x", 300)}},
			describe: []string{"pid 5 (" + strings.Repeat("x", maxCmdline) + "…)"},
			stop:     "kill 5 (kill -9 5 if it does not exit)",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, s := tc.p.Describe(), tc.p.StopHint()
			for _, want := range tc.describe {
				if !strings.Contains(d, want) {
					t.Errorf("Describe() = %q, lacks %q", d, want)
				}
			}
			if !strings.Contains(s, tc.stop) {
				t.Errorf("StopHint() = %q, lacks %q", s, tc.stop)
			}
			if tc.omit != "" && strings.Contains(s, tc.omit) {
				t.Errorf("StopHint() = %q, should not say %q", s, tc.omit)
			}
		})
	}
}

func TestHiddenHolderIsMemoryUsedWithNoProcessListed(t *testing.T) {
	for _, tc := range []struct {
		g    GPU
		want bool
	}{
		{GPU{MemoryUsed: 500 << 20}, false},                                   // driver reservations
		{GPU{MemoryUsed: 70 << 30}, true},                                     // someone NVML does not list
		{GPU{MemoryUsed: 70 << 30, Processes: []GPUProcess{{PID: 1}}}, false}, // the listed process
	} {
		if got := tc.g.HiddenHolder(); got != tc.want {
			t.Errorf("HiddenHolder() with %s used and %d process(es) = %v, want %v", formatBytes(tc.g.MemoryUsed), len(tc.g.Processes), got, tc.want)
		}
	}
}

// A port held only by a closed connection in TIME_WAIT (its client had bound it) has no
// process to name or stop: the message says so, and the launch is not refused as a
// stranger's (exit 3) but retried (it is free within a minute).
func TestAPortHeldOnlyInTimeWaitIsSaidToBeAndIsNoStrangersPort(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Read(make([]byte, 1)) // until the client closes, so the client closes first
			c.Close()
		}
	}()
	var port int
	for try := 0; ; try++ {
		port = 20000 + int(time.Now().UnixNano()%12000)
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: port}}
		c, err := d.Dial("tcp", ln.Addr().String())
		if err == nil {
			c.Close() // the active close: port goes to TIME_WAIT for a minute
			break
		}
		if try == 50 {
			t.Fatal(err)
		}
	}
	use, err := ProbePort("127.0.0.1", port)
	if err != nil {
		t.Fatal(err)
	}
	if !use.InUse || use.HolderPID != 0 || !use.TimeWait || !strings.Contains(use.Who(), "TIME_WAIT") || strings.Contains(use.Who(), "/proc does not name") {
		t.Errorf("ProbePort of a port in TIME_WAIT = %+v, who %q", use, use.Who())
	}
	spec := simulatorSpec(t)
	spec.Port = port
	m, _ := newManager(t, t.TempDir(), spec)
	if _, err := m.Ensure(ctxFor(t, 30*time.Second)); err == nil || errors.Is(err, ErrPortTaken) || !strings.Contains(err.Error(), "TIME_WAIT") {
		t.Errorf("launch onto a port in TIME_WAIT: %v; want a retryable error naming TIME_WAIT, not ErrPortTaken", err)
	}
}

// A listener that carries EXTRACT_SERVER_ID is a server some extract launched (another
// job's, another shard's): named as one, never as a process extract did not start.
func TestAPortHeldByAServerExtractLaunchedIsNamedAsOne(t *testing.T) {
	python, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 is not on PATH")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	srv := exec.Command(python, "-c", fmt.Sprintf("import socket,time\ns=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(('127.0.0.1', %d)); s.listen(); print('up', flush=True); time.sleep(120)", port))
	srv.Env = append(os.Environ(), serverIDEnv+"=feedc0de")
	out, _ := srv.StdoutPipe()
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { srv.Process.Kill(); srv.Wait() }()
	if _, err := out.Read(make([]byte, 2)); err != nil {
		t.Fatal(err)
	}
	use, err := ProbePort("127.0.0.1", port)
	if err != nil {
		t.Fatal(err)
	}
	if use.HolderPID != srv.Process.Pid || use.ServerID != "feedc0de" || !strings.Contains(use.Who(), "a server that extract launched") || strings.Contains(use.Who(), "did not start") {
		t.Errorf("ProbePort of another extract server's port = %+v, who %q", use, use.Who())
	}
}
