package tokenizer

// The worker processes: one Python process (the zygote) loads the tokenizer and forks a
// worker per pipe pair extract passed it; here are their start, calls and end.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// zygote is the process the workers are forked from: their stderr is its stderr, and
// they die with it (PR_SET_PDEATHSIG), as it dies with extract.
type zygote struct {
	cmd    *exec.Cmd
	stderr *tailBuffer
	done   chan struct{} // closed once it has exited (all its workers have)
	mu     sync.Mutex
	exited bool // it has exited and is about to be reaped: its group id may be reused after
}

// kill ends the zygote and every worker: they share its process group, whose id is the
// zygote's pid. Only while the zygote is unreaped is that id sure to be this group's.
func (z *zygote) kill() {
	z.mu.Lock()
	defer z.mu.Unlock()
	if !z.exited {
		_ = syscall.Kill(-z.cmd.Process.Pid, syscall.SIGKILL)
	}
}

// reap waits for the zygote's exit without reaping it (WNOWAIT), so that kill can stop
// signalling its group first, then reaps it.
func (z *zygote) reap() {
	var info unix.Siginfo
	for {
		err := unix.Waitid(unix.P_PID, z.cmd.Process.Pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
		if !errors.Is(err, syscall.EINTR) {
			break
		}
	}
	z.mu.Lock()
	z.exited = true
	z.mu.Unlock()
	_ = z.cmd.Wait() // an exit shows to a call as EOF, with stderr's tail
	close(z.done)
}

// workerEnviron is extract's environment and server.env without the variables the
// worker passes to itself when it re-executes (a stale one would replace the config).
func workerEnviron(base, extra []string) []string {
	var out []string
	for _, kv := range append(append([]string(nil), base...), extra...) {
		if !strings.HasPrefix(kv, "PREPARE_WORKER_") {
			out = append(out, kv)
		}
	}
	return out
}

// proc is one forked worker as extract sees it: its pipes.
type proc struct {
	index int
	pid   int
	in    *os.File // requests
	out   *bufio.Reader
	outF  *os.File
	z     *zygote
	mu    sync.Mutex
}

func (p *Pool) startAll(ctx context.Context) error {
	cfg := p.cfg
	path, err := Install(cfg.WorkDir)
	if err != nil {
		return fmt.Errorf("install the prepare worker: %w", err)
	}
	// Every pipe: extract keeps one end, the zygote gets the other. Worker i reads fd
	// 3+2i and writes 4+2i (ExtraFiles); the hello and the ready line go over pipes of
	// ours too, on its stdin and stdout (os/exec's own are closed by Wait, which could
	// beat the read of a quick "error" line).
	var ours, theirs []*os.File
	pipe := func(childReads bool) (*os.File, error) {
		r, w, err := os.Pipe()
		if err != nil {
			return nil, fmt.Errorf("prepare worker: %w", err)
		}
		if childReads {
			ours, theirs = append(ours, w), append(theirs, r)
			return w, nil
		}
		ours, theirs = append(ours, r), append(theirs, w)
		return r, nil
	}
	started := false
	defer func() {
		closeFiles(theirs) // the zygote has its copies; ours would keep EOF from coming
		if !started {
			closeFiles(ours)
		}
	}()
	fds := make([][2]int, cfg.Workers)
	p.procs = make([]*proc, cfg.Workers)
	z := &zygote{stderr: &tailBuffer{max: 16 << 10, log: cfg.Log}, done: make(chan struct{})}
	for i := range cfg.Workers {
		in, err := pipe(true)
		if err != nil {
			return err
		}
		out, err := pipe(false)
		if err != nil {
			return err
		}
		fds[i] = [2]int{3 + 2*i, 4 + 2*i}
		p.procs[i] = &proc{index: i, in: in, outF: out, out: bufio.NewReaderSize(out, 1<<20), z: z}
	}
	helloW, err := pipe(true)
	if err != nil {
		return err
	}
	defer func() { _ = helloW.Close() }()
	readyR, err := pipe(false)
	if err != nil {
		return err
	}
	defer func() { _ = readyR.Close() }()
	hello, err := json.Marshal(map[string]any{
		"tokenizer": cfg.Tokenizer, "chat_template_file": cfg.TemplateFile, "trust_remote_code": cfg.TrustRemoteCode,
		"mask": cfg.Mask, "end_of_turn": cfg.EndOfTurn, "end_of_turn_tokens": cfg.EndOfTurnTokens, "template_kwargs": cfg.TemplateKwargs,
		"worker_fds": fds,
	})
	if err != nil {
		return err
	}
	cmd := exec.Command(cfg.Python, path)
	cmd.Env = append(workerEnviron(os.Environ(), cfg.Env),
		// One process per core already: the Rust encoder's own threads would only fight.
		"TOKENIZERS_PARALLELISM=false", "RAYON_NUM_THREADS=1", "OMP_NUM_THREADS=1",
		"HF_HUB_OFFLINE=1", "TRANSFORMERS_OFFLINE=1", "PYTHONUNBUFFERED=1")
	// Its own group, so one kill ends it and every worker it forked.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	n := 2 * cfg.Workers
	cmd.ExtraFiles = theirs[:n]
	cmd.Stdin, cmd.Stdout, cmd.Stderr = theirs[n], theirs[n+1], z.stderr
	cmd.WaitDelay = exitGrace // a worker's stderr still open must not hold Wait forever
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start the prepare worker in %s: %w", cfg.Python, err)
	}
	started = true
	closeFiles(theirs)
	theirs = nil
	z.cmd = cmd
	p.zygote = z
	go z.reap()
	boot := &proc{index: -1, out: bufio.NewReader(readyR), z: z}
	r, err := boot.hello(ctx, helloW, hello)
	if err == nil && (len(r.PIDs) != cfg.Workers) {
		err = fmt.Errorf("the worker answered out of protocol (%d worker pids for %d workers)%s", len(r.PIDs), cfg.Workers, z.stderr.suffix())
	}
	if err != nil {
		p.stopAll()
		return fmt.Errorf("prepare worker (%s %s, tokenizer %s): %w", cfg.Python, path, cfg.Tokenizer, err)
	}
	for i, pr := range p.procs {
		pr.pid = r.PIDs[i]
	}
	p.ready = r
	if p.vocab == 0 {
		p.vocab = p.ready.VocabSize
	}
	cfg.Log.Info("prepare: tokenizer workers ready", "workers", cfg.Workers, "mask", p.ready.Method, "fast", p.ready.Fast,
		"vocab_size", p.vocab, "end_of_turn_ids", p.ready.EndOfTurnIDs, "tokenizer", cfg.Tokenizer, "start", p.ready.Timings)
	return nil
}

