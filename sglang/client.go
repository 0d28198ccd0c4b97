package sglang

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/hashicorp/go-retryablehttp"
)

// ClientOptions tunes a Client; zero values take the defaults.
type ClientOptions struct {
	// RetryMax is how many times a 5xx or transport failure is retried; 0 is none, as
	// run.request_retries: 0 says (the config, not this, supplies the default of 4).
	RetryMax int
	// AttemptTimeout bounds one attempt (default 10m: a long prompt's prefill on a busy
	// server); the caller's context bounds the whole call.
	AttemptTimeout time.Duration
	// RetryWaitMin and RetryWaitMax bound the exponential backoff (defaults 1s and 30s).
	RetryWaitMin, RetryWaitMax time.Duration
	// MaxConns is the most requests the caller keeps open at once (run.max_inflight):
	// that many connections stay open between requests, so a window of them reuses its
	// connections instead of dialling anew each time one more than the pool's default
	// (GOMAXPROCS+1) finishes at once.
	MaxConns int
	Logger   *slog.Logger
}

// Client talks to an SGLang server (or the simulator) over HTTP.
type Client struct {
	base  string
	retry *retryablehttp.Client
	log   *slog.Logger
}

// StatusError is a non-2xx answer; Message is the server's own explanation.
type StatusError struct {
	Method, Path string
	Status       int
	Message      string
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("%s %s: HTTP %d: %s", e.Method, e.Path, e.Status, e.Message)
}

// NewClient returns a client for baseURL (http://host:port).
func NewClient(baseURL string, opt ClientOptions) *Client {
	if opt.AttemptTimeout == 0 {
		opt.AttemptTimeout = 10 * time.Minute
	}
	if opt.RetryWaitMin == 0 {
		opt.RetryWaitMin = time.Second
	}
	if opt.RetryWaitMax == 0 {
		opt.RetryWaitMax = 30 * time.Second
	}
	if opt.Logger == nil {
		opt.Logger = slog.Default()
	}
	rc := retryablehttp.NewClient()
	rc.HTTPClient.Timeout = opt.AttemptTimeout
	if t, ok := rc.HTTPClient.Transport.(*http.Transport); ok {
		t.MaxIdleConnsPerHost = max(t.MaxIdleConnsPerHost, opt.MaxConns)
		t.MaxIdleConns = max(t.MaxIdleConns, opt.MaxConns)
	}
	rc.RetryMax = opt.RetryMax
	rc.RetryWaitMin = opt.RetryWaitMin
	rc.RetryWaitMax = opt.RetryWaitMax
	rc.Logger = retryLogger{opt.Logger}
	rc.ErrorHandler = giveUp
	return &Client{base: strings.TrimRight(baseURL, "/"), retry: rc, log: opt.Logger}
}

// retryLogger adapts slog to retryablehttp. Its "request failed" errors are per attempt
// and usually retried, so they are warnings; the caller logs the final error.
type retryLogger struct{ l *slog.Logger }

func (r retryLogger) Error(msg string, kv ...any) { r.l.Warn(msg, kv...) }
func (r retryLogger) Warn(msg string, kv ...any)  { r.l.Warn(msg, kv...) }
func (r retryLogger) Info(msg string, kv ...any)  { r.l.Info(msg, kv...) }
func (r retryLogger) Debug(msg string, kv ...any) { r.l.Debug(msg, kv...) }

// giveUp turns the last attempt into an error that keeps the server's message rather
// than retryablehttp's bare "giving up".
func giveUp(resp *http.Response, err error, tries int) (*http.Response, error) {
	if resp != nil {
		se := statusError(resp)
		return nil, fmt.Errorf("giving up after %d attempts: %w", tries, se)
	}
	return nil, fmt.Errorf("giving up after %d attempts: %w", tries, err)
}

// statusError reads and closes resp's body and wraps its message.
func statusError(resp *http.Response) *StatusError {
	defer func() { _ = resp.Body.Close() }()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	return &StatusError{Method: resp.Request.Method, Path: resp.Request.URL.Path, Status: resp.StatusCode, Message: serverMessage(raw)}
}

