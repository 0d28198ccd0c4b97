package orchestrator

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/extract-dev/extract/configs"
	"github.com/extract-dev/extract/dataset"
	"github.com/extract-dev/extract/shm"
)

// Movers beyond run.movers only wait on the disk: one that cannot start a copy must not
// take a dump, or a stop would copy every dump so taken instead of leaving it in staging.
func TestMoversTakeNoDumpWithoutACopySlot(t *testing.T) {
	cfg := configs.Default()
	cfg.Server.Kind, cfg.Server.Simulator.HiddenSize, cfg.Server.Layers = "simulator", 8, []int{2, 30, 58}
	cfg.Run.Movers, cfg.OutputDir = 1, t.TempDir()
	ds, err := dataset.Open(writeDataset(t, `{"input_ids": [1, 2]}`+"\n"))
	if err != nil {
		t.Fatal(err)
	}
	defer ds.Close()
	m := newMovers(&cfg, ds, nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	m.copySlots <- struct{}{} // the only slot: a long copy under way
	m.running.Store(int32(moverGoroutines(&cfg)))
	var wg sync.WaitGroup
	for range moverGoroutines(&cfg) {
		wg.Go(func() { m.loop(ctx) })
	}
	staging := t.TempDir()
	taken := 0
	for i := range moverGoroutines(&cfg) {
		p := filepath.Join(staging, fmt.Sprintf("dump%d", i))
		if err := os.WriteFile(p, []byte("not a dump"), 0o644); err != nil {
			t.Fatal(err)
		}
		select {
		case m.jobs <- moveJob{dump: shm.Dump{Path: p, RID: shm.RID{Sample: 0, Attempt: 1}}}:
			taken++
		case <-time.After(20 * time.Millisecond):
		}
	}
	close(m.jobs) // the run stops: finish
	<-m.copySlots
	ran := 0
	for done := false; !done; {
		select {
		case <-m.moved:
			ran++
		case <-m.done:
			done = true
		}
	}
	ran += len(m.moved)
	wg.Wait()
	if taken > 0 || ran > 0 {
		t.Errorf("with the only copy slot busy, movers took %d dumps and moved %d after the stop; want none", taken, ran)
	}
}
