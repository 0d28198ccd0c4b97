package configs

import (
	"errors"
	"strings"
	"testing"
)

func TestGenerateSamplingKeysOutOfRangeAreRefusedNamingTheKey(t *testing.T) {
	for _, tt := range []struct{ body, want string }{
		{"generate:\n  temperature: -0.1\n", "generate.temperature"},
		{"generate:\n  temperature: .nan\n", "generate.temperature"},
		{"generate:\n  top_p: 0\n", "generate.top_p"},
		{"generate:\n  top_p: 1.5\n", "generate.top_p"},
		{"generate:\n  top_k: 0\n", "generate.top_k"},
		{"generate:\n  max_new_tokens: 0\n", "generate.max_new_tokens"},
		{"generate:\n  max_new_tokens: 100000000\n", "generate.max_new_tokens"},
		{"generate:\n  seed: -1\n", "generate.seed"},
		{"generate:\n  stop_token_ids: [-3]\n", "generate.stop_token_ids"},
		{"generate:\n  thinking: maybe\n", "generate.thinking"},
		{"generate:\n  thinking: off\n  chat_template_kwargs:\n    enable_thinking: \"true\"\n", "generate.chat_template_kwargs"},
		{"generate:\n  on_empty: ignore\n", "generate.on_empty"},
		{"generate:\n  max_inflight: 0\n", "generate.max_inflight"},
		{"generate:\n  max_attempts: 0\n", "generate.max_attempts"},
		{"generate:\n  think_markers: [\" \"]\n", "generate.think_markers"},
	} {
		_, err := Load(writeConfig(t, minimal+tt.body), nil)
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%q: err = %v; want ErrInvalid naming %s", tt.body, err, tt.want)
		}
	}
	c, err := Load(writeConfig(t, minimal+"generate:\n  temperature: 0.7\n  top_k: 40\n  thinking: off\n"), nil)
	if err != nil || c.Generate.Temperature != 0.7 || c.Generate.TopK != 40 || c.Generate.MaxNewTokens != 2048 {
		t.Fatalf("valid generate keys: %+v, %v", c.Generate, err)
	}
}
