package configs

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func writeConfig(t *testing.T, body string) string {
	t.Helper()
	dir := t.TempDir()
	path := filepath.Join(dir, "job.yaml")
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

const minimal = `
dataset: data.jsonl
output_dir: out
server:
  kind: simulator
`

func TestRelativePathsInTheFileResolveAgainstItsFolder(t *testing.T) {
	path := writeConfig(t, minimal)
	c, err := Load(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Dir(path)
	if c.Dataset != filepath.Join(dir, "data.jsonl") || c.OutputDir != filepath.Join(dir, "out") {
		t.Errorf("paths = %q, %q; want them under %s", c.Dataset, c.OutputDir, dir)
	}
	if c.StateDir != filepath.Join(dir, "out", ".extract") {
		t.Errorf("state_dir = %q, want <output_dir>/.extract", c.StateDir)
	}
}

func TestEnvOverridesEveryKindOfKey(t *testing.T) {
	path := writeConfig(t, minimal)
	t.Setenv("EXTRACT_SERVER_PORT", "31234")
	t.Setenv("EXTRACT_SERVER_SIMULATOR_TOKENS_PER_SECOND", "1500.5")
	t.Setenv("EXTRACT_SERVER_SIMULATOR_HIDDEN_SIZE", "48")
	t.Setenv("EXTRACT_STATUS_LISTEN", "127.0.0.1:9999")
	t.Setenv("EXTRACT_DISK_RESERVE", "2GiB")
	t.Setenv("EXTRACT_STATE_DIR", "rel-state")
	t.Setenv("EXTRACT_SERVER_LAYERS", "3,31,59")
	t.Setenv("EXTRACT_RUN_DUMP_TIMEOUT", "90s")
	c, err := Load(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	cwd, _ := os.Getwd()
	checks := []struct {
		key       string
		got, want any
	}{
		{"server.port", c.Server.Port, 31234},
		{"server.simulator.tokens_per_second", c.Server.Simulator.TokensPerSecond, 1500.5},
		{"server.simulator.hidden_size", c.HiddenSize(), 48},
		{"status.listen", c.Status.Listen, "127.0.0.1:9999"},
		{"disk.reserve", c.Disk.Reserve, ByteSize(2 << 30)},
		{"state_dir (relative env resolves against cwd)", c.StateDir, filepath.Join(cwd, "rel-state")},
		{"server.layers", fmt.Sprint(c.Server.Layers), "[3 31 59]"},
		{"run.dump_timeout", c.Run.DumpTimeout, 90 * time.Second},
	}
	for _, ck := range checks {
		if ck.got != ck.want {
			t.Errorf("%s = %v, want %v", ck.key, ck.got, ck.want)
		}
	}
}

func TestEnvAloneCanDescribeAJob(t *testing.T) {
	t.Setenv("EXTRACT_DATASET", "/data/d.jsonl")
	t.Setenv("EXTRACT_OUTPUT_DIR", "/data/out")
	t.Setenv("EXTRACT_SERVER_KIND", "simulator")
	c, err := Load("", nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.Dataset != "/data/d.jsonl" || c.OutputDir != "/data/out" || c.Server.Kind != "simulator" {
		t.Errorf("config from env = %+v", c)
	}
}

func TestInvalidConfigsNameTheKey(t *testing.T) {
	tests := []struct {
		name, body, want string
	}{
		{"typo", minimal + "  prot: 1\n", "prot"},
		{"unknown kind", "dataset: d\noutput_dir: o\nserver:\n  kind: vllm\n", "server.kind"},
		{"sglang without model", "dataset: d\noutput_dir: o\nserver:\n  kind: sglang\n", "server.model_path"},
		{"no dataset", "output_dir: o\nserver:\n  kind: simulator\n", "dataset"},
		{"two layers", minimal + "  layers: [1, 2]\n", "server.layers"},
		{"bad size", minimal + "disk:\n  reserve: lots\n", "lots"},
		{"bad listen", minimal + "status:\n  listen: nowhere\n", "status.listen"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Load(writeConfig(t, tt.body), nil)
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v; want ErrInvalid naming %q", err, tt.want)
			}
		})
	}
}

func TestParseByteSize(t *testing.T) {
	tests := []struct {
		in   string
		want ByteSize
	}{
		{"1024", 1024}, {"1KiB", 1024}, {"1.5 GiB", 3 << 29}, {"2TB", 2e12}, {"64m", 64 << 20}, {"100GB", 100e9},
	}
	for _, tt := range tests {
		got, err := ParseByteSize(tt.in)
		if err != nil || got != tt.want {
			t.Errorf("ParseByteSize(%q) = %d, %v; want %d", tt.in, got, err, tt.want)
		}
	}
	for _, bad := range []string{"", "-1", "ten", "5 parsecs"} {
		if _, err := ParseByteSize(bad); err == nil {
			t.Errorf("ParseByteSize(%q) accepted", bad)
		}
	}
}

func TestShippedConfigsLoad(t *testing.T) {
	for _, name := range []string{"demo.yaml", "kimi-k2.5.yaml", "demo-chat.yaml"} {
		c, err := Load(name, nil)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if name == "kimi-k2.5.yaml" && (c.Server.TPSize != 8 || c.HiddenSize() != 7168 || c.ShmDir != "/dev/shm/sglang_hs") {
			t.Errorf("kimi config: %+v", c.Server)
		}
		if name == "demo-chat.yaml" && (c.Vocab.DraftSize != 128 || c.Server.Kind != "simulator" || !strings.HasSuffix(c.Dataset, "demo/conversations.jsonl")) {
			t.Errorf("demo-chat config: %+v %+v %s", c.Vocab, c.Server.Kind, c.Dataset)
		}
	}
}

func TestFingerprintChangesWithWhatShapesOutputs(t *testing.T) {
	c, err := Load(writeConfig(t, minimal), nil)
	if err != nil {
		t.Fatal(err)
	}
	base := c.Fingerprint()
	c.Server.Simulator.TokensPerSecond = 99
	if c.Fingerprint() != base {
		t.Error("speed changed the fingerprint")
	}
	c.Server.Layers = []int{1, 2, 3}
	if c.Fingerprint() == base {
		t.Error("layers did not change the fingerprint")
	}
}

func TestServerEnvKeysReachTheServerInUpperCaseThoughViperFoldsThem(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "c.yaml")
	yaml := "dataset: x.jsonl\noutput_dir: out\nserver:\n  kind: transformers\n  model_path: m\n  num_layers: 8\n  layers: [1, 4, 7]\n  env:\n    HF_HOME: /x\n    PYTHONPATH: /p\n"
	if err := os.WriteFile(file, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := Load(file, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.Server.Env["HF_HOME"] != "/x" || c.Server.Env["PYTHONPATH"] != "/p" || len(c.Server.Env) != 2 {
		t.Fatalf("server.env = %v", c.Server.Env)
	}
}

func TestTransformersLayersMustBeInputsOfDecoderLayers(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "c.yaml")
	yaml := "dataset: x.jsonl\noutput_dir: out\nserver:\n  kind: transformers\n  model_path: m\n  num_layers: 8\n  layers: [1, 4, 8]\n"
	if err := os.WriteFile(file, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := Load(file, nil)
	if err == nil || !strings.Contains(err.Error(), "server.layers") || !strings.Contains(err.Error(), "1..7") {
		t.Fatalf("layer 8 of 8 accepted for kind transformers: %v", err)
	}
}
