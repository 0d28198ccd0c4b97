package simulator_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/spf13/pflag"

	"github.com/extract-dev/extract/configs"
	"github.com/extract-dev/extract/internal/safetensors"
	"github.com/extract-dev/extract/sglang/simulator"
)

// TestMain doubles as the simulator's process when re-executed with SIMULATOR_TEST_CHILD=1,
// so fault tests run a real process without building the extract binary.
func TestMain(m *testing.M) {
	if os.Getenv("SIMULATOR_TEST_CHILD") == "1" {
		os.Exit(runChild(os.Args[1:]))
	}
	os.Exit(m.Run())
}

func runChild(args []string) int {
	var cfg simulator.Config
	fs := pflag.NewFlagSet("simulate", pflag.ContinueOnError)
	cfg.BindFlags(fs)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	if err := simulator.Run(ctx, cfg, log); err != nil {
		log.Error("simulator failed", "error", err)
		return 1
	}
	return 0
}

// logBuffer collects log lines so tests can check what an operator would read.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func baseConfig(t *testing.T) simulator.Config {
	return simulator.Config{
		Host: "127.0.0.1", ShmDir: t.TempDir(), Model: "sim/model", TPSize: 8,
		NumLayers: 61, Layers: []int{2, 30, 58}, Simulator: configs.Simulator{HiddenSize: 16},
	}
}

// start serves cfg in this process until the test ends and returns its base URL.
func start(t *testing.T, cfg simulator.Config) (string, *logBuffer) {
	t.Helper()
	logs := &logBuffer{}
	log := slog.New(slog.NewTextHandler(io.MultiWriter(t.Output(), logs), nil))
	s, err := simulator.Listen(cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return "http://" + s.Addr(), logs
}

// child is a simulator process; done closes when it has exited, with err its Wait result.
type child struct {
	done chan struct{}
	err  error
}

// startChild runs the simulator as a real process and returns its base URL.
func startChild(t *testing.T, cfg simulator.Config, extra ...string) (string, *child) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	args := append([]string{"--host", "127.0.0.1", "--port", "0", "--shm-dir", cfg.ShmDir,
		"--hidden-size", fmt.Sprint(cfg.HiddenSize), "--model", cfg.Model}, extra...)
	cmd := exec.Command(exe, args...)
	cmd.Env = append(os.Environ(), "SIMULATOR_TEST_CHILD=1")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewScanner(stderr)
	var addr string
	for addr == "" && lines.Scan() {
		var rec struct{ Msg, Addr string }
		if json.Unmarshal(lines.Bytes(), &rec) == nil && rec.Msg == "simulator listening" {
			addr = rec.Addr
		}
	}
	if addr == "" {
		cmd.Process.Kill()
		t.Fatalf("child never logged its address: %v", cmd.Wait())
	}
	c := &child{done: make(chan struct{})}
	go func() {
		for lines.Scan() {
			t.Logf("child: %s", lines.Text())
		}
		c.err = cmd.Wait()
		close(c.done)
	}()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-c.done:
		case <-time.After(5 * time.Second):
			cmd.Process.Kill()
			<-c.done
		}
	})
	return "http://" + addr, c
}

type reply struct {
	Status int
	Body   map[string]any
}

func post(t *testing.T, client *http.Client, base string, body any) (reply, error) {
	t.Helper()
	js, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := client.Post(base+"/generate", "application/json", bytes.NewReader(js))
	if err != nil {
		return reply{}, err
	}
	defer resp.Body.Close()
	r := reply{Status: resp.StatusCode}
	if err := json.NewDecoder(resp.Body).Decode(&r.Body); err != nil {
		t.Fatalf("POST /generate answered %d with a body that is not JSON: %v", resp.StatusCode, err)
	}
	return r, nil
}

func get(client *http.Client, url string) (int, map[string]any, error) {
	resp, err := client.Get(url)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	var body map[string]any
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, nil, err
	}
	if len(raw) > 0 {
		if err := json.Unmarshal(raw, &body); err != nil {
			return 0, nil, err
		}
	}
	return resp.StatusCode, body, nil
}