// hello sends the config and reads the ready line.
func (pr *proc) hello(ctx context.Context, stdin io.Writer, hello []byte) (Ready, error) {
	stop := context.AfterFunc(ctx, pr.z.kill)
	defer stop()
	var r Ready
	if _, err := stdin.Write(append(hello, '\n')); err != nil {
		return r, pr.failed(ctx, fmt.Errorf("write to the worker: %w", err))
	}
	// A broken pipe's error (failed) already ends with the workers' stderr; these say it too.
	if err := pr.readLine(ctx, &r); err != nil {
		return r, err
	}
	if r.Error != "" {
		return r, fmt.Errorf("%s%s", r.Error, pr.z.stderr.suffix())
	}
	if !r.ReadyReported || r.Protocol != "1" {
		return r, fmt.Errorf("the worker answered out of protocol (protocol %q)%s", r.Protocol, pr.z.stderr.suffix())
	}
	return r, nil
}

func closeFiles(fs []*os.File) {
	for _, f := range fs {
		_ = f.Close()
	}
}

// call writes one request line and reads one answer line into v.
func (pr *proc) call(ctx context.Context, req []byte, v any) error {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	// A cancelled call ends the pool: the worker may be midway through a batch.
	stop := context.AfterFunc(ctx, pr.z.kill)
	defer stop()
	if _, err := pr.in.Write(append(req, '\n')); err != nil {
		return pr.failed(ctx, fmt.Errorf("write to the worker: %w", err))
	}
	return pr.readLine(ctx, v)
}

