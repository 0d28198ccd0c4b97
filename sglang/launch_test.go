package sglang

import (
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/extract-dev/extract/configs"
	"github.com/extract-dev/extract/sglang/simulator"
)

func simSpec() LaunchSpec {
	return LaunchSpec{
		Kind: KindSimulator, Host: "127.0.0.1", Port: 31000, ModelPath: "sim/model", TPSize: 8,
		Layers: []int{2, 30, 58}, ShmDir: "/dev/shm/sglang_hs",
		Simulator: SimulatorSpec{Executable: "/usr/local/bin/extract", NumLayers: 61,
			Simulator: configs.Simulator{TokensPerSecond: 1500, HiddenSize: 7168, StartupDelay: 2 * time.Second}},
	}
}

func sglangSpec() LaunchSpec {
	return LaunchSpec{
		Kind: KindSGLang, Host: "0.0.0.0", Port: 30000, ModelPath: "/models/Kimi-K2.5", TPSize: 8,
		GPUs: []int{0, 1, 2, 3, 4, 5, 6, 7}, MemFraction: 0.85, Layers: []int{2, 30, 58}, ShmDir: "/dev/shm/sglang_hs",
		ExtraArgs: []string{"--trust-remote-code", "--context-length", "32768"},
	}
}

func TestArgvAlwaysCarriesTheCaptureFlags(t *testing.T) {
	tests := []struct {
		name   string
		modify func(*LaunchSpec)
		base   func() LaunchSpec
		want   []string
	}{
		{"simulator", nil, simSpec, []string{"/usr/local/bin/extract", "simulate",
			"--host", "127.0.0.1", "--port", "31000", "--shm-dir", "/dev/shm/sglang_hs", "--model", "sim/model",
			"--tp-size", "8", "--hidden-size", "7168", "--num-layers", "61", "--layers", "2,30,58",
			"--tokens-per-second", "1500", "--startup-delay", "2s"}},
		{"simulator with faults", func(s *LaunchSpec) {
			s.Simulator.ExitAfter, s.Simulator.HangAfter, s.Simulator.Fail503Every, s.Simulator.LateDumpDelay = 5, 6, 7, 1500*time.Millisecond
		}, simSpec, []string{"/usr/local/bin/extract", "simulate",
			"--host", "127.0.0.1", "--port", "31000", "--shm-dir", "/dev/shm/sglang_hs", "--model", "sim/model",
			"--tp-size", "8", "--hidden-size", "7168", "--num-layers", "61", "--layers", "2,30,58",
			"--tokens-per-second", "1500", "--startup-delay", "2s",
			"--exit-after", "5", "--hang-after", "6", "--fail-503-every", "7", "--late-dump-delay", "1.5s"}},
		{"sglang", nil, sglangSpec, []string{"python3", "-m", "sglang.launch_server",
			"--model-path", "/models/Kimi-K2.5", "--tp-size", "8", "--host", "0.0.0.0", "--port", "30000",
			"--mem-fraction-static", "0.85", "--disable-radix-cache", "--chunked-prefill-size", "-1",
			"--trust-remote-code", "--context-length", "32768"}},
		{"sglang without mem fraction, own interpreter", func(s *LaunchSpec) {
			s.MemFraction, s.Python, s.ExtraArgs = 0, "/opt/venv/bin/python", nil
		}, sglangSpec, []string{"/opt/venv/bin/python", "-m", "sglang.launch_server",
			"--model-path", "/models/Kimi-K2.5", "--tp-size", "8", "--host", "0.0.0.0", "--port", "30000",
			"--disable-radix-cache", "--chunked-prefill-size", "-1"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := tc.base()
			if tc.modify != nil {
				tc.modify(&s)
			}
			got, err := s.Argv()
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("argv\n got %q\nwant %q", got, tc.want)
			}
		})
	}
}

func TestArgvAllowsTheHarmlessValuesOfCaptureFlags(t *testing.T) {
	for _, extra := range [][]string{
		{"--pp-size", "1"},
		{"--attn-cp-size=1"},
		{"--cuda-graph-backend-prefill", "disabled"},
		{`--cuda-graph-config={"decode":{"backend":"full"},"prefill":{"backend":"disabled"}}`},
		{"--trust-remote-code"},
	} {
		s := sglangSpec()
		s.ExtraArgs = extra
		if _, err := s.Argv(); err != nil {
			t.Errorf("extra args %q refused: %v", extra, err)
		}
	}
}

