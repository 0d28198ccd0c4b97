package orchestrator

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/extract-dev/extract/checkpoint"
	"github.com/extract-dev/extract/configs"
	"github.com/extract-dev/extract/dataset"
)

func TestPrepareIndexDecidesWhatARunMayDoWithTheIndex(t *testing.T) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	tests := []struct {
		name        string
		done        bool // the first job got one sample done
		complete    bool // and the other one too
		changed     bool // the dataset differs on the second run
		opt         RunOptions
		wantErr     string // "" for none
		wantAttempt uint32 // sample 0's attempt after prepareIndex
	}{
		{name: "no progress, same job: attempts are kept", wantAttempt: 1},
		{name: "no progress, other dataset: the index takes the new one", changed: true, wantAttempt: 0},
		{name: "progress without --resume is refused with how to resume", done: true, wantErr: "extract run --resume"},
		{name: "progress with --resume continues", done: true, opt: RunOptions{Resume: true}, wantAttempt: 1},
		{name: "a complete job without --resume is let through to say it is complete", done: true, complete: true, wantAttempt: 1},
		{name: "--resume against another dataset is refused naming it", done: true, changed: true, opt: RunOptions{Resume: true}, wantErr: "is not the one this job was started with"},
		{name: "--fresh starts over", done: true, changed: true, opt: RunOptions{Fresh: true}, wantAttempt: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			cfg := &configs.Config{Server: configs.Server{Kind: "simulator", Layers: []int{2, 30, 58}, Simulator: configs.Simulator{HiddenSize: 8}}}
			first, err := dataset.Open(writeDataset(t, `{"input_ids": [1, 2]}`+"\n"+`{"input_ids": [3]}`+"\n"))
			if err != nil {
				t.Fatal(err)
			}
			ix, err := checkpoint.Open(filepath.Join(dir, "index.db"), checkpoint.OpenOptions{})
			if err != nil {
				t.Fatal(err)
			}
			defer ix.Close()
			if err := prepareIndex(ix, first, cfg, RunOptions{Log: quiet}); err != nil {
				t.Fatal(err)
			}
			if _, err := beginAttempts(ix, []int{0}); err != nil {
				t.Fatal(err)
			}
			if tt.done {
				if err := ix.CommitDone(checkpoint.Record{Sample: 1, State: checkpoint.StateDone, Attempt: 1, RID: "s000000001-a1", Updated: time.Now()}); err != nil {
					t.Fatal(err)
				}
			}
			if tt.complete {
				if err := ix.CommitDone(checkpoint.Record{Sample: 0, State: checkpoint.StateDone, Attempt: 1, RID: "s000000000-a1", Updated: time.Now()}); err != nil {
					t.Fatal(err)
				}
			}
			second := first
			if tt.changed {
				if second, err = dataset.Open(writeDataset(t, `{"input_ids": [9, 9]}`+"\n"+`{"input_ids": [3]}`+"\n")); err != nil {
					t.Fatal(err)
				}
			}
			tt.opt.Log = quiet
			err = prepareIndex(ix, second, cfg, tt.opt)
			if tt.wantErr != "" {
				if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want ErrRefused saying %q", err, tt.wantErr)
				}
				if tt.changed && !strings.Contains(err.Error(), second.Path) {
					t.Errorf("refusal does not name the dataset %s: %v", second.Path, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			p, err := ix.Load(second.Len())
			if err != nil {
				t.Fatal(err)
			}
			if p.Attempt[0] != tt.wantAttempt {
				t.Errorf("sample 0's attempt = %d, want %d", p.Attempt[0], tt.wantAttempt)
			}
		})
	}
}

// Issue 8, item 10: an index held by another reader (a verify, a doctor) is a temporary
// condition: cron should try again (exit 75), not see a failure (exit 1).
func TestARunThatFindsTheIndexHeldIsATemporaryFailure(t *testing.T) {
	out := t.TempDir()
	cfg := configs.Default()
	cfg.Dataset = writeDataset(t, `{"input_ids": [1, 2]}`+"\n")
	cfg.OutputDir, cfg.StateDir, cfg.ShmDir = out, filepath.Join(out, ".extract"), filepath.Join(t.TempDir(), "shm")
	cfg.Server.Kind = "simulator"
	if err := os.MkdirAll(cfg.StateDir, 0o755); err != nil {
		t.Fatal(err)
	}
	ix, err := checkpoint.Open(filepath.Join(cfg.StateDir, "index.db"), checkpoint.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ix.Close()
	reader, err := checkpoint.Open(filepath.Join(cfg.StateDir, "index.db"), checkpoint.OpenOptions{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	_, err = Run(context.Background(), &cfg, RunOptions{Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if !errors.Is(err, ErrTemporary) || !errors.Is(err, checkpoint.ErrLocked) {
		t.Fatalf("Run = %v; want ErrTemporary wrapping checkpoint.ErrLocked", err)
	}
}

// beginAttempts starts the next attempt of each sample, as a run's senders do.
func beginAttempts(ix *checkpoint.Index, samples []int) ([]int, error) {
	base, err := ix.AttemptBase()
	if err != nil {
		return nil, err
	}
	out := make([]int, len(samples))
	for i, s := range samples {
		r, _, err := ix.Get(s)
		if err != nil {
			return nil, err
		}
		out[i] = checkpoint.NextAttempt(r.Attempt, base)
		if err := ix.RecordAttempt(s, out[i], ""); err != nil {
			return nil, err
		}
	}
	return out, nil
}