// serverMessage finds the explanation in the error shapes SGLang and FastAPI use.
func serverMessage(raw []byte) string {
	var body struct {
		Error   json.RawMessage `json:"error"`
		Message string          `json:"message"`
		Detail  any             `json:"detail"`
	}
	if json.Unmarshal(raw, &body) == nil {
		var nested struct {
			Message string `json:"message"`
		}
		var flat string
		switch {
		case json.Unmarshal(body.Error, &nested) == nil && nested.Message != "":
			return nested.Message
		case json.Unmarshal(body.Error, &flat) == nil && flat != "":
			return flat
		case body.Message != "":
			return body.Message
		case body.Detail != nil:
			return fmt.Sprint(body.Detail)
		}
	}
	if s := strings.TrimSpace(string(raw)); s != "" {
		return s
	}
	return "(empty body)"
}

// GenerateRequest is one prefill. Exactly one of InputIDs and Text is set.
type GenerateRequest struct {
	RID      string
	InputIDs []int64
	Text     string
	// MaxNewTokens defaults to 1: extraction needs only the prefill, and one token is
	// the least SGLang generates.
	MaxNewTokens int
}

// GenerateResponse is what the server reports about a finished request.
type GenerateResponse struct {
	RID                            string
	PromptTokens, CompletionTokens int
}

type generateBody struct {
	RID            string         `json:"rid"`
	InputIDs       []int64        `json:"input_ids,omitempty"`
	Text           *string        `json:"text,omitempty"`
	SamplingParams map[string]int `json:"sampling_params"`
}

// Generate runs one request. 5xx answers and transport errors are retried with backoff:
// a repeat under the same rid at worst rewrites an identical dump. ctx bounds the whole
// call, retries included; a 4xx is returned at once as a *StatusError.
func (c *Client) Generate(ctx context.Context, req GenerateRequest) (GenerateResponse, error) {
	if req.RID == "" {
		return GenerateResponse{}, errors.New("generate: empty rid")
	}
	if (len(req.InputIDs) > 0) == (req.Text != "") {
		return GenerateResponse{}, fmt.Errorf("generate rid %s: set exactly one of input_ids and text", req.RID)
	}
	if req.MaxNewTokens == 0 {
		req.MaxNewTokens = 1
	}
	body := generateBody{RID: req.RID, SamplingParams: map[string]int{"max_new_tokens": req.MaxNewTokens}}
	if req.Text != "" {
		body.Text = &req.Text
	} else {
		body.InputIDs = req.InputIDs
	}
	js, err := json.Marshal(body)
	if err != nil {
		return GenerateResponse{}, fmt.Errorf("generate rid %s: %w", req.RID, err)
	}
	var out struct {
		MetaInfo struct {
			ID               string `json:"id"`
			PromptTokens     int    `json:"prompt_tokens"`
			CompletionTokens int    `json:"completion_tokens"`
		} `json:"meta_info"`
	}
	if err := c.do(ctx, http.MethodPost, "/generate", js, &out); err != nil {
		return GenerateResponse{}, fmt.Errorf("generate rid %s: %w", req.RID, err)
	}
	if out.MetaInfo.ID != req.RID {
		return GenerateResponse{}, fmt.Errorf("generate rid %s: server answered for rid %q", req.RID, out.MetaInfo.ID)
	}
	return GenerateResponse{RID: out.MetaInfo.ID, PromptTokens: out.MetaInfo.PromptTokens, CompletionTokens: out.MetaInfo.CompletionTokens}, nil
}

// do sends one retried request and decodes a 2xx JSON answer into out.
func (c *Client) do(ctx context.Context, method, path string, body []byte, out any) error {
	var raw any
	if body != nil {
		raw = body
	}
	req, err := retryablehttp.NewRequestWithContext(ctx, method, c.base+path, raw)
	if err != nil {
		return err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.retry.Do(req)
	if err != nil {
		return err
	}
	if resp.StatusCode/100 != 2 {
		return statusError(resp)
	}
	defer func() { _ = resp.Body.Close() }()
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("%s %s: decode answer: %w", method, path, err)
	}
	return nil
}

