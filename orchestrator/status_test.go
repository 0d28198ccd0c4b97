package orchestrator

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/extract-dev/extract/checkpoint"
	"github.com/extract-dev/extract/configs"
	"github.com/extract-dev/extract/sglang"
)

func TestLiveStatusSamplesEachConfiguredGPU(t *testing.T) {
	node := h200Node(map[int][]nvml.ProcessInfo{3: {{Pid: 1, UsedGpuMemory: 70 << 30}}})
	var got atomic.Pointer[[]GPUStatus]
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go sampleGPUs(ctx, sglang.NewGPUInspector(node), []int{2, 3}, time.Hour, &got, slog.New(slog.NewTextHandler(io.Discard, nil)))
	deadline := time.Now().Add(5 * time.Second)
	for got.Load() == nil {
		if time.Now().After(deadline) {
			t.Fatal("no GPU sample")
		}
		time.Sleep(10 * time.Millisecond)
	}
	gpus := *got.Load()
	if len(gpus) != 2 || gpus[1].Index != 3 || gpus[1].MemoryUsedBytes != 70<<30 || gpus[1].UtilizationPct != 97 || gpus[1].Processes != 1 || gpus[0].Processes != 0 {
		t.Fatalf("GPU status = %+v", gpus)
	}
}

func TestRatesAreMeasuredOverTheRecentWindow(t *testing.T) {
	var r rateTracker
	t0 := time.Now()
	r.add(ratePoint{at: t0.Add(-10 * time.Minute), samples: 0})
	r.add(ratePoint{at: t0.Add(-rateWindow), samples: 1000, tokens: 1000})
	r.add(ratePoint{at: t0, samples: 1120, tokens: 13000})
	sps, tps, _ := r.rates()
	want := 120 / rateWindow.Seconds()
	if sps < want*0.99 || sps > want*1.01 || tps < 99 || tps > 101 {
		t.Errorf("rates = %.3f samples/s, %.1f tokens/s; want %.3f and 100 (the old point must have dropped out)", sps, tps, want)
	}
}

func TestStatusWhereNoJobHasRunSaysThereIsNoIndexAndIsAUsageError(t *testing.T) {
	cfg := &configs.Config{Dataset: writeDataset(t, `{"input_ids": [1]}`+"\n"+`{"input_ids": [2]}`), StateDir: t.TempDir()}
	_, err := QueryStatus(context.Background(), cfg)
	if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "no index at "+filepath.Join(cfg.StateDir, "index.db")) {
		t.Fatalf("status before any run = %v, want ErrRefused naming the missing index", err)
	}
}

// A state dir that holds only shards' state points at --all.
func TestStatusOfAStateDirHoldingOnlyShardsPointsAtAll(t *testing.T) {
	state := t.TempDir()
	if err := os.MkdirAll(filepath.Join(state, configs.ShardDirName(0, 2)), 0o755); err != nil {
		t.Fatal(err)
	}
	ix, err := checkpoint.Open(filepath.Join(state, configs.ShardDirName(0, 2), "index.db"), checkpoint.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ix.Close()
	cfg := &configs.Config{Dataset: writeDataset(t, `{"input_ids": [1]}`), StateDir: state}
	_, err = QueryStatus(context.Background(), cfg)
	if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "`extract status --all`") {
		t.Fatalf("status of a state dir with only shards = %v, want ErrRefused pointing at --all", err)
	}
}
