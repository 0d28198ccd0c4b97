// Package simulator is a stand-in for a patched SGLang server: the same HTTP API and the
// same dump protocol v1, with deterministic hidden states, a prefill rate and injectable faults.
package simulator

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spf13/pflag"

	"github.com/extract-dev/extract/configs"
)

// ReadyMessage is what SGLang logs once it serves; operators and scripts grep for it.
const ReadyMessage = "The server is fired up and ready to roll!"

// DefaultHookVersion is reported in every dump's metadata when Config.HookVersion is empty.
const DefaultHookVersion = "sim-1"

// Config describes one simulated server: where it listens and writes, the model it
// claims to be, and the job's server.simulator options. Its flags (BindFlags) are what
// sglang.LaunchSpec.Argv emits for server kind "simulator".
type Config struct {
	Host string
	// Port 0 picks a free port; Server.Addr tells which.
	Port   int
	ShmDir string
	// Model is reported as model_path.
	Model  string
	TPSize int
	// NumLayers is the model's depth; the final hidden state is tagged with layer id NumLayers.
	NumLayers int
	// Layers is the effective layers_to_capture, three ids below NumLayers.
	Layers      []int
	HookVersion string
	configs.Simulator
}

// BindFlags registers one flag per field, with the names sglang.LaunchSpec.Argv uses.
func (c *Config) BindFlags(fs *pflag.FlagSet) {
	fs.StringVar(&c.Host, "host", "127.0.0.1", "address to listen on")
	fs.IntVar(&c.Port, "port", 30000, "port to listen on (0 picks a free one)")
	fs.StringVar(&c.ShmDir, "shm-dir", "/dev/shm/sglang_hs", "directory the dumps are written to")
	fs.StringVar(&c.Model, "model", "simulator", "model path to report")
	fs.IntVar(&c.TPSize, "tp-size", 1, "tensor parallel size to report")
	fs.IntVar(&c.HiddenSize, "hidden-size", 64, "hidden size H of every captured layer")
	fs.IntVar(&c.NumLayers, "num-layers", 61, "model depth; the final hidden state is layer id num-layers")
	fs.IntSliceVar(&c.Layers, "layers", []int{2, 30, 58}, "effective layers_to_capture (three ids)")
	fs.Float64Var(&c.TokensPerSecond, "tokens-per-second", 0, "global prefill rate (0: unlimited)")
	fs.DurationVar(&c.StartupDelay, "startup-delay", 0, "how long /health_generate answers 503 at start")
	fs.StringVar(&c.HookVersion, "hook-version", DefaultHookVersion, "hook_version written to dump metadata")
	fs.IntVar(&c.ExitAfter, "exit-after", 0, "fault: exit with status 3 after N completed requests")
	fs.IntVar(&c.HangAfter, "hang-after", 0, "fault: hang /generate and /health_generate after N completed requests")
	fs.IntVar(&c.Fail503Every, "fail-503-every", 0, "fault: answer every Nth /generate with 503")
	fs.IntVar(&c.CorruptEvery, "corrupt-every", 0, "fault: write every Nth dump with input_ids that differ from the request's")
	fs.DurationVar(&c.LateDumpDelay, "late-dump-delay", 0, "fault: write each dump this long after answering")
	fs.DurationVar(&c.DecodeDelay, "decode-delay", 0, "time per generated token after the first, between the dump and the answer")
	fs.StringVar(&c.RequestLog, "request-log", "", "append \"rid port open\" of every /generate received to this file")
	fs.IntSliceVar(&c.CrashOnSamples, "crash-on-samples", nil, "fault: exit with status 3 when a request for one of these samples arrives")
	fs.IntVar(&c.ReplyTokens, "gen-reply-tokens", 0, "most content bytes of a generated reply (0: 24)")
	fs.IntVar(&c.EmptyEvery, "gen-empty-every", 0, "about one generated reply in N is empty")
	fs.IntVar(&c.ThinkEvery, "gen-think-every", 0, "about one generated reply in N carries a think marker")
	fs.IntVar(&c.ContextLength, "gen-context-length", 0, "refuse a generation prompt longer than this with 400 (0: no bound)")
	fs.StringSliceVar(&c.CrashOnRID, "crash-on-rid", nil, "fault: exit with status 3 when a generation rid with this prefix arrives")
}

