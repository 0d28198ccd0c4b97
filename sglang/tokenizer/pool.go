// Package tokenizer runs the target's own tokenizer and chat template for prepare: a
// Python worker shipped in this binary (worker/extract_prepare.py), started in
// server.python as one process per core, each loading AutoTokenizer from the model's
// folder offline. It also reads the facts about a tokenizer folder that need no Python:
// what the prepared data's fingerprint covers, whether the folder is usable (doctor),
// and the target's vocabulary size.
//
// What it keeps: a worker's stdout carries only protocol lines (the worker moves
// whatever libraries print to stderr); a worker that dies, answers out of protocol or
// is cancelled fails the call, never a conversation silently; every worker ends with
// the pool (stdin closed, then killed), and with extract (Pdeathsig).
package tokenizer

import (
	"bufio"
	"bytes"
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/extract-dev/extract/internal/atomicfile"
	"github.com/extract-dev/extract/internal/conversation"
)

//go:embed worker/extract_prepare.py
var workerSource []byte

// WorkerName is the worker's file name where it is installed.
const WorkerName = "extract_prepare.py"

// maxReply bounds one answer line: a batch of long conversations is megabytes, a
// runaway worker must not take the memory.
const maxReply = 1 << 30

// Config starts a pool.
type Config struct {
	Python          string
	Env             []string // added to extract's environment (server.env)
	Tokenizer       string   // the tokenizer folder (server.model_path)
	TemplateFile    string   // a chat template file instead of the tokenizer's own
	TrustRemoteCode bool
	Mask            string // auto | tags | prefix
	EndOfTurn       string // include | exclude
	EndOfTurnTokens []string
	TemplateKwargs  map[string]any
	Workers         int
	WorkDir         string // where the worker file is installed
	Log             *slog.Logger
}

// Ready is what a worker reports once its tokenizer is loaded.
type Ready struct {
	Method        string  `json:"method"`
	Fast          bool    `json:"fast"`
	VocabSize     int     `json:"vocab_size"`
	EndOfTurnIDs  []int64 `json:"end_of_turn_ids"`
	TemplateSHA   string  `json:"template_sha256"`
	Protocol      string  `json:"protocol"`
	Error         string  `json:"error"`
	ReadyReported bool    `json:"ready"`
}

// Pool is N worker processes; worker w serves the caller that passes w.
type Pool struct {
	cfg       Config
	procs     []*proc
	ready     Ready
	vocab     int
	tokDigest string
	tmplHash  string
	once      sync.Once
	startErr  error
}

type proc struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	out    *bufio.Reader
	stderr *tailBuffer
	mu     sync.Mutex
	done   chan struct{}
}

// Install writes the shipped worker into dir atomically and returns its path.
func Install(dir string) (string, error) {
	if err := atomicfile.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	p := filepath.Join(dir, WorkerName)
	if b, err := os.ReadFile(p); err == nil && bytes.Equal(b, workerSource) {
		return p, nil
	}
	return p, atomicfile.WriteFile(p, workerSource, 0o644)
}

// New makes a pool whose processes start at the first call that needs them, so that
// what needs no Python (the identity, the model's vocab size) costs no interpreter start.
func New(cfg Config) (*Pool, error) {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	cfg.Workers = max(cfg.Workers, 1)
	tokDigest, tmplHash, err := Identity(cfg.Tokenizer, cfg.TemplateFile)
	if err != nil {
		return nil, err
	}
	p := &Pool{cfg: cfg, tokDigest: tokDigest, tmplHash: tmplHash}
	if v, err := ModelVocabSize(cfg.Tokenizer); err == nil {
		p.vocab = v
	}
	return p, nil
}

// Start is New, then every process started: it returns once each has loaded the
// tokenizer, or with the first one's error.
func Start(ctx context.Context, cfg Config) (*Pool, error) {
	p, err := New(cfg)
	if err != nil {
		return nil, err
	}
	if err := p.start(ctx); err != nil {
		return nil, err
	}
	return p, nil
}

// start starts the processes once; a failure is kept and returned to every caller.
func (p *Pool) start(ctx context.Context) error {
	p.once.Do(func() { p.startErr = p.startAll(ctx) })
	return p.startErr
}

