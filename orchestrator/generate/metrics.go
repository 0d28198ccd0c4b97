package generate

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// endpoint serves a running generate's /status and /metrics on status.listen (the
// extraction's endpoint comes up only after the generate stage ends).
type endpoint struct {
	mu   sync.Mutex
	cur  Status
	srv  *http.Server
	addr string

	reg        *prometheus.Registry
	total      prometheus.Gauge
	finished   *prometheus.GaugeVec
	pending    prometheus.Gauge
	tokens     prometheus.Gauge
	requests   prometheus.Gauge
	tokensRate prometheus.Gauge
	convRate   prometheus.Gauge
	flags      *prometheus.GaugeVec
	up         *prometheus.GaugeVec
}

func startEndpoint(listen string) (*endpoint, error) {
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, fmt.Errorf("status.listen %s: %w", listen, err)
	}
	e := &endpoint{addr: ln.Addr().String(), reg: prometheus.NewRegistry(),
		total:      prometheus.NewGauge(prometheus.GaugeOpts{Name: "extract_generate_conversations_total", Help: "Conversations this generate owns (the shard's lines)."}),
		finished:   prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "extract_generate_conversations", Help: "Conversations finished in this run, by state (done, dropped, failed)."}, []string{"state"}),
		pending:    prometheus.NewGauge(prometheus.GaugeOpts{Name: "extract_generate_conversations_pending", Help: "Conversations without a record."}),
		tokens:     prometheus.NewGauge(prometheus.GaugeOpts{Name: "extract_generate_tokens", Help: "Tokens generated in this run."}),
		requests:   prometheus.NewGauge(prometheus.GaugeOpts{Name: "extract_generate_requests", Help: "Generation requests sent in this run."}),
		tokensRate: prometheus.NewGauge(prometheus.GaugeOpts{Name: "extract_generate_tokens_per_second", Help: "Tokens generated per second over the last minute."}),
		convRate:   prometheus.NewGauge(prometheus.GaugeOpts{Name: "extract_generate_conversations_per_second", Help: "Conversations finished per second over the last minute."}),
		flags:      prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "extract_generate_flags", Help: "Replies flagged by a validation rule in this run, by flag."}, []string{"flag"}),
		up:         prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "extract_generate_server_up", Help: "1 while the replica's server is ready."}, []string{"replica"}),
	}
	e.reg.MustRegister(e.total, e.finished, e.pending, e.tokens, e.requests, e.tokensRate, e.convRate, e.flags, e.up)
	mux := http.NewServeMux()
	mux.HandleFunc("/status", func(w http.ResponseWriter, _ *http.Request) {
		e.mu.Lock()
		s := e.cur
		e.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(s) // a client gone mid-reply is its own loss
	})
	mux.Handle("/metrics", promhttp.HandlerFor(e.reg, promhttp.HandlerOpts{}))
	e.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = e.srv.Serve(ln) }() // ends with ErrServerClosed at close
	return e, nil
}

func (e *endpoint) set(s Status) {
	e.mu.Lock()
	e.cur = s
	e.mu.Unlock()
	e.total.Set(float64(s.Total))
	e.finished.WithLabelValues("done").Set(float64(s.Done))
	e.finished.WithLabelValues("dropped").Set(float64(s.Dropped))
	e.finished.WithLabelValues("failed").Set(float64(s.Failed))
	e.pending.Set(float64(s.Pending))
	e.tokens.Set(float64(s.GeneratedTokens))
	e.requests.Set(float64(s.Requests))
	e.tokensRate.Set(s.TokensPerSecond)
	e.convRate.Set(s.ConversationsPerSecond)
	for f, n := range s.Flags {
		e.flags.WithLabelValues(f).Set(float64(n))
	}
	for i, st := range s.Replicas {
		v := 0.0
		if st == "ready" {
			v = 1
		}
		e.up.WithLabelValues(fmt.Sprint(i)).Set(v)
	}
}

func (e *endpoint) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = e.srv.Shutdown(ctx) // status only: nothing to save
}