func TestArgvRefusesSpecsThatBreakCapture(t *testing.T) {
	tests := []struct {
		name   string
		base   func() LaunchSpec
		modify func(*LaunchSpec)
		want   string
	}{
		{"two-batch overlap", sglangSpec, func(s *LaunchSpec) { s.ExtraArgs = []string{"--enable-two-batch-overlap"} }, "two-batch overlap"},
		{"chunked prefill back on", sglangSpec, func(s *LaunchSpec) { s.ExtraArgs = []string{"--chunked-prefill-size=8192"} }, "chunked prefill"},
		{"chunked prefill by an argparse prefix", sglangSpec, func(s *LaunchSpec) { s.ExtraArgs = []string{"--chunked-prefill", "8192"} }, "chunked prefill"},
		{"radix cache flag given twice", sglangSpec, func(s *LaunchSpec) { s.ExtraArgs = []string{"--disable-radix-cache"} }, "radix cache"},
		{"DP attention", sglangSpec, func(s *LaunchSpec) { s.ExtraArgs = []string{"--enable-dp-attention"} }, "DP attention"},
		{"pipeline parallel of two", sglangSpec, func(s *LaunchSpec) { s.ExtraArgs = []string{"--pp-size", "2"} }, "pipeline parallel"},
		{"pipeline parallel by its long name", sglangSpec, func(s *LaunchSpec) { s.ExtraArgs = []string{"--pipeline-parallel-size=2"} }, "pipeline parallel"},
		{"speculative decoding", sglangSpec, func(s *LaunchSpec) { s.ExtraArgs = []string{"--speculative-algorithm", "EAGLE3"} }, "speculative decoding"},
		{"piecewise CUDA graphs on (pinned commit)", sglangSpec, func(s *LaunchSpec) { s.ExtraArgs = []string{"--enable-piecewise-cuda-graph"} }, "prefill graph"},
		{"piecewise CUDA graphs enforced (#16331 and later)", sglangSpec, func(s *LaunchSpec) { s.ExtraArgs = []string{"--enforce-piecewise-cuda-graph"} }, "prefill graph"},
		{"a prefill CUDA graph backend (v0.5.15 and later)", sglangSpec, func(s *LaunchSpec) { s.ExtraArgs = []string{"--cuda-graph-backend-prefill", "tc_piecewise"} }, "prefill graph"},
		{"a prefill CUDA graph in the JSON config", sglangSpec, func(s *LaunchSpec) {
			s.ExtraArgs = []string{`--cuda-graph-config={"prefill":{"backend":"breakable"}}`}
		}, "prefill backend"},
		{"attention TP input scattering", sglangSpec, func(s *LaunchSpec) { s.ExtraArgs = []string{"--enable-attn-tp-input-scattered"} }, "split across TP ranks"},
		{"port through extra args", sglangSpec, func(s *LaunchSpec) { s.ExtraArgs = []string{"--port", "1"} }, "server.port"},
		{"tp size by its long name", sglangSpec, func(s *LaunchSpec) { s.ExtraArgs = []string{"--tensor-parallel-size", "4"} }, "server.tp_size"},
		{"unknown kind", sglangSpec, func(s *LaunchSpec) { s.Kind = "vllm" }, `kind "vllm"`},
		{"no model", sglangSpec, func(s *LaunchSpec) { s.ModelPath = "" }, "model path"},
		{"two layers", sglangSpec, func(s *LaunchSpec) { s.Layers = []int{2, 30} }, "exactly three"},
		{"no port", sglangSpec, func(s *LaunchSpec) { s.Port = 0 }, "port 0"},
		{"simulator without executable", simSpec, func(s *LaunchSpec) { s.Simulator.Executable = "" }, "executable"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := tc.base()
			tc.modify(&s)
			argv, err := s.Argv()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Argv() = %q, %v; want an error containing %q", argv, err, tc.want)
			}
			if s.Fingerprint() != "" {
				t.Errorf("a refused spec has a fingerprint")
			}
		})
	}
}

// Every option reaches the simulate command: the argv Argv writes parses back, through
// the command's own flags, into the same configs.Simulator.
func TestSimulatorArgvParsesBackIntoTheSameConfig(t *testing.T) {
	s := simSpec()
	s.Simulator.Simulator = configs.Simulator{
		TokensPerSecond: 1500.5, HiddenSize: 7168, StartupDelay: 2 * time.Second,
		ExitAfter: 1, HangAfter: 2, Fail503Every: 3, CorruptEvery: 4,
		LateDumpDelay: time.Second, DecodeDelay: 5 * time.Millisecond,
		RequestLog: "/tmp/requests.log", CrashOnSamples: []int{6, 7},
		ReplyTokens: 8, EmptyEvery: 9, ThinkEvery: 10, ContextLength: 11,
		CrashOnRID: []string{"g000000012", "g000000013"},
	}
	if unset := zeroFields(reflect.ValueOf(s.Simulator.Simulator), ""); len(unset) > 0 {
		t.Fatalf("the test leaves options %v unset: give each a value", unset)
	}
	argv, err := s.Argv()
	if err != nil {
		t.Fatal(err)
	}
	var got simulator.Config
	fs := pflag.NewFlagSet("simulate", pflag.ContinueOnError)
	got.BindFlags(fs)
	if err := fs.Parse(argv[2:]); err != nil {
		t.Fatal(err)
	}
	want := simulator.Config{Host: s.Host, Port: s.Port, ShmDir: s.ShmDir, Model: s.ModelPath, TPSize: s.TPSize,
		NumLayers: 61, Layers: s.Layers, HookVersion: simulator.DefaultHookVersion, Simulator: s.Simulator.Simulator}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("parsed %+v\nwant   %+v", got, want)
	}
}