func (c *Config) normalize() error {
	if c.Host == "" {
		c.Host = "127.0.0.1"
	}
	if c.TPSize == 0 {
		c.TPSize = 1
	}
	if c.HookVersion == "" {
		c.HookVersion = DefaultHookVersion
	}
	var bad []string
	if c.Port < 0 || c.Port > 65535 {
		bad = append(bad, fmt.Sprintf("port %d out of range", c.Port))
	}
	if c.ShmDir == "" {
		bad = append(bad, "shm dir is empty")
	}
	if c.Model == "" {
		bad = append(bad, "model is empty")
	}
	if c.HiddenSize <= 0 {
		bad = append(bad, fmt.Sprintf("hidden size %d must be positive", c.HiddenSize))
	}
	if c.NumLayers <= 0 {
		bad = append(bad, fmt.Sprintf("num layers %d must be positive", c.NumLayers))
	}
	if len(c.Layers) != 3 {
		bad = append(bad, fmt.Sprintf("layers %v: protocol v1 captures exactly three", c.Layers))
	}
	for _, l := range c.Layers {
		if l < 0 || l >= c.NumLayers {
			bad = append(bad, fmt.Sprintf("layer %d outside 0..%d", l, c.NumLayers-1))
		}
	}
	if c.TokensPerSecond < 0 || c.TPSize < 0 || c.ExitAfter < 0 || c.HangAfter < 0 || c.Fail503Every < 0 || c.CorruptEvery < 0 || c.ReplyTokens < 0 || c.EmptyEvery < 0 || c.ThinkEvery < 0 || c.ContextLength < 0 || c.StartupDelay < 0 || c.LateDumpDelay < 0 || c.DecodeDelay < 0 {
		bad = append(bad, "rates, counts and delays must not be negative")
	}
	if len(bad) > 0 {
		return fmt.Errorf("simulator config: %s", strings.Join(bad, "; "))
	}
	return nil
}

// Server is a listening simulator; Serve answers requests.
type Server struct {
	cfg     Config
	log     *slog.Logger
	ln      net.Listener
	readyAt time.Time
	marker  string // the hook marker file, removed on a clean shutdown

	received  atomic.Int64 // /generate calls, for Fail503Every
	open      atomic.Int64 // /generate calls under way, for the request log
	dumped    atomic.Int64 // dumps written, for CorruptEvery
	completed atomic.Int64 // answered 200, for ExitAfter and HangAfter
	hung      chan struct{}
	hangOnce  sync.Once

	clockMu sync.Mutex
	clock   time.Time // end of the last prefill reservation

	late sync.WaitGroup
}

// Run listens, serves until ctx is done, and returns nil after a clean shutdown.
func Run(ctx context.Context, cfg Config, log *slog.Logger) error {
	s, err := Listen(cfg, log)
	if err != nil {
		return err
	}
	return s.Serve(ctx)
}

// Listen checks cfg, creates the shm dir and binds the port; the startup delay runs from here.
func Listen(cfg Config, log *slog.Logger) (*Server, error) {
	if err := cfg.normalize(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.ShmDir, 0o700); err != nil {
		return nil, fmt.Errorf("simulator shm dir %s: %w", cfg.ShmDir, err)
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(cfg.Host, strconv.Itoa(cfg.Port)))
	if err != nil {
		return nil, fmt.Errorf("simulator listen on %s:%d: %w", cfg.Host, cfg.Port, err)
	}
	marker, err := writeMarker(cfg)
	if err != nil {
		_ = ln.Close()
		return nil, err
	}
	s := &Server{cfg: cfg, log: log, ln: ln, readyAt: time.Now().Add(cfg.StartupDelay), hung: make(chan struct{}), marker: marker}
	log.Info("simulator listening", "addr", s.Addr(), "pid", os.Getpid(), "model", cfg.Model,
		"hidden_size", cfg.HiddenSize, "layers", joinInts(cfg.Layers), "shm_dir", cfg.ShmDir,
		"tokens_per_second", cfg.TokensPerSecond, "startup_delay", cfg.StartupDelay)
	return s, nil
}