// CloseIdleConnections closes the connections not carrying a request, before the server
// is stopped: Go's graceful shutdown (the simulator's) waits up to 5 s for a connection
// that never carried a request, and the transport keeps spares it dialed and never used.
func (c *Client) CloseIdleConnections() { c.retry.HTTPClient.CloseIdleConnections() }

// HealthGenerate is one probe of /health_generate, without retries: nil iff it answers
// 200. SGLang answers 503 while loading and runs a one-token generation when idle.
func (c *Client) HealthGenerate(ctx context.Context) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+"/health_generate", nil)
	if err != nil {
		return err
	}
	resp, err := c.retry.HTTPClient.Do(req)
	if err != nil {
		return fmt.Errorf("health probe %s: %w", c.base, err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("health probe %s: %w", c.base, statusError(resp))
	}
	_ = resp.Body.Close()
	return nil
}

// ServerInfo is what the server reports about its launch settings.
type ServerInfo struct {
	ModelPath             string
	TPSize                int
	DisableRadixCache     bool
	ChunkedPrefillSize    int
	EnableTwoBatchOverlap bool
	Version               string
	// Raw is the whole answer, for keys this struct does not name.
	Raw map[string]any
}

// ServerInfo reads /server_info, falling back to /get_server_info for older SGLang.
func (c *Client) ServerInfo(ctx context.Context) (ServerInfo, error) {
	var raw map[string]any
	err := c.do(ctx, http.MethodGet, "/server_info", nil, &raw)
	var se *StatusError
	if errors.As(err, &se) && se.Status == http.StatusNotFound {
		err = c.do(ctx, http.MethodGet, "/get_server_info", nil, &raw)
	}
	if err != nil {
		return ServerInfo{}, fmt.Errorf("server info from %s: %w", c.base, err)
	}
	info := ServerInfo{Raw: raw}
	info.ModelPath, _ = raw["model_path"].(string)
	info.Version, _ = raw["version"].(string)
	info.DisableRadixCache, _ = raw["disable_radix_cache"].(bool)
	info.EnableTwoBatchOverlap, _ = raw["enable_two_batch_overlap"].(bool)
	if v, ok := raw["tp_size"].(float64); ok {
		info.TPSize = int(v)
	}
	if v, ok := raw["chunked_prefill_size"].(float64); ok {
		info.ChunkedPrefillSize = int(v)
	}
	return info, nil
}

// SortWindow is the window a server that sorts its queue before batching reports in
// /server_info: the transformers server's window_requests and max_batch_requests (see
// configs.InflightToFill for what that asks of run.max_inflight). ok is false for a
// server that reports no window (SGLang schedules its own way) or absurd values.
func (s ServerInfo) SortWindow() (window, batchRequests int, ok bool) {
	if kind, _ := s.Raw["server_kind"].(string); kind != "transformers" {
		return 0, 0, false
	}
	w, okW := s.Raw["window_requests"].(float64)
	b, okB := s.Raw["max_batch_requests"].(float64)
	// Bounded so that the orchestrator's sums stay far from overflow.
	if !okW || !okB || w < 1 || b < 1 || w > 1<<20 || b > 1<<20 {
		return 0, 0, false
	}
	return int(w), int(b), true
}

