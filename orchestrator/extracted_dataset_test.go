package orchestrator

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/extract-dev/extract/configs"
)

// verify, import and vocab on a conversation job that has not been prepared yet say so
// (exit 2) and how to make it, not "no such file" for a path the config never named.
func TestTheExtractedDatasetOfAJobNotPreparedYetSaysHowToMakeIt(t *testing.T) {
	cfg := configs.Default()
	cfg.Dataset = filepath.Join(t.TempDir(), "chats.jsonl")
	cfg.StateDir = t.TempDir()
	cfg.DatasetFormat = "sharegpt"
	_, err := openExtractedDataset(context.Background(), &cfg)
	if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "`extract run`") || !strings.Contains(err.Error(), "chats.jsonl") {
		t.Fatalf("not prepared yet: %v", err)
	}
}
