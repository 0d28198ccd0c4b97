package orchestrator

import (
	"context"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
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

func TestStatusBeforeTheFirstRunCountsTheDatasetAsPending(t *testing.T) {
	cfg := &configs.Config{Dataset: writeDataset(t, `{"input_ids": [1]}`+"\n"+`{"input_ids": [2]}`+"\n"+`{"input_ids": [3]}`), StateDir: t.TempDir()}
	st, err := QueryStatus(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if st.State != "stopped" || st.Total != 3 || st.Pending != 3 || st.Done != 0 {
		t.Errorf("status before any run = %+v", st)
	}
}