// Addr is the host:port the server listens on.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Serve answers requests until ctx is done. Request contexts derive from ctx, so hung
// and waiting handlers return when it ends, and shutdown does not wait on them.
func (s *Server) Serve(ctx context.Context) error {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /generate", func(w http.ResponseWriter, r *http.Request) { s.generate(ctx, w, r) })
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	mux.HandleFunc("GET /health_generate", s.healthGenerate)
	mux.HandleFunc("GET /server_info", s.serverInfo)
	mux.HandleFunc("GET /get_server_info", s.serverInfo)
	mux.HandleFunc("GET /model_info", s.modelInfo)
	srv := &http.Server{Handler: mux, BaseContext: func(net.Listener) context.Context { return ctx }, ReadHeaderTimeout: 10 * time.Second}

	go func() {
		t := time.NewTimer(time.Until(s.readyAt))
		defer t.Stop()
		select {
		case <-t.C:
			s.log.Info(ReadyMessage, "addr", s.Addr())
		case <-ctx.Done():
		}
	}()

	served := make(chan error, 1)
	go func() { served <- srv.Serve(s.ln) }()
	select {
	case err := <-served:
		return fmt.Errorf("simulator serve on %s: %w", s.Addr(), err)
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := srv.Shutdown(shutdownCtx)
	s.late.Wait()
	_ = os.Remove(s.marker)
	s.log.Info("simulator stopped", "addr", s.Addr(), "completed", s.completed.Load())
	if err != nil {
		return fmt.Errorf("simulator shutdown on %s: %w", s.Addr(), err)
	}
	return nil
}

type generateRequest struct {
	RID            string  `json:"rid"`
	InputIDs       []int64 `json:"input_ids"`
	Text           *string `json:"text"`
	SamplingParams struct {
		MaxNewTokens int   `json:"max_new_tokens"`
		Seed         int64 `json:"sampling_seed"`
	} `json:"sampling_params"`
}

type finishReason struct {
	Type   string `json:"type"`
	Length int    `json:"length"`
}

type metaInfo struct {
	ID               string       `json:"id"`
	PromptTokens     int          `json:"prompt_tokens"`
	CompletionTokens int          `json:"completion_tokens"`
	FinishReason     finishReason `json:"finish_reason"`
	E2ELatency       float64      `json:"e2e_latency"`
}

type generateResponse struct {
	Text      string   `json:"text"`
	OutputIDs []int64  `json:"output_ids"`
	MetaInfo  metaInfo `json:"meta_info"`
}

func (s *Server) generate(ctx context.Context, w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	if s.blockIfHung(r) {
		return
	}
	if start.Before(s.readyAt) {
		writeError(w, http.StatusServiceUnavailable, "server is starting")
		return
	}
	if n := s.received.Add(1); s.cfg.Fail503Every > 0 && n%int64(s.cfg.Fail503Every) == 0 {
		s.log.Info("injected fault: 503", "request", n)
		writeError(w, http.StatusServiceUnavailable, fmt.Sprintf("injected fault: request %d of every %d fails", n, s.cfg.Fail503Every))
		return
	}
	open := s.open.Add(1)
	defer s.open.Add(-1)
	var req generateRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, "request body is not a generate request: "+err.Error())
		return
	}
	if err := s.logRequest(req.RID, open); err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	ids, msg := req.tokens()
	if msg != "" {
		writeError(w, http.StatusBadRequest, msg)
		return
	}
	if isGeneration(req.RID) {
		s.answerGeneration(w, r, &req, ids, start)
		return
	}
	if s.crashesOn(req.RID) {
		s.log.Info("injected fault: a sample that kills the server", "rid", req.RID, "status", 3)
		os.Exit(3)
	}
	if err := s.prefill(r.Context(), len(ids)); err != nil {
		s.log.Debug("request abandoned during prefill", "rid", req.RID, "error", err)
		return
	}
	if s.cfg.LateDumpDelay == 0 {
		if err := writeDump(s.cfg, req.RID, s.dumpIDs(ids)); err != nil {
			s.log.Error("dump failed", "rid", req.RID, "error", err)
			writeError(w, http.StatusInternalServerError, err.Error())
			return
		}
	}
	if n := req.SamplingParams.MaxNewTokens; n > 1 && s.cfg.DecodeDelay > 0 {
		select {
		case <-time.After(time.Duration(n-1) * s.cfg.DecodeDelay):
		case <-r.Context().Done():
			return
		}
	}
	writeJSON(w, http.StatusOK, generateResponse{
		OutputIDs: []int64{ids[len(ids)-1]},
		MetaInfo: metaInfo{
			ID: req.RID, PromptTokens: len(ids), CompletionTokens: 1,
			FinishReason: finishReason{Type: "length", Length: 1},
			E2ELatency:   time.Since(start).Seconds(),
		},
	})
	s.log.Debug("generated", "rid", req.RID, "prompt_tokens", len(ids), "latency", time.Since(start))
	if s.cfg.LateDumpDelay > 0 {
		s.late.Add(1)
		go s.lateDump(ctx, req.RID, ids)
	}
	s.complete(w)
}

// dumpIDs are the ids a dump records: the request's, but for every CorruptEvery-th dump.
func (s *Server) dumpIDs(ids []int64) []int64 {
	if n := s.dumped.Add(1); s.cfg.CorruptEvery == 0 || n%int64(s.cfg.CorruptEvery) != 0 {
		return ids
	}
	bad := append([]int64(nil), ids...)
	bad[len(bad)-1]++
	return bad
}

// tokens returns the request's token ids, or a message saying why it is a bad request.
func (req *generateRequest) tokens() ([]int64, string) {
	switch {
	case req.RID == "":
		return nil, "rid is required"
	case req.RID == "." || req.RID == ".." || strings.ContainsAny(req.RID, "/\x00"):
		return nil, fmt.Sprintf("rid %q cannot name a dump file", req.RID)
	case req.InputIDs != nil && req.Text != nil:
		return nil, "give either input_ids or text, not both"
	case req.InputIDs == nil && req.Text == nil:
		return nil, "input_ids or text is required"
	}
	ids := req.InputIDs
	if req.Text != nil {
		ids = Tokenize(*req.Text)
	}
	if len(ids) == 0 {
		return nil, "the prompt is empty"
	}
	for i, id := range ids {
		if id < 0 {
			return nil, fmt.Sprintf("input_ids[%d] = %d is negative", i, id)
		}
	}
	return ids, ""
}

