package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer func() { logErr("ln.Close()", ln.Close()) }()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// jobConfig is the part of extract's config the benchmarks vary.
type jobConfig struct {
	Dataset, OutputDir, ShmDir string
	Port                       int
	Replicas                   int // server.replicas; 0 or 1: one server
	Hidden                     int
	TokensPerSecond            float64
	MaxInflight, Movers        int
	ShmBudget                  string
}

// write puts the config in a YAML file; `extract status --config` reads the same file.
func (c jobConfig) write(path string) error {
	var b strings.Builder
	fmt.Fprintf(&b, "dataset: %s\noutput_dir: %s\nshm_dir: %s\n", c.Dataset, c.OutputDir, c.ShmDir)
	if c.ShmBudget != "" {
		fmt.Fprintf(&b, "shm_budget: %s\n", c.ShmBudget)
	}
	fmt.Fprintf(&b, "server:\n  kind: simulator\n  host: 127.0.0.1\n  port: %d\n  simulator:\n    hidden_size: %d\n    tokens_per_second: %g\n", c.Port, c.Hidden, c.TokensPerSecond)
	if c.Replicas > 1 {
		fmt.Fprintf(&b, "  replicas: %d\n", c.Replicas)
	}
	fmt.Fprintf(&b, "run:\n  max_inflight: %d\n  movers: %d\n", c.MaxInflight, c.Movers)
	fmt.Fprintf(&b, "disk:\n  reserve: 1GiB\nstatus:\n  listen: 127.0.0.1:0\n")
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

// proc is a child process whose stderr lines are timestamped as they arrive.
type proc struct {
	cmd     *exec.Cmd
	started time.Time
	mu      sync.Mutex
	lines   []stampedLine
	waiters []lineWaiter
	exited  chan struct{}
	err     error
	ended   time.Time
	stdout  bytes.Buffer
}

type stampedLine struct {
	at   time.Time
	text string
}

type lineWaiter struct {
	substr string
	ch     chan stampedLine
}

func start(name string, args ...string) (*proc, error) {
	p := &proc{cmd: exec.Command(name, args...), exited: make(chan struct{})}
	p.cmd.Stdout = &p.stdout
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	p.started = time.Now()
	if err := p.cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			l := stampedLine{at: time.Now(), text: sc.Text()}
			p.mu.Lock()
			p.lines = append(p.lines, l)
			kept := p.waiters[:0]
			for _, w := range p.waiters {
				if strings.Contains(l.text, w.substr) {
					w.ch <- l
				} else {
					kept = append(kept, w)
				}
			}
			p.waiters = kept
			p.mu.Unlock()
		}
		p.err = p.cmd.Wait()
		p.ended = time.Now()
		close(p.exited)
	}()
	return p, nil
}

// waitLine waits for a stderr line containing substr (seen already or to come).
func (p *proc) waitLine(substr string, timeout time.Duration) (stampedLine, error) {
	ch := make(chan stampedLine, 1)
	p.mu.Lock()
	for _, l := range p.lines {
		if strings.Contains(l.text, substr) {
			p.mu.Unlock()
			return l, nil
		}
	}
	p.waiters = append(p.waiters, lineWaiter{substr, ch})
	p.mu.Unlock()
	select {
	case l := <-ch:
		return l, nil
	case <-p.exited:
		select {
		case l := <-ch:
			return l, nil
		default:
		}
		return stampedLine{}, fmt.Errorf("%s exited (%v) before logging %q; last lines:\n%s", p.cmd.Path, p.err, substr, p.tail(15))
	case <-time.After(timeout):
		return stampedLine{}, fmt.Errorf("no %q from %s within %s; last lines:\n%s", substr, p.cmd.Path, timeout, p.tail(15))
	}
}

func (p *proc) wait(timeout time.Duration) error {
	select {
	case <-p.exited:
		if p.err != nil {
			return fmt.Errorf("%s: %w; last lines:\n%s", strings.Join(p.cmd.Args, " "), p.err, p.tail(15))
		}
		return nil
	case <-time.After(timeout):
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		<-p.exited
		return fmt.Errorf("%s did not finish within %s; last lines:\n%s", strings.Join(p.cmd.Args, " "), timeout, p.tail(15))
	}
}

func (p *proc) tail(n int) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var b strings.Builder
	for _, l := range p.lines[max(0, len(p.lines)-n):] {
		b.WriteString("  " + l.text + "\n")
	}
	return b.String()
}

// logField returns key's value in a slog text line (key=value or key="value").
func logField(line, key string) string {
	i := strings.Index(line, " "+key+"=")
	if i < 0 {
		return ""
	}
	v := line[i+len(key)+2:]
	if strings.HasPrefix(v, `"`) {
		if j := strings.Index(v[1:], `"`); j >= 0 {
			return v[1 : j+1]
		}
	}
	if j := strings.IndexByte(v, ' '); j >= 0 {
		return v[:j]
	}
	return v
}

// hwm polls a process's peak resident set (VmHWM) until it exits; the last value read is
// the peak up to then, since VmHWM never decreases.
type hwm struct {
	mu   sync.Mutex
	peak int64 // bytes
	rss  int64 // largest VmRSS seen, as a cross-check
	stop chan struct{}
	done chan struct{}
}

func watchHWM(pid int, every time.Duration) *hwm {
	h := &hwm{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(h.done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			if peak, rss, ok := readHWM(pid); ok {
				h.mu.Lock()
				h.peak = max(h.peak, peak)
				h.rss = max(h.rss, rss)
				h.mu.Unlock()
			}
			select {
			case <-h.stop:
				return
			case <-t.C:
			}
		}
	}()
	return h
}

func (h *hwm) finish() (peak, rss int64) {
	close(h.stop)
	<-h.done
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.peak, h.rss
}

func readHWM(pid int) (peak, rss int64, ok bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, false
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		kb, _ := strconv.ParseInt(f[1], 10, 64)
		switch f[0] {
		case "VmHWM:":
			peak = kb << 10
		case "VmRSS:":
			rss = kb << 10
		}
	}
	return peak, rss, peak > 0
}

// timedStatus runs `extract status --json` and returns its wall time and state.
func timedStatus(extract, config string) (time.Duration, string, string, error) {
	start := time.Now()
	out, err := exec.Command(extract, "status", "--json", "--config", config).Output()
	d := time.Since(start)
	if err != nil {
		return d, "", "", fmt.Errorf("extract status: %w: %s", err, out)
	}
	var st struct {
		State  string `json:"state"`
		Source string `json:"source"`
		Done   int    `json:"done"`
	}
	if err := json.Unmarshal(out, &st); err != nil {
		return d, "", "", fmt.Errorf("extract status: %w: %s", err, out)
	}
	return d, st.State, st.Source, nil
}

// liveStatusURL reads the running job's status address from state_dir/run.json.
func liveStatusURL(stateDir string) (string, error) {
	b, err := os.ReadFile(filepath.Join(stateDir, "run.json"))
	if err != nil {
		return "", err
	}
	var ri struct {
		StatusAddr string `json:"status_addr"`
	}
	if err := json.Unmarshal(b, &ri); err != nil {
		return "", err
	}
	if ri.StatusAddr == "" {
		return "", errors.New("run.json has no status address")
	}
	return "http://" + ri.StatusAddr + "/status", nil
}

func timedGet(url string) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	start := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	return time.Since(start), err
}

func median(ds []time.Duration) time.Duration {
	s := append([]time.Duration{}, ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

func maxDur(ds []time.Duration) time.Duration {
	m := time.Duration(0)
	for _, d := range ds {
		m = max(m, d)
	}
	return m
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