// predictDump builds the bytes a protocol v1 dump must hold for ids.
func predictDump(cfg simulator.Config, rid string, ids []int64) ([]byte, map[string]string) {
	h := cfg.HiddenSize
	var data bytes.Buffer
	row := make([]byte, 2*h)
	for pos, tok := range ids {
		for _, l := range cfg.Layers {
			simulator.FillRow(row, tok, pos, l, h)
			data.Write(row)
		}
	}
	for pos, tok := range ids {
		simulator.FillRow(row, tok, pos, cfg.NumLayers, h)
		data.Write(row)
	}
	for _, tok := range ids {
		binary.Write(&data, binary.LittleEndian, tok)
	}
	return data.Bytes(), map[string]string{
		"rid": rid, "protocol": "1", "layers": "2,30,58", "model": cfg.Model, "hook_version": simulator.DefaultHookVersion,
	}
}

func checkDump(t *testing.T, cfg simulator.Config, rid string, ids []int64) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(cfg.ShmDir, rid+".safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	hdr, err := safetensors.ReadHeader(bytes.NewReader(raw), int64(len(raw)))
	if err != nil {
		t.Fatalf("dump of %s is not a valid container: %v", rid, err)
	}
	T, H := int64(len(ids)), int64(cfg.HiddenSize)
	want := map[string]struct {
		dtype safetensors.DType
		shape []int64
	}{
		"aux_hidden_state": {safetensors.BF16, []int64{T, 3 * H}},
		"hidden_state":     {safetensors.BF16, []int64{T, H}},
		"input_ids":        {safetensors.I64, []int64{T}},
	}
	if len(hdr.Tensors) != len(want) {
		t.Fatalf("dump holds %d tensors, want %d", len(hdr.Tensors), len(want))
	}
	for _, tn := range hdr.Tensors {
		w, ok := want[tn.Name]
		if !ok || tn.DType != w.dtype || !reflect.DeepEqual(tn.Shape, w.shape) {
			t.Errorf("tensor %s is %s %v, want %s %v", tn.Name, tn.DType, tn.Shape, w.dtype, w.shape)
		}
	}
	wantData, wantMeta := predictDump(cfg, rid, ids)
	if !reflect.DeepEqual(hdr.Metadata, wantMeta) {
		t.Errorf("metadata %v, want %v", hdr.Metadata, wantMeta)
	}
	if !bytes.Equal(raw[hdr.DataStart:], wantData) {
		t.Errorf("tensor bytes of %s differ from FillRow's prediction", rid)
	}
}

