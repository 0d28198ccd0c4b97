package orchestrator

import (
	"context"
	"fmt"

	"golang.org/x/sync/errgroup"
)

// workers runs the run's goroutines, and whoever starts one waits for it. Its ctx lives
// until the coordinator is done with senders and movers, past the operator's signal; a
// goroutine that fails reports on failed, which ends the run.
type workers struct {
	ctx    context.Context
	cancel context.CancelFunc
	g      errgroup.Group
	failed chan error
}

func (w *workers) start(name string, fn func(ctx context.Context) error) {
	w.g.Go(func() error {
		err := fn(w.ctx)
		if err != nil && w.ctx.Err() == nil {
			select {
			case w.failed <- fmt.Errorf("%s: %w", name, err):
			default:
			}
		}
		return err
	})
}

// stop cancels every goroutine and waits for all of them. A goroutine's failure reached
// the loop through failed (start); what they return once cancelled is its echo.
func (w *workers) stop() {
	w.cancel()
	_ = w.g.Wait()
}