// CheckCapture says whether the server can produce protocol v1 dumps for spec: radix
// cache, chunked prefill and two-batch overlap off, and the expected model and TP size.
// The error lists every violation with what to change.
func (s ServerInfo) CheckCapture(spec LaunchSpec) error {
	var bad []string
	if !s.DisableRadixCache {
		bad = append(bad, "radix cache is on (a cache hit drops the cached prefix's rows): relaunch with --disable-radix-cache")
	}
	if s.ChunkedPrefillSize > 0 {
		bad = append(bad, fmt.Sprintf("chunked prefill is on (size %d; the hook would see chunks): relaunch with --chunked-prefill-size -1", s.ChunkedPrefillSize))
	}
	if s.EnableTwoBatchOverlap {
		bad = append(bad, "two-batch overlap is on: relaunch without --enable-two-batch-overlap")
	}
	if s.TPSize != spec.TPSize {
		bad = append(bad, fmt.Sprintf("tp_size is %d, the config says %d: fix server.tp_size or relaunch the server", s.TPSize, spec.TPSize))
	}
	if s.ModelPath != spec.ModelPath {
		bad = append(bad, fmt.Sprintf("model_path is %q, the config says %q: fix server.model_path or relaunch the server", s.ModelPath, spec.ModelPath))
	}
	// The rest as /get_server_info really returns them: every ServerArgs field
	// (dataclasses.asdict), so a field this SGLang lacks is simply absent. There is no
	// layers_to_capture there; the hook's marker carries the effective layers.
	if v, ok := s.Raw["enable_dp_attention"].(bool); ok && v {
		bad = append(bad, "DP attention is on (TP rank 0 holds only its DP group's rows): relaunch without --enable-dp-attention")
	}
	if v, ok := s.Raw["pp_size"].(float64); ok && v != 1 {
		bad = append(bad, fmt.Sprintf("pp_size is %g: relaunch with --pp-size 1", v))
	}
	if v, ok := s.Raw["attn_cp_size"].(float64); ok && v != 1 {
		bad = append(bad, fmt.Sprintf("attn_cp_size is %g: relaunch with --attn-cp-size 1", v))
	}
	if v, ok := s.Raw["speculative_algorithm"].(string); ok && v != "" {
		bad = append(bad, fmt.Sprintf("speculative decoding (%s) is on: relaunch without --speculative-algorithm", v))
	}
	if v, ok := s.Raw["enable_attn_tp_input_scattered"].(bool); ok && v {
		bad = append(bad, "attention TP input scattering is on: relaunch without --enable-attn-tp-input-scattered")
	}
	if what, on := prefillGraphs(s.Raw); on {
		bad = append(bad, what+" on (a replayed prefill graph skips the capture): relaunch without the flag that turned it on")
	}
	if len(bad) > 0 {
		return fmt.Errorf("server (version %q) cannot capture hidden states as configured:\n  - %s", s.Version, strings.Join(bad, "\n  - "))
	}
	return nil
}

// prefillGraphs reads whichever prefill CUDA graph setting this SGLang reports:
// cuda_graph_config.prefill.backend (v0.5.15 and later), disable_piecewise_cuda_graph
// (#16331, graphs on by default) or enable_piecewise_cuda_graph (before).
func prefillGraphs(raw map[string]any) (string, bool) {
	if cfg, ok := raw["cuda_graph_config"].(map[string]any); ok {
		if prefill, ok := cfg["prefill"].(map[string]any); ok {
			if backend, ok := prefill["backend"].(string); ok {
				return fmt.Sprintf("prefill CUDA graph backend %q", backend), backend != "disabled"
			}
		}
	}
	if v, ok := raw["disable_piecewise_cuda_graph"].(bool); ok {
		return "piecewise CUDA graphs", !v
	}
	v, _ := raw["enable_piecewise_cuda_graph"].(bool)
	return "piecewise CUDA graphs", v
}

// HookRefusal finds the dump hook's refusal in a server's log tail: the line the hook
// prints (prefixed "extract-hook: FATAL: ") when a seam is missing or a setting breaks
// capture, before any weights load. The server then exits 3; extract should show the
// line and exit 3 (preflight refused) instead of restarting the server.
func HookRefusal(logTail string) (string, bool) {
	const prefix = "extract-hook: FATAL: "
	lines := strings.Split(logTail, "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if at := strings.Index(lines[i], prefix); at >= 0 {
			return strings.TrimSpace(lines[i][at:]), true
		}
	}
	return "", false
}