func TestDumpIsWrittenAsPartialThenRenamedWithPredictedContents(t *testing.T) {
	text := "Hello, simulator"
	tests := []struct {
		name    string
		hidden  int
		body    map[string]any
		wantIDs []int64
	}{
		{"input ids", 16, map[string]any{"input_ids": []int64{7, 7, 1000, 163839}}, []int64{7, 7, 1000, 163839}},
		{"text is tokenized one token per byte", 16, map[string]any{"text": text}, simulator.Tokenize(text)},
		{"hidden size not a multiple of eight", 13, map[string]any{"input_ids": []int64{5, 6, 7}}, []int64{5, 6, 7}},
		{"large enough to be seen while written", 1024, map[string]any{"input_ids": make([]int64, 2048)}, make([]int64, 2048)},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := baseConfig(t)
			cfg.HiddenSize = tc.hidden
			rid := fmt.Sprintf("s%09d-a1", i)
			final := filepath.Join(cfg.ShmDir, rid+".safetensors")
			partial := final + ".partial"

			w, err := fsnotify.NewWatcher()
			if err != nil {
				t.Fatal(err)
			}
			defer w.Close()
			if err := w.Add(cfg.ShmDir); err != nil {
				t.Fatal(err)
			}
			base, _ := start(t, cfg)
			body := map[string]any{"rid": rid, "sampling_params": map[string]any{"max_new_tokens": 1}}
			for k, v := range tc.body {
				body[k] = v
			}
			r, err := post(t, http.DefaultClient, base, body)
			if err != nil || r.Status != http.StatusOK {
				t.Fatalf("POST /generate: %v %+v", err, r)
			}
			meta := r.Body["meta_info"].(map[string]any)
			if meta["id"] != rid || meta["prompt_tokens"] != float64(len(tc.wantIDs)) || meta["completion_tokens"] != float64(1) {
				t.Errorf("meta_info %v, want id %s, prompt_tokens %d, completion_tokens 1", meta, rid, len(tc.wantIDs))
			}

			var events []fsnotify.Event
			deadline := time.After(5 * time.Second)
			for seen := false; !seen; {
				select {
				case ev := <-w.Events:
					if strings.HasPrefix(filepath.Base(ev.Name), ".hook-") {
						continue // the hook marker, written at start
					}
					events = append(events, ev)
					seen = ev.Name == final && ev.Has(fsnotify.Create)
				case err := <-w.Errors:
					t.Fatal(err)
				case <-deadline:
					t.Fatalf("final name never appeared; events %v", events)
				}
			}
			if first := events[0]; first.Name != partial || !first.Has(fsnotify.Create) {
				t.Errorf("first event %v, want the partial created", first)
			}
			for _, ev := range events {
				if ev.Name == final && !ev.Has(fsnotify.Create) {
					t.Errorf("event %v on the final name: it must only appear by rename", ev)
				}
			}
			if _, err := os.Stat(partial); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("partial %s still there after the rename: %v", partial, err)
			}
			checkDump(t, cfg, rid, tc.wantIDs)
		})
	}
}

func TestValueIsExactBF16AndMatchesFillRow(t *testing.T) {
	tests := []struct {
		token       int64
		pos, layer  int
		hidden      int
		differentTo int // a layer whose row must differ
	}{
		{token: 3, pos: 0, layer: 2, hidden: 8, differentTo: 30},
		{token: 163839, pos: 4095, layer: 61, hidden: 7168, differentTo: 58},
		{token: 0, pos: 1, layer: 30, hidden: 13, differentTo: 2},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("token %d pos %d layer %d hidden %d", tc.token, tc.pos, tc.layer, tc.hidden), func(t *testing.T) {
			row := make([]byte, 2*tc.hidden)
			simulator.FillRow(row, tc.token, tc.pos, tc.layer, tc.hidden)
			for ch := 0; ch < tc.hidden; ch++ {
				v := simulator.Value(tc.token, tc.pos, tc.layer, ch)
				if got := binary.LittleEndian.Uint16(row[2*ch:]); got != v {
					t.Fatalf("channel %d: FillRow wrote %#04x, Value says %#04x", ch, got, v)
				}
				f := math.Float32frombits(uint32(v)<<16) * 64
				if f != float32(math.Trunc(float64(f))) || f < -128 || f > 127 {
					t.Fatalf("channel %d: %v is not int8/64", ch, f/64)
				}
			}
			other := make([]byte, 2*tc.hidden)
			simulator.FillRow(other, tc.token, tc.pos, tc.differentTo, tc.hidden)
			if bytes.Equal(row, other) {
				t.Errorf("layers %d and %d have the same row", tc.layer, tc.differentTo)
			}
		})
	}
}

func TestTokenizeIsOneTokenPerByteShiftedByThree(t *testing.T) {
	tests := []struct {
		text string
		want []int64
	}{
		{"", []int64{}},
		{"Hi", []int64{75, 108}},
		{"é", []int64{0xc3 + 3, 0xa9 + 3}},
	}
	for _, tc := range tests {
		if got := simulator.Tokenize(tc.text); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("Tokenize(%q) = %v, want %v", tc.text, got, tc.want)
		}
	}
}