func (p *Pool) startAll(ctx context.Context) error {
	cfg := p.cfg
	path, err := Install(cfg.WorkDir)
	if err != nil {
		return fmt.Errorf("install the prepare worker: %w", err)
	}
	hello, err := json.Marshal(map[string]any{
		"tokenizer": cfg.Tokenizer, "chat_template_file": cfg.TemplateFile, "trust_remote_code": cfg.TrustRemoteCode,
		"mask": cfg.Mask, "end_of_turn": cfg.EndOfTurn, "end_of_turn_tokens": cfg.EndOfTurnTokens, "template_kwargs": cfg.TemplateKwargs,
	})
	if err != nil {
		return err
	}
	type started struct {
		i     int
		proc  *proc
		ready Ready
		err   error
	}
	ch := make(chan started, cfg.Workers)
	for i := range cfg.Workers {
		go func() {
			pr, r, err := startProc(ctx, cfg, path, hello, i)
			ch <- started{i, pr, r, err}
		}()
	}
	p.procs = make([]*proc, cfg.Workers)
	var first error
	for range cfg.Workers {
		s := <-ch
		p.procs[s.i] = s.proc
		if s.err != nil && first == nil {
			first = s.err
		}
		if s.err == nil {
			p.ready = s.ready
		}
	}
	if first != nil {
		p.stopAll()
		return first
	}
	if p.vocab == 0 {
		p.vocab = p.ready.VocabSize
	}
	cfg.Log.Info("prepare: tokenizer workers ready", "workers", cfg.Workers, "mask", p.ready.Method, "fast", p.ready.Fast,
		"vocab_size", p.vocab, "end_of_turn_ids", p.ready.EndOfTurnIDs, "tokenizer", cfg.Tokenizer)
	return nil
}

func startProc(ctx context.Context, cfg Config, path string, hello []byte, i int) (*proc, Ready, error) {
	cmd := exec.Command(cfg.Python, path)
	cmd.Env = append(append(os.Environ(), cfg.Env...),
		// One process per core already: the Rust encoder's own threads would only fight.
		"TOKENIZERS_PARALLELISM=false", "RAYON_NUM_THREADS=1", "OMP_NUM_THREADS=1",
		"HF_HUB_OFFLINE=1", "TRANSFORMERS_OFFLINE=1", "PYTHONUNBUFFERED=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, Ready{}, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, Ready{}, err
	}
	tail := &tailBuffer{max: 16 << 10, log: cfg.Log, worker: i}
	cmd.Stderr = tail
	if err := cmd.Start(); err != nil {
		return nil, Ready{}, fmt.Errorf("start the prepare worker in %s: %w", cfg.Python, err)
	}
	pr := &proc{cmd: cmd, stdin: stdin, out: bufio.NewReaderSize(stdout, 1<<20), stderr: tail, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(pr.done) }() // an exit shows to call as EOF, with stderr's tail
	var r Ready
	err = pr.call(ctx, hello, &r)
	if err == nil && r.Error != "" {
		err = errors.New(r.Error)
	}
	if err == nil && (!r.ReadyReported || r.Protocol != "1") {
		err = fmt.Errorf("the worker answered out of protocol (protocol %q)", r.Protocol)
	}
	if err != nil {
		return pr, r, fmt.Errorf("prepare worker %d (%s %s, tokenizer %s): %w%s", i, cfg.Python, path, cfg.Tokenizer, err, tail.suffix())
	}
	return pr, r, nil
}

