// Package tokenizer runs the target's own tokenizer and chat template for prepare: a
// Python worker shipped in this binary (worker/extract_prepare.py), started in
// server.python, that loads AutoTokenizer from the model's folder offline once and forks
// one worker per core. It also reads the facts about a tokenizer folder that need no Python:
// what the prepared data's fingerprint covers, whether the folder is usable (doctor),
// and the target's vocabulary size.
//
// What it keeps: a worker's stdout carries only protocol lines (the worker moves
// whatever libraries print to stderr); a worker that dies, answers out of protocol or
// is cancelled fails the call, never a conversation silently; every worker ends with
// the pool (its requests closed, then killed), and with extract (Pdeathsig, from
// extract to the zygote and from the zygote to each worker).
package tokenizer

import (
	"bytes"
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"

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

// Ready is what the worker process reports once its tokenizer is loaded.
type Ready struct {
	Method        string  `json:"method"`
	Fast          bool    `json:"fast"`
	VocabSize     int     `json:"vocab_size"`
	EndOfTurnIDs  []int64 `json:"end_of_turn_ids"`
	TemplateSHA   string  `json:"template_sha256"`
	Protocol      string  `json:"protocol"`
	Error         string  `json:"error"`
	ReadyReported bool    `json:"ready"`
	PIDs          []int   `json:"pids"` // the forked workers', in order
	// Timings is where the start's seconds went (python_s, import_s, load_s, ...), logged.
	Timings map[string]any `json:"timings"`
}

// Pool is one Python process that loads the tokenizer and forks N workers (importing
// transformers is most of a start, and 16 imports at once took 16 s on the device);
// worker w serves the caller that passes w, over its own pair of pipes.
type Pool struct {
	cfg       Config
	zygote    *zygote
	procs     []*proc
	ready     Ready
	vocab     int
	tokDigest string
	tmplHash  string
	once      sync.Once
	startErr  error
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
	if cfg.Workers > MaxWorkers {
		return nil, fmt.Errorf("prepare.workers %d: at most %d tokenizer workers: each holds two pipes in the process that forks them, %d descriptors open while it starts, and a child starts with a soft limit of 1024 (ulimit -n); lower prepare.workers", cfg.Workers, MaxWorkers, 2*cfg.Workers+3)
	}
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

// Start is New, then the workers started: it returns once the tokenizer is loaded and
// the workers forked, or with the worker process's error.
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

// MaxWorkers is the most workers one pool forks. The zygote starts with two pipes a
// worker and three more open (2N+3 descriptors) before its interpreter loads; at a soft
// limit of 1024, which Go gives its children back, 500 started and 520 failed in the
// loader ("Error 24").
const MaxWorkers = 480

// Workers is the number of worker processes (the zygote that forked them aside).
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

// Close ends every worker: its request pipe closed (it exits at EOF), and the whole
// process group killed if the zygote has not exited after exitGrace. A pool never
// started starts none.
func (p *Pool) Close() error {
	p.once.Do(func() { p.startErr = errors.New("the prepare pool is closed") })
	p.stopAll()
	return nil
}