func TestBadGenerateRequestsAnswer400WithAMessage(t *testing.T) {
	cfg := baseConfig(t)
	base, _ := start(t, cfg)
	tests := []struct {
		name string
		body any
		want string
	}{
		{"missing rid", map[string]any{"input_ids": []int{1}}, "rid is required"},
		{"both inputs", map[string]any{"rid": "r", "input_ids": []int{1}, "text": "a"}, "not both"},
		{"neither input", map[string]any{"rid": "r"}, "input_ids or text is required"},
		{"empty prompt", map[string]any{"rid": "r", "text": ""}, "empty"},
		{"rid with a path", map[string]any{"rid": "../escape", "input_ids": []int{1}}, "cannot name a dump file"},
		{"negative token", map[string]any{"rid": "r", "input_ids": []int{1, -2}}, "negative"},
		{"not an object", []int{1, 2}, "not a generate request"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, err := post(t, http.DefaultClient, base, tc.body)
			if err != nil {
				t.Fatal(err)
			}
			msg, _ := r.Body["error"].(map[string]any)["message"].(string)
			if r.Status != http.StatusBadRequest || !strings.Contains(msg, tc.want) {
				t.Errorf("got %d %q, want 400 containing %q", r.Status, msg, tc.want)
			}
		})
	}
	entries, _ := os.ReadDir(cfg.ShmDir)
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), ".hook-") {
			t.Errorf("bad requests left file %s", e.Name())
		}
	}
}

func TestPrefillRateIsOneQueueSharedByAllRequests(t *testing.T) {
	tests := []struct {
		name       string
		tps        float64
		requests   int
		tokens     int
		minElapsed time.Duration
		maxElapsed time.Duration
	}{
		{"unlimited", 0, 4, 200, 0, 500 * time.Millisecond},
		{"four concurrent requests queue behind each other", 4000, 4, 200, 190 * time.Millisecond, 1500 * time.Millisecond},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := baseConfig(t)
			cfg.TokensPerSecond = tc.tps
			base, _ := start(t, cfg)
			begin := time.Now()
			var wg sync.WaitGroup
			latencies := make([]float64, tc.requests)
			for i := range tc.requests {
				wg.Go(func() {
					r, err := post(t, http.DefaultClient, base, map[string]any{"rid": fmt.Sprintf("s%09d-a1", i), "input_ids": make([]int, tc.tokens)})
					if err != nil || r.Status != http.StatusOK {
						t.Errorf("request %d: %v %+v", i, err, r)
						return
					}
					latencies[i] = r.Body["meta_info"].(map[string]any)["e2e_latency"].(float64)
				})
			}
			wg.Wait()
			elapsed := time.Since(begin)
			if elapsed < tc.minElapsed || elapsed > tc.maxElapsed {
				t.Errorf("%d requests of %d tokens at %v tokens/s took %v, want %v..%v", tc.requests, tc.tokens, tc.tps, elapsed, tc.minElapsed, tc.maxElapsed)
			}
			slowest := 0.0
			for _, l := range latencies {
				slowest = math.Max(slowest, l)
			}
			if slowest < tc.minElapsed.Seconds() {
				t.Errorf("slowest e2e_latency %.3fs, want at least %v", slowest, tc.minElapsed)
			}
		})
	}
}

func TestHealthGenerateAnswers503UntilTheStartupDelayPasses(t *testing.T) {
	cfg := baseConfig(t)
	cfg.StartupDelay = 400 * time.Millisecond
	base, logs := start(t, cfg)

	status := func(path string) int {
		code, _, err := get(http.DefaultClient, base+path)
		if err != nil {
			t.Fatal(err)
		}
		return code
	}
	if got := status("/health"); got != http.StatusOK {
		t.Errorf("/health while starting: %d, want 200", got)
	}
	if got := status("/health_generate"); got != http.StatusServiceUnavailable {
		t.Errorf("/health_generate while starting: %d, want 503", got)
	}
	if r, err := post(t, http.DefaultClient, base, map[string]any{"rid": "early", "input_ids": []int{1}}); err != nil || r.Status != http.StatusServiceUnavailable {
		t.Errorf("/generate while starting: %v %+v, want 503", err, r)
	}
	if strings.Contains(logs.String(), simulator.ReadyMessage) {
		t.Errorf("ready message logged before the startup delay passed")
	}
	time.Sleep(500 * time.Millisecond)
	if got := status("/health_generate"); got != http.StatusOK {
		t.Errorf("/health_generate after the delay: %d, want 200", got)
	}
	if !strings.Contains(logs.String(), simulator.ReadyMessage) {
		t.Errorf("log lacks %q once ready", simulator.ReadyMessage)
	}
}