// call writes one request line and reads one answer line into v.
func (pr *proc) call(ctx context.Context, req []byte, v any) error {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	stop := context.AfterFunc(ctx, func() { _ = pr.cmd.Process.Kill() })
	defer stop()
	if _, err := pr.stdin.Write(append(req, '\n')); err != nil {
		return pr.failed(ctx, fmt.Errorf("write to the worker: %w", err))
	}
	var line []byte
	for {
		chunk, err := pr.out.ReadSlice('\n')
		line = append(line, chunk...)
		if len(line) > maxReply {
			_ = pr.cmd.Process.Kill()
			return fmt.Errorf("the worker's answer is over %d bytes", maxReply)
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if err != nil {
			return pr.failed(ctx, fmt.Errorf("read from the worker: %w", err))
		}
		break
	}
	if err := json.Unmarshal(line, v); err != nil {
		return fmt.Errorf("the worker answered out of protocol: %v", err)
	}
	return nil
}

func (pr *proc) failed(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	select {
	case <-pr.done:
		return fmt.Errorf("%w (the worker exited: %v)%s", err, pr.cmd.ProcessState, pr.stderr.suffix())
	default:
		return err
	}
}

// Workers is the number of processes.
func (p *Pool) Workers() int { return p.cfg.Workers }

// Method is the mask method the workers use (tags or prefix), once started.
func (p *Pool) Method() string { return p.ready.Method }

type wireResult struct {
	IDs     []int64    `json:"ids"`
	Mask    []int64    `json:"mask"`
	Spans   []wireSpan `json:"spans"`
	Refused *struct {
		Reason string `json:"reason"`
		Detail string `json:"detail"`
	} `json:"refused"`
}

type wireSpan conversation.Span

func (s *wireSpan) UnmarshalJSON(b []byte) error {
	var a []json.RawMessage
	if err := json.Unmarshal(b, &a); err != nil || len(a) != 5 {
		return fmt.Errorf("span %s: want [start, end, loss, turn, rule]", b)
	}
	for i, dst := range []any{&s.Start, &s.End, &s.Loss, &s.Turn, &s.Rule} {
		if err := json.Unmarshal(a[i], dst); err != nil {
			return fmt.Errorf("span %s field %d: %w", b, i, err)
		}
	}
	return nil
}

type wireConv struct {
	Messages []conversation.Message `json:"messages"`
	Tools    []json.RawMessage      `json:"tools,omitempty"`
}

// Encode sends one batch to worker w.
func (p *Pool) Encode(ctx context.Context, w int, convs []conversation.Conversation) ([]conversation.Result, error) {
	req := struct {
		Op    string     `json:"op"`
		Convs []wireConv `json:"convs"`
	}{Op: "encode", Convs: make([]wireConv, len(convs))}
	for i, c := range convs {
		req.Convs[i] = wireConv{Messages: c.Messages, Tools: c.Tools}
	}
	b, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	if err := p.start(ctx); err != nil {
		return nil, err
	}
	var resp struct {
		Results []wireResult `json:"results"`
		Error   string       `json:"error"`
	}
	if err := p.procs[w].call(ctx, b, &resp); err != nil {
		return nil, fmt.Errorf("prepare worker %d: %w", w, err)
	}
	if resp.Error != "" || len(resp.Results) != len(convs) {
		return nil, fmt.Errorf("prepare worker %d: %d results for %d conversations %s", w, len(resp.Results), len(convs), resp.Error)
	}
	out := make([]conversation.Result, len(convs))
	for i, r := range resp.Results {
		if r.Refused != nil {
			out[i].Refusal = &conversation.Refusal{Reason: conversation.Reason(r.Refused.Reason), Detail: r.Refused.Detail}
			continue
		}
		spans := make([]conversation.Span, len(r.Spans))
		for j, s := range r.Spans {
			spans[j] = conversation.Span(s)
		}
		out[i].Enc = conversation.Encoding{IDs: r.IDs, Mask: r.Mask, Spans: spans}
	}
	return out, nil
}

// Pieces decodes each token alone, for --show.
func (p *Pool) Pieces(ctx context.Context, ids []int64) ([]string, error) {
	b, err := json.Marshal(map[string]any{"op": "pieces", "ids": ids})
	if err != nil {
		return nil, err
	}
	if err := p.start(ctx); err != nil {
		return nil, err
	}
	var resp struct {
		Pieces []string `json:"pieces"`
	}
	if err := p.procs[0].call(ctx, b, &resp); err != nil {
		return nil, err
	}
	if len(resp.Pieces) != len(ids) {
		return nil, fmt.Errorf("prepare worker: %d pieces for %d tokens", len(resp.Pieces), len(ids))
	}
	return resp.Pieces, nil
}

// Identity is the digest of the tokenizer's files and the template's.
func (p *Pool) Identity() (string, string) { return p.tokDigest, p.tmplHash }

// VocabSize is the model config's vocab_size, else (once started) the tokenizer's length.
func (p *Pool) VocabSize() int { return p.vocab }

// Close ends every worker: stdin closed (it exits at EOF), killed if it has not after
// a moment. A pool never started starts none.
func (p *Pool) Close() error {
	p.once.Do(func() { p.startErr = errors.New("the prepare pool is closed") })
	p.stopAll()
	return nil
}

func (p *Pool) stopAll() {
	for _, pr := range p.procs {
		if pr == nil {
			continue
		}
		_ = pr.stdin.Close()
		select {
		case <-pr.done:
		case <-timeAfter():
			_ = pr.cmd.Process.Kill()
			<-pr.done
		}
	}
}

// tailBuffer keeps the end of a worker's stderr for error messages and logs each line.
type tailBuffer struct {
	mu     sync.Mutex
	max    int
	buf    []byte
	log    *slog.Logger
	worker int
	part   []byte
}

func (t *tailBuffer) Write(b []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, b...)
	if len(t.buf) > t.max {
		t.buf = t.buf[len(t.buf)-t.max:]
	}
	t.part = append(t.part, b...)
	for {
		i := bytes.IndexByte(t.part, '\n')
		if i < 0 {
			break
		}
		line := string(t.part[:i])
		if stats, ok := strings.CutPrefix(line, "extract-prepare: worker stats "); ok {
			t.log.Info("prepare worker stats", "worker", t.worker, "stats", stats)
		} else {
			t.log.Debug("prepare worker", "worker", t.worker, "stderr", line)
		}
		t.part = t.part[i+1:]
	}
	if len(t.part) > t.max {
		t.part = t.part[:0]
	}
	return len(b), nil
}

func (t *tailBuffer) suffix() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := bytes.TrimSpace(t.buf)
	if len(s) == 0 {
		return ""
	}
	return "; its stderr ends:\n" + string(s)
}

// timeAfter is how long a worker has to exit once its stdin is closed.
func timeAfter() <-chan time.Time { return time.After(5 * time.Second) }
