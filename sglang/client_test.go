package sglang

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// fakeSGLang answers /generate with the statuses in order (the last one repeats) in
// SGLang's shapes, and counts the calls.
func fakeSGLang(t *testing.T, statuses ...int) (*httptest.Server, *atomic.Int32) {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := int(calls.Add(1))
		status := statuses[min(n, len(statuses))-1]
		var req struct {
			RID            string         `json:"rid"`
			InputIDs       []int64        `json:"input_ids"`
			SamplingParams map[string]int `json:"sampling_params"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			t.Errorf("request body: %v", err)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		if status != http.StatusOK {
			json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{"message": "attempt " + http.StatusText(status)}})
			return
		}
		if req.SamplingParams["max_new_tokens"] != 1 {
			t.Errorf("max_new_tokens %d, want the default 1", req.SamplingParams["max_new_tokens"])
		}
		json.NewEncoder(w).Encode(map[string]any{"text": "", "meta_info": map[string]any{
			"id": req.RID, "prompt_tokens": len(req.InputIDs), "completion_tokens": 1}})
	}))
	t.Cleanup(srv.Close)
	return srv, &calls
}

func fastRetries(t *testing.T) ClientOptions {
	log, _ := testLogger(t)
	return ClientOptions{RetryMax: 2, RetryWaitMin: time.Millisecond, RetryWaitMax: 5 * time.Millisecond, Logger: log}
}

func TestGenerateRetriesServerErrorsAndStopsAtClientErrors(t *testing.T) {
	tests := []struct {
		name      string
		statuses  []int
		wantCalls int32
		wantErr   string
		wantCode  int
	}{
		{"503 then success", []int{503, 503, 200}, 3, "", 0},
		{"4xx fails at once with the server's message", []int{400}, 1, "attempt Bad Request", 400},
		{"gives up after RetryMax retries with the last message", []int{503}, 3, "attempt Service Unavailable", 503},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			srv, calls := fakeSGLang(t, tc.statuses...)
			c := NewClient(srv.URL, fastRetries(t))
			resp, err := c.Generate(context.Background(), GenerateRequest{RID: "s000000001-a2", InputIDs: []int64{1, 2, 3}})
			if got := calls.Load(); got != tc.wantCalls {
				t.Errorf("%d calls, want %d", got, tc.wantCalls)
			}
			if tc.wantErr == "" {
				want := GenerateResponse{RID: "s000000001-a2", PromptTokens: 3, CompletionTokens: 1}
				if err != nil || resp != want {
					t.Errorf("Generate = %+v, %v; want %+v", resp, err, want)
				}
				return
			}
			var se *StatusError
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), "s000000001-a2") ||
				!errors.As(err, &se) || se.Status != tc.wantCode {
				t.Errorf("Generate error %v, want HTTP %d naming the rid and containing %q", err, tc.wantCode, tc.wantErr)
			}
		})
	}
}

func TestZeroRetryMaxSendsOneRequest(t *testing.T) {
	// run.request_retries: 0 arrives here as RetryMax 0; the config supplies the default.
	srv, calls := fakeSGLang(t, 503)
	opt := fastRetries(t)
	opt.RetryMax = 0
	if _, err := NewClient(srv.URL, opt).Generate(context.Background(), GenerateRequest{RID: "s000000001-a1", InputIDs: []int64{1}}); err == nil {
		t.Fatal("a 503 with no retries succeeded")
	}
	if got := calls.Load(); got != 1 {
		t.Errorf("%d requests, want 1", got)
	}
}

func TestGenerateIsBoundedByItsContext(t *testing.T) {
	hang := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The server notices a client leaving only once the body is read.
		io.Copy(io.Discard, r.Body)
		<-r.Context().Done()
	}))
	t.Cleanup(hang.Close)
	busy, _ := fakeSGLang(t, 503)
	tests := []struct {
		name string
		url  string
		opt  ClientOptions
	}{
		{"an attempt that never answers", hang.URL, ClientOptions{}},
		{"a long backoff between retries", busy.URL, ClientOptions{RetryMax: 2, RetryWaitMin: 10 * time.Second, RetryWaitMax: 10 * time.Second}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.opt.Logger, _ = testLogger(t)
			c := NewClient(tc.url, tc.opt)
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			defer cancel()
			start := time.Now()
			_, err := c.Generate(ctx, GenerateRequest{RID: "r", Text: "hello"})
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("error %v, want the context's deadline", err)
			}
			if d := time.Since(start); d > 2*time.Second {
				t.Errorf("returned after %v, want about 200ms", d)
			}
		})
	}
}

func TestGenerateRefusesAnAnswerForAnotherRid(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte(`{"meta_info":{"id":"s000000001-a1","prompt_tokens":1,"completion_tokens":1}}`))
	}))
	t.Cleanup(srv.Close)
	_, err := NewClient(srv.URL, fastRetries(t)).Generate(context.Background(), GenerateRequest{RID: "s000000001-a2", InputIDs: []int64{1}})
	if err == nil || !strings.Contains(err.Error(), `answered for rid "s000000001-a1"`) {
		t.Errorf("error %v, want a rid mismatch", err)
	}
}

func TestGenerateNeedsARidAndExactlyOneInput(t *testing.T) {
	c := NewClient("http://127.0.0.1:1", fastRetries(t))
	for _, req := range []GenerateRequest{
		{InputIDs: []int64{1}},
		{RID: "r"},
		{RID: "r", InputIDs: []int64{1}, Text: "a"},
	} {
		if _, err := c.Generate(context.Background(), req); err == nil {
			t.Errorf("Generate(%+v) succeeded", req)
		}
	}
}

func TestHealthGenerateIsOneProbeWithoutRetries(t *testing.T) {
	tests := []struct {
		status  int
		wantErr bool
	}{
		{http.StatusOK, false},
		{http.StatusServiceUnavailable, true},
	}
	for _, tc := range tests {
		var calls atomic.Int32
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			calls.Add(1)
			if r.URL.Path != "/health_generate" {
				t.Errorf("probed %s", r.URL.Path)
			}
			w.WriteHeader(tc.status)
		}))
		err := NewClient(srv.URL, fastRetries(t)).HealthGenerate(context.Background())
		srv.Close()
		if (err != nil) != tc.wantErr || calls.Load() != 1 {
			t.Errorf("status %d: error %v after %d calls, want error %v after 1", tc.status, err, calls.Load(), tc.wantErr)
		}
	}
}

func TestServerInfoFallsBackToTheOldEndpoint(t *testing.T) {
	tests := []struct {
		name string
		path string
	}{
		{"current SGLang", "/server_info"},
		{"older SGLang", "/get_server_info"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			mux := http.NewServeMux()
			mux.HandleFunc("GET "+tc.path, func(w http.ResponseWriter, r *http.Request) {
				w.Write([]byte(`{"model_path":"/m","tp_size":8,"disable_radix_cache":true,"chunked_prefill_size":-1,"enable_two_batch_overlap":false,"version":"0.5.6","dp_size":1}`))
			})
			srv := httptest.NewServer(mux)
			t.Cleanup(srv.Close)
			info, err := NewClient(srv.URL, fastRetries(t)).ServerInfo(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if info.ModelPath != "/m" || info.TPSize != 8 || !info.DisableRadixCache || info.ChunkedPrefillSize != -1 ||
				info.EnableTwoBatchOverlap || info.Version != "0.5.6" || info.Raw["dp_size"] != float64(1) {
				t.Errorf("info %+v", info)
			}
		})
	}
}

func TestCheckCaptureListsEveryViolationWithItsFix(t *testing.T) {
	spec := sglangSpec()
	good := ServerInfo{ModelPath: spec.ModelPath, TPSize: 8, DisableRadixCache: true, ChunkedPrefillSize: -1, Raw: map[string]any{}}
	tests := []struct {
		name   string
		modify func(*ServerInfo)
		want   []string
	}{
		{"capture-ready", func(*ServerInfo) {}, nil},
		{"chunked prefill reported as null", func(s *ServerInfo) { s.ChunkedPrefillSize = 0 }, nil},
		{"radix cache on", func(s *ServerInfo) { s.DisableRadixCache = false }, []string{"--disable-radix-cache"}},
		{"chunked prefill on", func(s *ServerInfo) { s.ChunkedPrefillSize = 8192 }, []string{"--chunked-prefill-size -1"}},
		{"two-batch overlap on", func(s *ServerInfo) { s.EnableTwoBatchOverlap = true }, []string{"--enable-two-batch-overlap"}},
		{"another model", func(s *ServerInfo) { s.ModelPath = "/models/other" }, []string{`model_path is "/models/other"`}},
		{"another tp size", func(s *ServerInfo) { s.TPSize = 4 }, []string{"tp_size is 4"}},
		{"everything wrong at once", func(s *ServerInfo) {
			*s = ServerInfo{ModelPath: "x", TPSize: 1, ChunkedPrefillSize: 4096, EnableTwoBatchOverlap: true}
		}, []string{"radix", "chunked", "two-batch", "model_path", "tp_size"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			info := good
			tc.modify(&info)
			err := info.CheckCapture(spec)
			if (err != nil) != (len(tc.want) > 0) {
				t.Fatalf("CheckCapture = %v, want violations %q", err, tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

func TestCheckCaptureReadsTheFieldsServerInfoReallyReturns(t *testing.T) {
	spec := LaunchSpec{TPSize: 8, ModelPath: "/m"}
	base := func() map[string]any {
		return map[string]any{"disable_radix_cache": true, "chunked_prefill_size": -1.0, "tp_size": 8.0, "model_path": "/m"}
	}
	for _, tc := range []struct {
		name string
		set  map[string]any
		want string
	}{
		{"DP attention", map[string]any{"enable_dp_attention": true}, "DP attention"},
		{"pipeline parallel", map[string]any{"pp_size": 2.0}, "--pp-size 1"},
		{"speculative decoding", map[string]any{"speculative_algorithm": "EAGLE3"}, "speculative"},
		{"piecewise graphs at the pinned commit", map[string]any{"enable_piecewise_cuda_graph": true}, "piecewise"},
		{"piecewise graphs on by default after #16331", map[string]any{"disable_piecewise_cuda_graph": false}, "piecewise"},
		{"a prefill graph backend at v0.5.15", map[string]any{"cuda_graph_config": map[string]any{"prefill": map[string]any{"backend": "tc_piecewise"}}}, "tc_piecewise"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			raw := base()
			for k, v := range tc.set {
				raw[k] = v
			}
			info := ServerInfo{TPSize: 8, ModelPath: "/m", DisableRadixCache: true, ChunkedPrefillSize: -1, Raw: raw}
			if err := info.CheckCapture(spec); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("CheckCapture = %v, want an error naming %q", err, tc.want)
			}
		})
	}
	ok := ServerInfo{TPSize: 8, ModelPath: "/m", DisableRadixCache: true, ChunkedPrefillSize: -1, Raw: base()}
	ok.Raw["disable_piecewise_cuda_graph"] = true
	if err := ok.CheckCapture(spec); err != nil {
		t.Errorf("a capture-ready server refused: %v", err)
	}
}

func TestHookRefusalFindsTheHooksFatalLineInTheLogTail(t *testing.T) {
	tail := "INFO loading\n[2026-11-30] ERROR extract-hook: FATAL: the dump hook cannot capture hidden states: radix cache is on\nTraceback ..."
	line, ok := HookRefusal(tail)
	if !ok || line != "extract-hook: FATAL: the dump hook cannot capture hidden states: radix cache is on" {
		t.Errorf("HookRefusal = %q, %v", line, ok)
	}
	if _, ok := HookRefusal("INFO The server is fired up and ready to roll!"); ok {
		t.Error("a clean log reported as a refusal")
	}
}

func TestSortWindowIsReadOnlyFromTheTransformersServer(t *testing.T) {
	tf := func(kv ...any) map[string]any {
		m := map[string]any{"server_kind": "transformers"}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i].(string)] = kv[i+1]
		}
		return m
	}
	tests := []struct {
		name          string
		raw           map[string]any
		window, batch int
		ok            bool
	}{
		{"the transformers server", tf("window_requests", 256.0, "max_batch_requests", 64.0), 256, 64, true},
		{"SGLang reports no window", map[string]any{"max_running_requests": 256.0}, 0, 0, false},
		{"the same keys from another kind", map[string]any{"window_requests": 256.0, "max_batch_requests": 64.0}, 0, 0, false},
		{"a window without a batch size", tf("window_requests", 256.0), 0, 0, false},
		{"a string, not a number", tf("window_requests", "256", "max_batch_requests", 64.0), 0, 0, false},
		{"zero", tf("window_requests", 0.0, "max_batch_requests", 64.0), 0, 0, false},
		{"absurd", tf("window_requests", 1e300, "max_batch_requests", 64.0), 0, 0, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w, b, ok := ServerInfo{Raw: tc.raw}.SortWindow()
			if w != tc.window || b != tc.batch || ok != tc.ok {
				t.Errorf("SortWindow = %d, %d, %v; want %d, %d, %v", w, b, ok, tc.window, tc.batch, tc.ok)
			}
		})
	}
}