func TestServerInfoReportsCaptureSettings(t *testing.T) {
	cfg := baseConfig(t)
	base, _ := start(t, cfg)
	want := map[string]any{
		"model_path": "sim/model", "tp_size": float64(8), "disable_radix_cache": true,
		"chunked_prefill_size": float64(-1), "enable_two_batch_overlap": false, "version": "simulator",
		"hidden_size": float64(16), "layers_to_capture": []any{float64(2), float64(30), float64(58)},
	}
	for _, path := range []string{"/server_info", "/get_server_info"} {
		code, body, err := get(http.DefaultClient, base+path)
		if err != nil || code != http.StatusOK {
			t.Fatalf("%s: %d %v", path, code, err)
		}
		for k, v := range want {
			if !reflect.DeepEqual(body[k], v) {
				t.Errorf("%s %s = %v, want %v", path, k, body[k], v)
			}
		}
	}
	code, body, err := get(http.DefaultClient, base+"/model_info")
	if err != nil || code != http.StatusOK || body["model_path"] != "sim/model" || body["is_generation"] != true {
		t.Errorf("/model_info: %d %v %v", code, body, err)
	}
}

func TestFaultsBehaveAsConfigured(t *testing.T) {
	short := &http.Client{Timeout: 300 * time.Millisecond}
	gen := func(t *testing.T, client *http.Client, base string, i int) (reply, error) {
		return post(t, client, base, map[string]any{"rid": fmt.Sprintf("s%09d-a1", i), "input_ids": []int{1, 2, 3}})
	}
	dumped := func(cfg simulator.Config, i int) bool {
		_, err := os.Stat(filepath.Join(cfg.ShmDir, fmt.Sprintf("s%09d-a1.safetensors", i)))
		return err == nil
	}
	tests := []struct {
		name  string
		flags []string
		check func(t *testing.T, cfg simulator.Config, base string, proc *child)
	}{
		{"every second generate answers 503 before any work", []string{"--fail-503-every", "2"},
			func(t *testing.T, cfg simulator.Config, base string, _ *child) {
				for i, want := range []int{200, 503, 200, 503} {
					r, err := gen(t, http.DefaultClient, base, i)
					if err != nil || r.Status != want {
						t.Errorf("request %d: %v %d, want %d", i, err, r.Status, want)
					}
					if dumped(cfg, i) != (want == 200) {
						t.Errorf("request %d answered %d but dump present = %v", i, want, dumped(cfg, i))
					}
				}
			}},
		{"hang after one request blocks generate and health_generate but not health", []string{"--hang-after", "1"},
			func(t *testing.T, cfg simulator.Config, base string, _ *child) {
				if r, err := gen(t, http.DefaultClient, base, 0); err != nil || r.Status != 200 {
					t.Fatalf("first request: %v %+v", err, r)
				}
				if _, err := short.Post(base+"/generate", "application/json", strings.NewReader(`{"rid":"x","text":"a"}`)); err == nil {
					t.Errorf("generate answered after the hang")
				}
				if _, _, err := get(short, base+"/health_generate"); err == nil {
					t.Errorf("health_generate answered after the hang")
				}
				if code, _, err := get(short, base+"/health"); err != nil || code != 200 {
					t.Errorf("/health: %d %v, want 200", code, err)
				}
			}},
		{"late dump arrives after the answer", []string{"--late-dump-delay", "300ms"},
			func(t *testing.T, cfg simulator.Config, base string, _ *child) {
				answered := time.Now()
				if r, err := gen(t, http.DefaultClient, base, 0); err != nil || r.Status != 200 {
					t.Fatalf("request: %v %+v", err, r)
				}
				if dumped(cfg, 0) {
					t.Fatalf("dump present at answer time")
				}
				for !dumped(cfg, 0) {
					if time.Since(answered) > 5*time.Second {
						t.Fatalf("late dump never came")
					}
					time.Sleep(20 * time.Millisecond)
				}
				if d := time.Since(answered); d < 250*time.Millisecond {
					t.Errorf("dump came %v after the answer, want about 300ms", d)
				}
				checkDump(t, cfg, "s000000000-a1", []int64{1, 2, 3})
			}},
		{"exit after two requests ends the process with status 3", []string{"--exit-after", "2"},
			func(t *testing.T, cfg simulator.Config, base string, proc *child) {
				for i := range 2 {
					if r, err := gen(t, http.DefaultClient, base, i); err != nil || r.Status != 200 {
						t.Fatalf("request %d: %v %+v", i, err, r)
					}
					if !dumped(cfg, i) {
						t.Errorf("request %d has no dump", i)
					}
				}
				select {
				case <-proc.done:
					var ee *exec.ExitError
					if !errors.As(proc.err, &ee) || ee.ExitCode() != 3 {
						t.Errorf("process ended with %v, want exit status 3", proc.err)
					}
				case <-time.After(5 * time.Second):
					t.Errorf("process still running after %d requests", 2)
				}
			}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := baseConfig(t)
			base, proc := startChild(t, cfg, tc.flags...)
			tc.check(t, cfg, base, proc)
		})
	}
}

