package orchestrator

import (
	"errors"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/extract-dev/extract/checkpoint"
	"github.com/extract-dev/extract/configs"
	"github.com/extract-dev/extract/dataset"
)

// A resume under a changed config names the settings that changed, from the fields the
// index stored when the job began (needed when a lost config file was rewritten by hand).
func TestAConfigFingerprintMismatchNamesTheFieldsThatChanged(t *testing.T) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg := &configs.Config{Server: configs.Server{Kind: "simulator", Layers: []int{2, 30, 58}, Simulator: configs.Simulator{HiddenSize: 8}}}
	ds, err := dataset.Open(writeDataset(t, `{"input_ids": [1, 2]}`+"\n"+`{"input_ids": [3]}`+"\n"))
	if err != nil {
		t.Fatal(err)
	}
	ix, err := checkpoint.Open(filepath.Join(t.TempDir(), "index.db"), checkpoint.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer ix.Close()
	if err := prepareIndex(ix, ds, cfg, RunOptions{Log: quiet}); err != nil {
		t.Fatal(err)
	}
	if err := ix.CommitDone(checkpoint.Record{Sample: 1, State: checkpoint.StateDone, Attempt: 1, RID: "s000000001-a1", Updated: time.Now()}); err != nil {
		t.Fatal(err)
	}
	changed := *cfg
	changed.Server.Layers = []int{3, 31, 59}
	changed.Server.Simulator.HiddenSize = 16
	err = prepareIndex(ix, ds, &changed, RunOptions{Resume: true, Log: quiet})
	if !errors.Is(err, ErrRefused) {
		t.Fatalf("resume under another config = %v, want ErrRefused", err)
	}
	for _, want := range []string{"server.layers was [2 30 58], now [3 31 59]", "hidden size was 8, now 16"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal %q does not say %q", err, want)
		}
	}
	if strings.Contains(err.Error(), "server.kind") || strings.Contains(err.Error(), "server.model_path") {
		t.Errorf("refusal names a setting that did not change: %v", err)
	}
}

// An index from before the fields were stored gets them on a resume under the same
// config, so that a later mismatch can be named.
func TestAResumeRecordsTheConfigFieldsInAnIndexThatLacksThem(t *testing.T) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg := &configs.Config{Server: configs.Server{Kind: "simulator", Layers: []int{2, 30, 58}, Simulator: configs.Simulator{HiddenSize: 8}}}
	ds, err := dataset.Open(writeDataset(t, `{"input_ids": [1, 2]}`+"\n"))
	if err != nil {
		t.Fatal(err)
	}
	ix, err := checkpoint.Open(filepath.Join(t.TempDir(), "index.db"), checkpoint.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer ix.Close()
	if err := ix.Init(checkpoint.Meta{DatasetFingerprint: ds.Fingerprint, ConfigFingerprint: cfg.Fingerprint(), Total: 1}); err != nil {
		t.Fatal(err)
	}
	if err := prepareIndex(ix, ds, cfg, RunOptions{Resume: true, Log: quiet}); err != nil {
		t.Fatal(err)
	}
	m, _, err := ix.Meta()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(m.ConfigFields, "layers=[2 30 58]") {
		t.Fatalf("config fields after the resume: %q", m.ConfigFields)
	}
}