func TestEnvironAddsGPUsHookSettingsAndUserEnvWithManagedKeysWinning(t *testing.T) {
	s := sglangSpec()
	s.GPUs = []int{4, 5}
	s.Env = map[string]string{"NCCL_DEBUG": "WARN", "SGLANG_HS_DIR": "/wrong"}
	env := s.Environ()
	last := map[string]string{}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		last[k] = v
	}
	s.Env["CUDA_DEVICE_ORDER"] = "FASTEST_FIRST"
	want := map[string]string{"CUDA_VISIBLE_DEVICES": "4,5", "CUDA_DEVICE_ORDER": "PCI_BUS_ID", "NCCL_DEBUG": "WARN", "SGLANG_HS_DIR": "/dev/shm/sglang_hs", "SGLANG_HS_LAYERS": "2,30,58"}
	for k, v := range want {
		if last[k] != v {
			t.Errorf("%s = %q (the last one wins in exec), want %q", k, last[k], v)
		}
	}
	if t.Setenv("EXTRACT_TEST_INHERITED", "yes"); !slices.Contains(s.Environ(), "EXTRACT_TEST_INHERITED=yes") {
		t.Errorf("our own environment is not inherited")
	}
}

func TestFingerprintChangesWithWhatTheServerSees(t *testing.T) {
	base := sglangSpec()
	base.Env = map[string]string{"A": "1", "B": "2", "C": "3", "D": "4"}
	tests := []struct {
		name   string
		modify func(*LaunchSpec)
		same   bool
	}{
		{"env map built in another order", func(s *LaunchSpec) {
			s.Env = map[string]string{}
			for _, k := range []string{"D", "B", "C", "A"} {
				s.Env[k] = base.Env[k]
			}
		}, true},
		{"simulator settings do not reach an sglang server", func(s *LaunchSpec) { s.Simulator.HiddenSize = 1 }, true},
		{"port", func(s *LaunchSpec) { s.Port++ }, false},
		{"model", func(s *LaunchSpec) { s.ModelPath = "/models/other" }, false},
		{"gpus", func(s *LaunchSpec) { s.GPUs = []int{0, 1} }, false},
		{"env value", func(s *LaunchSpec) { s.Env = map[string]string{"A": "9", "B": "2", "C": "3", "D": "4"} }, false},
		{"layers", func(s *LaunchSpec) { s.Layers = []int{1, 29, 57} }, false},
		{"extra args", func(s *LaunchSpec) { s.ExtraArgs = nil }, false},
	}
	want := base.Fingerprint()
	if len(want) != 64 {
		t.Fatalf("fingerprint %q is not sha256 hex", want)
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := sglangSpec()
			s.Env = base.Env
			tc.modify(&s)
			if got := s.Fingerprint(); (got == want) != tc.same {
				t.Errorf("fingerprint same = %v, want %v", got == want, tc.same)
			}
		})
	}
}

func TestBaseURLReachesWildcardListenersThroughLoopback(t *testing.T) {
	tests := []struct {
		host string
		want string
	}{
		{"127.0.0.1", "http://127.0.0.1:30000"},
		{"0.0.0.0", "http://127.0.0.1:30000"},
		{"::", "http://127.0.0.1:30000"},
		{"::1", "http://[::1]:30000"},
		{"gpu-node-1", "http://gpu-node-1:30000"},
	}
	for _, tc := range tests {
		s := sglangSpec()
		s.Host = tc.host
		if got := s.BaseURL(); got != tc.want {
			t.Errorf("host %q: BaseURL %q, want %q", tc.host, got, tc.want)
		}
	}
}

func TestSGLangServerGetsTheShippedHookFirstOnPythonPath(t *testing.T) {
	t.Setenv("PYTHONPATH", "/opt/site")
	dir := filepath.Join(t.TempDir(), HookDirName())
	spec := LaunchSpec{Kind: KindSGLang, Host: "127.0.0.1", Port: 30000, ModelPath: "/m", TPSize: 1, Layers: []int{2, 30, 58}, ShmDir: "/dev/shm/x", HookDir: dir}
	var got string
	for _, kv := range spec.Environ() {
		if v, ok := strings.CutPrefix(kv, "PYTHONPATH="); ok {
			got = v
		}
	}
	if got != dir+":/opt/site" {
		t.Errorf("PYTHONPATH = %q, want the hook dir first, then the inherited path", got)
	}
	if err := InstallHook(dir); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"sitecustomize.py", "extract_hook/__init__.py", "extract_hook/writer.py"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Errorf("installed hook lacks %s: %v", f, err)
		}
	}
	if !strings.Contains(dir, HookVersion()) {
		t.Errorf("hook dir %s does not carry the hook version %s", dir, HookVersion())
	}
}

// zeroFields names the fields of struct v (recursively) that hold their zero value.
func zeroFields(v reflect.Value, prefix string) []string {
	var out []string
	for i := 0; i < v.NumField(); i++ {
		f, name := v.Field(i), prefix+v.Type().Field(i).Name
		if f.Kind() == reflect.Struct {
			out = append(out, zeroFields(f, name+".")...)
		} else if f.IsZero() {
			out = append(out, name)
		}
	}
	return out
}
