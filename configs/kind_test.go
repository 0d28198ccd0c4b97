package configs

import (
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

func TestATransformersJobsMaxInflightDefaultsToFillingEveryReplicasSortWindow(t *testing.T) {
	const transformers = "dataset: x.jsonl\noutput_dir: out\nserver:\n  kind: transformers\n  model_path: m\n  num_layers: 8\n  hidden_size: 64\n  layers: [1, 4, 7]\n"
	flagSet := func(args ...string) []Flag {
		fs := pflag.NewFlagSet("run", pflag.ContinueOnError)
		fs.Int("max-inflight", 32, "")
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		return []Flag{{Key: "run.max_inflight", Flag: fs.Lookup("max-inflight")}}
	}
	for _, c := range []struct {
		name  string
		yaml  string
		env   string
		flags []Flag
		want  int
	}{
		{"the server's window and two batches of 64", transformers, "", nil, 256 + 2*64},
		{"batches of 8", transformers + "  transformers:\n    max_batch_requests: 8\n", "", nil, 256 + 2*8},
		{"two replicas share it", transformers + "  replicas: 2\n", "", nil, 2 * (256 + 2*64)},
		{"a flag left unset", transformers, "", flagSet(), 256 + 2*64},
		{"set in the file", transformers + "run:\n  max_inflight: 16\n", "", nil, 16},
		{"written with no value", transformers + "run:\n  max_inflight:\n", "", nil, 256 + 2*64},
		{"set in env", transformers, "20", nil, 20},
		{"set by a flag", transformers, "", flagSet("--max-inflight=24"), 24},
		{"kind sglang keeps the general default", strings.Replace(transformers, "kind: transformers", "kind: sglang", 1), "", nil, 32},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.env != "" {
				t.Setenv("EXTRACT_RUN_MAX_INFLIGHT", c.env)
			}
			cfg, err := Load(writeConfig(t, c.yaml), c.flags)
			if err != nil {
				t.Fatal(err)
			}
			if cfg.Run.MaxInflight != c.want {
				t.Errorf("run.max_inflight = %d, want %d", cfg.Run.MaxInflight, c.want)
			}
		})
	}
}

func TestAnAbsurdBatchSizeIsRefusedByItsOwnKeyNotByTheDefaultItFeeds(t *testing.T) {
	yaml := "dataset: x.jsonl\noutput_dir: out\nserver:\n  kind: transformers\n  model_path: m\n  num_layers: 8\n  hidden_size: 64\n  layers: [1, 4, 7]\n  transformers:\n    max_batch_requests: 4611686018427387904\n"
	_, err := Load(writeConfig(t, yaml), nil)
	if err == nil || !strings.Contains(err.Error(), "server.transformers.max_batch_requests") || strings.Contains(err.Error(), "run.max_inflight") {
		t.Fatalf("max_batch_requests 2^62: %v", err)
	}
}
