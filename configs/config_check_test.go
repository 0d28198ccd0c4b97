package configs

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestNonsensicalValuesAreRefusedNamingTheKey(t *testing.T) {
	tests := []struct {
		name, body, want string
	}{
		{"negative drain timeout", minimal + "run:\n  drain_timeout: -1s\n", "run.drain_timeout"},
		{"negative request retries", minimal + "run:\n  request_retries: -1\n", "run.request_retries"},
		{"absurd request retries", minimal + "run:\n  request_retries: 1000000\n", "run.request_retries"},
		{"hidden size that overflows bytes per token", minimal + "  hidden_size: 2305843009213693952\n", "server.hidden_size"},
		{"simulator hidden size that overflows", minimal + "  simulator:\n    hidden_size: 2305843009213693952\n", "server.simulator.hidden_size"},
		{"zero simulator hidden size", minimal + "  simulator:\n    hidden_size: 0\n", "server.simulator.hidden_size"},
		{"absurd num layers", minimal + "  num_layers: 1000000\n", "server.num_layers"},
		{"zero num layers", minimal + "  num_layers: 0\n  layers: [0, 0, 0]\n", "server.num_layers"},
		{"absurd max inflight", minimal + "run:\n  max_inflight: 10000000\n", "run.max_inflight"},
		{"absurd movers", minimal + "run:\n  movers: 100000\n", "run.movers"},
		{"absurd max attempts", minimal + "run:\n  max_attempts: 100000000\n", "run.max_attempts"},
		{"negative disk reserve", minimal + "disk:\n  reserve: -1\n", "disk.reserve"},
		{"disk reserve past int64", minimal + "disk:\n  reserve: 1e30\n", "disk.reserve"},
		{"infinite disk reserve", minimal + "disk:\n  reserve: .inf\n", "disk.reserve"},
		{"disk reserve NaN as text", minimal + "disk:\n  reserve: NaN GiB\n", "disk.reserve"},
		{"negative shm budget", "shm_budget: -5\n" + minimal, "shm_budget"},
		{"zero log max size", minimal + "  log_max_size: 0\n", "server.log_max_size"},
		{"negative max new tokens", minimal + "  max_new_tokens: -1\n", "server.max_new_tokens"},
		{"mem fraction above 1", minimal + "  mem_fraction: 1.5\n", "server.mem_fraction"},
		{"negative mem fraction", minimal + "  mem_fraction: -0.1\n", "server.mem_fraction"},
		{"status port out of range", minimal + "status:\n  listen: 127.0.0.1:70000\n", "status.listen"},
		{"status port not a number", minimal + "status:\n  listen: 127.0.0.1:http\n", "status.listen"},
		{"NaN tokens per second", minimal + "  simulator:\n    tokens_per_second: .nan\n", "server.simulator.tokens_per_second"},
		{"negative startup delay", minimal + "  simulator:\n    startup_delay: -1s\n", "server.simulator.startup_delay"},
		{"negative late dump delay", minimal + "  simulator:\n    late_dump_delay: -1s\n", "server.simulator.late_dump_delay"},
		{"negative exit after", minimal + "  simulator:\n    exit_after: -1\n", "server.simulator.exit_after"},
		{"negative hang after", minimal + "  simulator:\n    hang_after: -1\n", "server.simulator.hang_after"},
		{"negative fail 503 every", minimal + "  simulator:\n    fail_503_every: -1\n", "server.simulator.fail_503_every"},
		{"negative corrupt every", minimal + "  simulator:\n    corrupt_every: -1\n", "server.simulator.corrupt_every"},
		{"a GPU twice", minimal + "  tp_size: 2\n  gpus: [1, 1]\n", "server.gpus"},
		{"a negative GPU", minimal + "  gpus: [-1]\n", "server.gpus"},
		{"absurd tp size", minimal + "  tp_size: 100000\n", "server.tp_size"},
		{"zero replicas", minimal + "  replicas: 0\n", "server.replicas"},
		{"absurd replicas", minimal + "  replicas: 100000\n", "server.replicas"},
		{"replica ports past 65535", minimal + "  port: 65530\n  replicas: 8\n", "server.port: replica 7 would listen on port 65537"},
		{"a layer twice", minimal + "  layers: [2, 2, 58]\n", "server.layers"},
		{"no host", minimal + "  host: \"\"\n", "server.host"},
		{"absurd health failures", minimal + "  health_failures: 100000000\n", "server.health_failures"},
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

func TestZeroRequestRetriesMeansNone(t *testing.T) {
	c, err := Load(writeConfig(t, minimal+"run:\n  request_retries: 0\n"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.Run.RequestRetries != 0 {
		t.Errorf("run.request_retries = %d, want 0", c.Run.RequestRetries)
	}
	if c, _ := Load(writeConfig(t, minimal), nil); c.Run.RequestRetries != 4 {
		t.Errorf("default run.request_retries = %d, want 4", c.Run.RequestRetries)
	}
}

func TestZeroDrainTimeoutIsAllowed(t *testing.T) {
	if _, err := Load(writeConfig(t, minimal+"run:\n  drain_timeout: 0s\n"), nil); err != nil {
		t.Errorf("drain_timeout 0 (stop without draining): %v", err)
	}
}

func TestAnEnvTypoNamesTheVariableAndTheClosestKey(t *testing.T) {
	t.Setenv("EXTRACT_RUN_MAX_INFLGHT", "8")
	_, err := Load(writeConfig(t, minimal), nil)
	if !errors.Is(err, ErrInvalid) {
		t.Fatalf("err = %v, want ErrInvalid", err)
	}
	for _, want := range []string{"EXTRACT_RUN_MAX_INFLGHT", "EXTRACT_RUN_MAX_INFLIGHT", "run.max_inflight"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
}

func TestAnEnvVariableFarFromEveryKeyIsStillRefused(t *testing.T) {
	t.Setenv("EXTRACT_ZZZZZZZZZZZZZZZZZZZZ", "1")
	_, err := Load(writeConfig(t, minimal), nil)
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "EXTRACT_ZZZZZZZZZZZZZZZZZZZZ") {
		t.Fatalf("err = %v, want ErrInvalid naming the variable", err)
	}
}

func TestEnvVariablesReadElsewhereAreNotTypos(t *testing.T) {
	for name := range envNotKeys {
		t.Setenv(name, "x")
	}
	if _, err := Load(writeConfig(t, minimal), nil); err != nil {
		t.Fatalf("with %d variables that other parts of extract read: %v", len(envNotKeys), err)
	}
}

func TestEveryKeysEnvNameIsAccepted(t *testing.T) {
	// Setting each key to its own default through env must load: none is called a typo.
	for key, val := range flatten(Default()) {
		var s string
		switch v := val.(type) {
		case []int:
			s = strings.Trim(strings.Join(strings.Fields(fmt.Sprint(v)), ","), "[]")
		case map[string]string, map[string]any:
			continue // viper cannot set a map from one variable
		case []string:
			s = strings.Join(v, ",")
		case ByteSize:
			s = fmt.Sprint(int64(v))
		default:
			s = fmt.Sprint(v)
		}
		if s == "" {
			continue
		}
		t.Setenv(EnvName(key), s)
	}
	t.Setenv(EnvName("server.kind"), "simulator")
	t.Setenv(EnvName("dataset"), "/data/d.jsonl")
	t.Setenv(EnvName("output_dir"), "/data/out")
	if _, err := Load("", nil); err != nil {
		t.Fatal(err)
	}
}

func TestDirsMustBeDistinctAndNotNested(t *testing.T) {
	root := t.TempDir()
	real := filepath.Join(root, "real")
	if err := os.Mkdir(real, 0o755); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(root, "link")
	if err := os.Symlink(real, link); err != nil {
		t.Fatal(err)
	}
	p := func(s string) string { return filepath.Join(root, s) }
	tests := []struct {
		name                     string
		dataset, out, state, shm string
		want                     []string // empty: accepted
	}{
		{"separate dirs", p("d.jsonl"), p("out"), "", p("shm"), nil},
		{"state inside output (the default's shape)", p("d.jsonl"), p("out"), p("out/state"), p("shm"), nil},
		{"output is shm", p("d.jsonl"), p("x"), "", p("x"), []string{"output_dir", "shm_dir", p("x")}},
		{"output inside shm", p("d.jsonl"), p("shm/out"), "", p("shm"), []string{"output_dir", "shm_dir", p("shm/out")}},
		{"shm inside output", p("d.jsonl"), p("out"), "", p("out/stage"), []string{"shm_dir", "output_dir", p("out/stage")}},
		{"state inside shm", p("d.jsonl"), p("out"), p("shm/state"), p("shm"), []string{"state_dir", "shm_dir"}},
		{"shm inside state", p("d.jsonl"), p("out"), p("st"), p("st/shm"), []string{"shm_dir", "state_dir"}},
		{"state is output", p("d.jsonl"), p("out"), p("out"), p("shm"), []string{"state_dir", "output_dir"}},
		{"output inside state", p("d.jsonl"), p("st/out"), p("st"), p("shm"), []string{"output_dir", "state_dir"}},
		{"dataset inside shm", p("shm/d.jsonl"), p("out"), "", p("shm"), []string{"dataset", "shm_dir"}},
		{"output inside shm through a symlink", p("d.jsonl"), filepath.Join(link, "out"), "", real, []string{"output_dir", "shm_dir", real}},
		{"shm is output through a symlink", p("d.jsonl"), real, "", link, []string{"output_dir", "shm_dir"}},
		{"a trailing slash and dot do not hide it", p("d.jsonl"), p("x") + "/./", "", p("x"), []string{"output_dir", "shm_dir"}},
		{"a sibling that shares a prefix is not inside", p("d.jsonl"), p("shm-out"), "", p("shm"), nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			body := fmt.Sprintf("dataset: %s\noutput_dir: %s\nshm_dir: %s\n", tt.dataset, tt.out, tt.shm)
			if tt.state != "" {
				body += "state_dir: " + tt.state + "\n"
			}
			_, err := Load(writeConfig(t, body+"server:\n  kind: simulator\n"), nil)
			if len(tt.want) == 0 {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("err = %v, want ErrInvalid", err)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
}

func TestParseByteSizeRefusesWhatIsNoSize(t *testing.T) {
	for _, bad := range []string{"NaN", "inf", "+Inf GiB", "1e30", "9223372036854775807TiB"} {
		if got, err := ParseByteSize(bad); err == nil {
			t.Errorf("ParseByteSize(%q) = %d, accepted", bad, got)
		}
	}
}
