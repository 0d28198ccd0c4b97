package configs

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"
)

func TestOutputFormatDefaultsToSafetensorsAndKeepsTheOldFingerprint(t *testing.T) {
	c, err := Load(writeConfig(t, minimal), nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.Output.Format != "safetensors" || c.Output.Compress != "none" || c.Output.LayoutName() != "safetensors" {
		t.Fatalf("output %+v", c.Output)
	}
	base := c.Fingerprint()
	// The hash a job got before output.format existed: resuming it must not be refused.
	old := sha256.Sum256([]byte(fmt.Sprintf("kind=%s\nmodel=%s\nhidden=%d\nlayers=%v\n", c.Server.Kind, c.Server.ModelPath, c.HiddenSize(), c.Server.Layers)))
	if base != hex.EncodeToString(old[:])[:16] {
		t.Errorf("the default format changed the fingerprint: %s", base)
	}
	for _, f := range []struct{ format, compress string }{{"specforge", "none"}, {"specforge", "gzip"}, {"modelopt", "none"}} {
		c.Output.Format, c.Output.Compress = f.format, f.compress
		if c.Fingerprint() == base {
			t.Errorf("%s/%s has the safetensors fingerprint: a resume would mix formats", f.format, f.compress)
		}
	}
}

func TestOutputFormatFromEnvAndBadValuesNameTheKey(t *testing.T) {
	t.Setenv("EXTRACT_OUTPUT_FORMAT", "specforge")
	t.Setenv("EXTRACT_OUTPUT_COMPRESS", "gzip")
	c, err := Load(writeConfig(t, minimal), nil)
	if err != nil || c.Output.LayoutName() != "specforge+gzip" {
		t.Fatalf("env format: %+v, %v", c.Output, err)
	}
	for _, tc := range []struct{ format, compress, key string }{
		{"pytorch", "none", "output.format"},
		{"modelopt", "gzip", "output.compress"},
		{"specforge", "zstd", "output.compress"},
	} {
		t.Setenv("EXTRACT_OUTPUT_FORMAT", tc.format)
		t.Setenv("EXTRACT_OUTPUT_COMPRESS", tc.compress)
		if _, err := Load(writeConfig(t, minimal), nil); err == nil || !strings.Contains(err.Error(), tc.key) {
			t.Errorf("%s/%s: %v, want an error naming %s", tc.format, tc.compress, err, tc.key)
		}
	}
}

func TestTheKimiConfigWritesSpecForgeFiles(t *testing.T) {
	c, err := Load("kimi-k2.5.yaml", nil)
	if err != nil || c.Output.LayoutName() != "specforge" {
		t.Fatalf("kimi output %+v, %v", c.Output, err)
	}
}
