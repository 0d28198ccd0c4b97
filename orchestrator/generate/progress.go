package generate

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/extract-dev/extract/internal/atomicfile"
)

// Status is a generate run's progress, live (OnStatus, the snapshot file) and final.
type Status struct {
	Kind                   string         `json:"kind"` // "generate"
	State                  string         `json:"state"`
	PID                    int            `json:"pid"`
	Total                  int            `json:"total"`
	Done                   int            `json:"done"`
	Dropped                int            `json:"dropped"`
	Failed                 int            `json:"failed"`
	Pending                int            `json:"pending"`
	Requests               int64          `json:"requests"`
	GeneratedTokens        int64          `json:"generated_tokens"`
	TokensPerSecond        float64        `json:"tokens_per_second"`
	ConversationsPerSecond float64        `json:"conversations_per_second"`
	ETASeconds             float64        `json:"eta_seconds"`
	Flags                  map[string]int `json:"flags,omitempty"`
	Replicas               []string       `json:"replicas,omitempty"`
	// Addr is the live /status and /metrics endpoint (status.listen), while running.
	Addr    string    `json:"addr,omitempty"`
	Updated time.Time `json:"updated"`
}

// StatusName is the snapshot a running generate rewrites every second in its dir.
const StatusName = "status.json"

// progress counts what this run did; rates are over the last minute.
type progress struct {
	mu                    sync.Mutex
	o                     Options
	total, before         int
	done, dropped, failed int
	requests, generated   int64
	flags                 map[string]int
	window                []sample
}

type sample struct {
	at       time.Time
	tokens   int64
	finished int
}

func newProgress(total, before int, o Options) *progress {
	return &progress{o: o, total: total, before: before, flags: map[string]int{}}
}

func (p *progress) add(r *Record) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch r.State {
	case Done:
		p.done++
	case Dropped:
		p.dropped++
	case Failed:
		p.failed++
	}
}

func (p *progress) request() {
	p.mu.Lock()
	p.requests++
	p.mu.Unlock()
}

func (p *progress) addTokens(n int) {
	p.mu.Lock()
	p.generated += int64(n)
	p.mu.Unlock()
}

func (p *progress) flagged(fs []Flag) {
	p.mu.Lock()
	for _, f := range fs {
		p.flags[string(f)]++
	}
	p.mu.Unlock()
}

func (p *progress) finished() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.before + p.done + p.dropped + p.failed
}

// snapshot is the status now; the counts of finished conversations include earlier runs'.
func (p *progress) snapshot(state string, reps []string) Status {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	fin := p.done + p.dropped + p.failed
	p.window = append(p.window, sample{at: now, tokens: p.generated, finished: fin})
	for len(p.window) > 2 && now.Sub(p.window[0].at) > time.Minute {
		p.window = p.window[1:]
	}
	s := Status{Kind: "generate", State: state, PID: os.Getpid(), Total: p.total, Done: p.done, Dropped: p.dropped, Failed: p.failed,
		Requests: p.requests, GeneratedTokens: p.generated, Replicas: reps, Updated: now.UTC(), Flags: map[string]int{}}
	for k, v := range p.flags {
		s.Flags[k] = v
	}
	s.Pending = p.total - p.before - fin
	if first := p.window[0]; now.Sub(first.at) > 500*time.Millisecond {
		dt := now.Sub(first.at).Seconds()
		s.TokensPerSecond = float64(p.generated-first.tokens) / dt
		s.ConversationsPerSecond = float64(fin-first.finished) / dt
		if s.ConversationsPerSecond > 0 {
			s.ETASeconds = float64(s.Pending) / s.ConversationsPerSecond
		}
	}
	return s
}

// tick publishes the status every second (OnStatus, and the snapshot file status
// reads while the run holds the lock) until the returned stop is called.
func (p *progress) tick(ctx context.Context, pl *pool, ep *endpoint) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	publish := func(state string) {
		s := p.snapshot(state, pl.states())
		if ep != nil {
			s.Addr = ep.addr
			ep.set(s)
		}
		if p.o.OnStatus != nil {
			p.o.OnStatus(s)
		}
		if b, err := json.Marshal(s); err == nil {
			if err := atomicfile.WriteFile(filepath.Join(p.o.Dir, StatusName), b, 0o644); err != nil {
				p.o.Log.Debug("generate: status snapshot", "err", err)
			}
		}
	}
	go func() {
		defer wg.Done()
		t := time.NewTicker(time.Second)
		defer t.Stop()
		last := time.Now()
		for {
			select {
			case <-t.C:
				publish("running")
				if time.Since(last) >= 30*time.Second {
					last = time.Now()
					s := p.snapshot("running", nil)
					p.o.Log.Info("generate: progress", "done", s.Done, "dropped", s.Dropped, "failed", s.Failed, "pending", s.Pending,
						"tokens_per_second", int(s.TokensPerSecond), "conversations_per_second", s.ConversationsPerSecond, "eta_seconds", int(s.ETASeconds))
				}
			case <-done:
				publish("stopped")
				return
			case <-ctx.Done():
				<-done
				publish("stopped")
				return
			}
		}
	}()
	return func() { close(done); wg.Wait() }
}