func (pr *proc) readLine(ctx context.Context, v any) error {
	var line []byte
	for {
		chunk, err := pr.out.ReadSlice('\n')
		line = append(line, chunk...)
		if len(line) > maxReply {
			pr.z.kill()
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

// failed says why a pipe broke: the worker's exit as the zygote reported it (or the
// zygote's own), and the end of their stderr.
func (pr *proc) failed(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if why, ok := pr.z.stderr.exitOf(pr.index, time.Second, pr.z.done); ok {
		return fmt.Errorf("%w (the worker %s)%s", err, why, pr.z.stderr.suffix())
	}
	select {
	case <-pr.z.done:
		return fmt.Errorf("%w (the worker process exited: %v)%s", err, pr.z.cmd.ProcessState, pr.z.stderr.suffix())
	default:
		return fmt.Errorf("%w%s", err, pr.z.stderr.suffix())
	}
}

func (p *Pool) stopAll() {
	// Every worker's requests closed, then one wait for the zygote, which exits once
	// they all have (each without the interpreter's teardown, a second with transformers).
	for _, pr := range p.procs {
		if pr != nil {
			_ = pr.in.Close()
		}
	}
	if z := p.zygote; z != nil {
		select {
		case <-z.done:
		case <-time.After(exitGrace):
			z.kill()
			<-z.done
		}
	}
	for _, pr := range p.procs {
		if pr != nil {
			_ = pr.outF.Close()
		}
	}
}

// tailBuffer keeps the end of the workers' stderr for error messages, logs each line,
// and keeps what the zygote reports of each worker's end.
type tailBuffer struct {
	mu      sync.Mutex
	max     int
	buf     []byte
	log     *slog.Logger
	part    []byte
	exits   map[int]string // worker index -> "exited: killed by signal 9"
	changed chan struct{}  // closed (and replaced) when exits grows
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
		t.line(string(t.part[:i]))
		t.part = t.part[i+1:]
	}
	if len(t.part) > t.max {
		t.part = t.part[:0]
	}
	return len(b), nil
}

// line logs one stderr line: "extract-prepare: worker N stats {...}" at info, the
// zygote's "extract-prepare: worker N exited: ..." kept for that worker's error, the
// rest (what libraries print) at debug.
func (t *tailBuffer) line(line string) {
	rest, ok := strings.CutPrefix(line, "extract-prepare: worker ")
	num, what, _ := strings.Cut(rest, " ")
	w, err := strconv.Atoi(num)
	switch {
	case !ok || err != nil:
		t.log.Debug("prepare worker", "stderr", line)
	case strings.HasPrefix(what, "stats "):
		t.log.Info("prepare worker stats", "worker", w, "stats", strings.TrimPrefix(what, "stats "))
	case strings.HasPrefix(what, "exited: "):
		t.log.Warn("prepare worker ended", "worker", w, "how", strings.TrimPrefix(what, "exited: "))
		if t.exits == nil {
			t.exits = map[int]string{}
		}
		t.exits[w] = what
		if t.changed != nil {
			close(t.changed)
			t.changed = nil
		}
	default:
		t.log.Debug("prepare worker", "worker", w, "stderr", what)
	}
}

// exitOf waits up to d for the zygote's report of worker w's end (it reaps the worker
// just after extract sees the pipe close), giving up early once the zygote has exited.
func (t *tailBuffer) exitOf(w int, d time.Duration, zygoteDone <-chan struct{}) (string, bool) {
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		t.mu.Lock()
		why, ok := t.exits[w]
		if t.changed == nil {
			t.changed = make(chan struct{})
		}
		changed := t.changed
		t.mu.Unlock()
		if ok {
			return why, true
		}
		select {
		case <-changed:
		case <-zygoteDone:
			t.mu.Lock()
			why, ok := t.exits[w]
			t.mu.Unlock()
			return why, ok
		case <-timer.C:
			return "", false
		}
	}
}

func (t *tailBuffer) suffix() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := bytes.TrimSpace(t.buf)
	if len(s) == 0 {
		return ""
	}
	return "; the workers' stderr ends:\n" + string(s)
}

// exitGrace is how long the workers have to exit once their request pipes are closed.
const exitGrace = 5 * time.Second
