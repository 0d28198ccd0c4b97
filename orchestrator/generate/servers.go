package generate

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/extract-dev/extract/sglang"
)

// ErrServers marks servers that would not stay up within their restart budget, or a
// port another process holds (exit 75: worth a retry later).
var ErrServers = errors.New("generation servers unavailable")

// Replica is one server of the job, launched, adopted and restarted through its
// Manager, as the extraction's replicas are.
type Replica struct {
	Mgr    *sglang.Manager
	Client *sglang.Client
}

// repState is what the pool knows of a replica. An epoch is one life of its server: the
// epoch's context ends when the server is seen gone, and every request of that life
// with it, so nothing is resent to the next life under the client's retries (a poison
// prompt would kill it again before we count).
type repState struct {
	Replica
	n        int
	ready    bool
	epoch    int
	ctx      context.Context
	cancel   context.CancelFunc
	inflight int
	reserved bool // a conversation sent alone waits for this replica to drain
	alone    bool // it is in flight, alone
	restarts int
}

// pool hands out request slots over the ready replicas, least loaded first.
type pool struct {
	mu          sync.Mutex
	reps        []*repState
	changed     chan struct{} // closed and replaced at every change
	log         *slog.Logger
	maxRestarts int
	window      time.Duration
	health      Health
}

func newPool(reps []Replica, maxRestarts int, window time.Duration, health Health, log *slog.Logger) *pool {
	p := &pool{changed: make(chan struct{}), log: log, maxRestarts: maxRestarts, window: window, health: health}
	for i, r := range reps {
		p.reps = append(p.reps, &repState{Replica: r, n: i})
	}
	return p
}

// broadcast wakes the waiters; the caller holds mu.
func (p *pool) broadcast() {
	close(p.changed)
	p.changed = make(chan struct{})
}

// slot is one request's hold on a replica life.
type slot struct {
	rep   *repState
	epoch int
	ctx   context.Context
	alone bool
}

// acquire waits for a ready replica. alone waits for one with nothing else in flight
// and keeps the others off it until released: a server death then has one suspect.
func (p *pool) acquire(ctx context.Context, alone bool) (slot, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for {
		if alone {
			for _, r := range p.reps {
				if r.ready && r.reserved && r.inflight == 0 {
					// Ours, or a reservation left by a waiter that gave up: take it.
					r.inflight++
					r.alone = true
					return slot{rep: r, epoch: r.epoch, ctx: r.ctx, alone: true}, nil
				}
			}
			reserved := false
			for _, r := range p.reps {
				reserved = reserved || r.reserved
			}
			if !reserved {
				if r := p.leastLoaded(); r != nil {
					r.reserved = true
					continue // it may be idle already: nobody else would wake us
				}
			}
		} else if r := p.leastLoaded(); r != nil {
			r.inflight++
			return slot{rep: r, epoch: r.epoch, ctx: r.ctx}, nil
		}
		ch := p.changed
		p.mu.Unlock()
		select {
		case <-ch:
			p.mu.Lock()
		case <-ctx.Done():
			p.mu.Lock()
			return slot{}, ctx.Err()
		}
	}
}

func (p *pool) leastLoaded() *repState {
	var best *repState
	for _, r := range p.reps {
		if r.ready && !r.reserved && !r.alone && (best == nil || r.inflight < best.inflight) {
			best = r
		}
	}
	return best
}

// release ends s and says whether its server died meanwhile.
func (p *pool) release(s slot) (died bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	r := s.rep
	if r.epoch == s.epoch {
		r.inflight--
	}
	if s.alone {
		r.alone, r.reserved = false, false
	}
	p.broadcast()
	return r.epoch != s.epoch
}

// states is each replica's state, for status.
func (p *pool) states() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]string, len(p.reps))
	for i, r := range p.reps {
		out[i] = "starting"
		if r.ready {
			out[i] = "ready"
		}
	}
	return out
}

// Health is server.health_*: a hang is Failures probes of /health_generate in a row
// failing or timing out, one every Interval.
type Health struct {
	Interval, Timeout time.Duration
	Failures          int
}

// probe closes hung once r's server fails Failures probes in a row, until ctx ends.
func (p *pool) probe(ctx context.Context, r *repState, hung chan<- struct{}) {
	if p.health.Interval <= 0 || p.health.Failures <= 0 {
		return
	}
	t := time.NewTicker(p.health.Interval)
	defer t.Stop()
	failed := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		pctx, cancel := context.WithTimeout(ctx, p.health.Timeout)
		err := r.Client.HealthGenerate(pctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			failed = 0
			continue
		}
		failed++
		p.log.Warn("generate: server health probe failed", "replica", r.n, "consecutive", failed, "err", err)
		if failed >= p.health.Failures {
			close(hung)
			return
		}
	}
}

// supervise keeps replica r up until ctx ends: launch or adopt, wait for its exit, end
// its life's requests, restart after a backoff within server.max_restarts per window.
func (p *pool) supervise(ctx context.Context, r *repState) error {
	var deaths []time.Time
	for {
		srv, err := r.Mgr.Ensure(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if errors.Is(err, sglang.ErrPortTaken) {
			return fmt.Errorf("%w: replica %d: %v", ErrServers, r.n, err)
		}
		if err == nil {
			lifeCtx, cancel := context.WithCancel(ctx)
			p.mu.Lock()
			r.ready, r.ctx, r.cancel = true, lifeCtx, cancel
			p.broadcast()
			p.mu.Unlock()
			p.log.Info("generate: server ready", "replica", r.n, "pid", srv.PID, "adopted", srv.Adopted, "url", r.Mgr.Spec.BaseURL())
			hung := make(chan struct{})
			go p.probe(lifeCtx, r, hung)
			select {
			case <-r.Mgr.Exited():
			case <-hung:
				// Its requests would hang until run.request_timeout: end the life now.
				p.log.Error("generate: server hung: stopping its process group", "replica", r.n, "pid", srv.PID, "failed_probes", p.health.Failures)
				sctx, scancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
				if err := r.Mgr.Stop(sctx, 5*time.Second); err != nil {
					p.log.Warn("generate: stop hung server", "replica", r.n, "err", err)
				}
				scancel()
			case <-ctx.Done():
				cancel()
				return nil
			}
			p.mu.Lock()
			r.ready, r.reserved, r.alone, r.inflight = false, false, false, 0
			r.epoch++
			cancel()
			p.broadcast()
			p.mu.Unlock()
			p.log.Error("generate: server exited", "replica", r.n, "pid", srv.PID)
			r.Client.CloseIdleConnections()
		} else {
			p.log.Warn("generate: server start failed", "replica", r.n, "err", err)
		}
		now := time.Now()
		recent := deaths[:0]
		for _, t := range deaths {
			if now.Sub(t) < p.window {
				recent = append(recent, t)
			}
		}
		deaths = append(recent, now)
		if len(deaths) > p.maxRestarts {
			return fmt.Errorf("%w: server replica %d died or failed to start %d times within %s (server.max_restarts %d); see %s",
				ErrServers, r.n, len(deaths), p.window, p.maxRestarts, r.Mgr.LogPath())
		}
		r.restarts++
		backoff := min(time.Second<<(len(deaths)-1), time.Minute)
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
			return nil
		}
	}
}