// prefill waits this request's turn on the virtual GPU clock: each request reserves
// tokens/TokensPerSecond seconds after the previous reservation ends.
func (s *Server) prefill(ctx context.Context, tokens int) error {
	if s.cfg.TokensPerSecond <= 0 {
		return nil
	}
	d := time.Duration(float64(tokens) / s.cfg.TokensPerSecond * float64(time.Second))
	s.clockMu.Lock()
	if now := time.Now(); s.clock.Before(now) {
		s.clock = now
	}
	s.clock = s.clock.Add(d)
	done := s.clock
	s.clockMu.Unlock()
	t := time.NewTimer(time.Until(done))
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *Server) lateDump(ctx context.Context, rid string, ids []int64) {
	defer s.late.Done()
	t := time.NewTimer(s.cfg.LateDumpDelay)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
		s.log.Info("late dump abandoned at shutdown", "rid", rid)
		return
	}
	if err := writeDump(s.cfg, rid, s.dumpIDs(ids)); err != nil {
		s.log.Error("late dump failed", "rid", rid, "error", err)
		return
	}
	s.log.Info("late dump written", "rid", rid, "delay", s.cfg.LateDumpDelay)
}

// complete counts a finished request and fires the count-triggered faults.
func (s *Server) complete(w http.ResponseWriter) {
	n := s.completed.Add(1)
	if s.cfg.HangAfter > 0 && n >= int64(s.cfg.HangAfter) {
		s.hangOnce.Do(func() {
			s.log.Info("injected fault: hanging", "completed", n)
			close(s.hung)
		})
	}
	if s.cfg.ExitAfter > 0 && n >= int64(s.cfg.ExitAfter) {
		// Flush first so the client gets this answer: the fault is a crash after the
		// Nth request, not during it.
		if f, ok := w.(http.Flusher); ok {
			f.Flush()
		}
		s.log.Info("injected fault: exiting", "completed", n, "status", 3)
		os.Exit(3)
	}
}

// crashesOn says whether rid is a request for one of CrashOnSamples.
func (s *Server) crashesOn(rid string) bool {
	if len(s.cfg.CrashOnSamples) == 0 || len(rid) < 10 || rid[0] != 's' {
		return false
	}
	n, err := strconv.Atoi(rid[1:10])
	return err == nil && slices.Contains(s.cfg.CrashOnSamples, n)
}

// blockIfHung holds the request until it is cancelled when the hang fault has fired.
func (s *Server) blockIfHung(r *http.Request) bool {
	select {
	case <-s.hung:
		<-r.Context().Done()
		return true
	default:
		return false
	}
}

func (s *Server) healthGenerate(w http.ResponseWriter, r *http.Request) {
	if s.blockIfHung(r) {
		return
	}
	if time.Now().Before(s.readyAt) {
		writeError(w, http.StatusServiceUnavailable, "server is starting")
		return
	}
	w.WriteHeader(http.StatusOK)
}

func (s *Server) serverInfo(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{
		"model_path":               s.cfg.Model,
		"tp_size":                  s.cfg.TPSize,
		"disable_radix_cache":      true,
		"chunked_prefill_size":     -1,
		"enable_two_batch_overlap": false,
		"version":                  "simulator",
		"hidden_size":              s.cfg.HiddenSize,
		"num_hidden_layers":        s.cfg.NumLayers,
		"layers_to_capture":        s.cfg.Layers,
		"hook_version":             s.cfg.HookVersion,
	})
}

func (s *Server) modelInfo(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{"model_path": s.cfg.Model, "is_generation": true})
}

// writeError answers in SGLang's error shape: {"error": {"message": ...}}.
func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]any{"error": map[string]any{"message": msg, "code": status}})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	// A write error means the client has gone; there is no one left to tell.
	_ = json.NewEncoder(w).Encode(v)
}

// logRequest appends "rid port" to the request log, one write per line so that
// concurrent requests, restarted servers and the replicas of one job (which share the
// log) never interleave within a line; the port tells the replicas apart.
func (s *Server) logRequest(rid string, open int64) error {
	if s.cfg.RequestLog == "" {
		return nil
	}
	f, err := os.OpenFile(s.cfg.RequestLog, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return fmt.Errorf("request log: %w", err)
	}
	_, err = fmt.Fprintf(f, "%s %d %d\n", rid, s.cfg.Port, open)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("request log %s: %w", s.cfg.RequestLog, err)
	}
	return nil
}