func TestFlagsMapOneToOneOntoConfig(t *testing.T) {
	var cfg simulator.Config
	fs := pflag.NewFlagSet("simulate", pflag.ContinueOnError)
	cfg.BindFlags(fs)
	err := fs.Parse([]string{"--host", "0.0.0.0", "--port", "31000", "--shm-dir", "/s", "--model", "m", "--tp-size", "8",
		"--hidden-size", "7168", "--num-layers", "61", "--layers", "2,30,58", "--tokens-per-second", "1500.5",
		"--startup-delay", "2s", "--hook-version", "h", "--exit-after", "1", "--hang-after", "2",
		"--fail-503-every", "3", "--late-dump-delay", "4s"})
	if err != nil {
		t.Fatal(err)
	}
	want := simulator.Config{Host: "0.0.0.0", Port: 31000, ShmDir: "/s", Model: "m", TPSize: 8,
		NumLayers: 61, Layers: []int{2, 30, 58}, HookVersion: "h", Simulator: configs.Simulator{
			HiddenSize: 7168, TokensPerSecond: 1500.5, StartupDelay: 2 * time.Second,
			ExitAfter: 1, HangAfter: 2, Fail503Every: 3, LateDumpDelay: 4 * time.Second}}
	if !reflect.DeepEqual(cfg, want) {
		t.Errorf("parsed %+v\nwant   %+v", cfg, want)
	}
}

func TestListenRejectsAConfigThatCannotMakeProtocolV1Dumps(t *testing.T) {
	tests := []struct {
		name   string
		modify func(*simulator.Config)
		want   string
	}{
		{"two layers", func(c *simulator.Config) { c.Layers = []int{2, 30} }, "exactly three"},
		{"layer past the model", func(c *simulator.Config) { c.Layers = []int{2, 30, 61} }, "layer 61 outside"},
		{"no hidden size", func(c *simulator.Config) { c.HiddenSize = 0 }, "hidden size"},
		{"no shm dir", func(c *simulator.Config) { c.ShmDir = "" }, "shm dir"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := baseConfig(t)
			tc.modify(&cfg)
			_, err := simulator.Listen(cfg, slog.New(slog.NewTextHandler(t.Output(), nil)))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Listen: %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func BenchmarkFillRow(b *testing.B) {
	row := make([]byte, 2*7168)
	b.SetBytes(int64(len(row)))
	for i := 0; b.Loop(); i++ {
		simulator.FillRow(row, int64(i), i, 30, 7168)
	}
}
