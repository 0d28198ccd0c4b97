package sglang

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

const (
	// serverIDEnv marks every process of a launched server, so workers orphaned by a dead
	// leader can be told apart from strangers that happen to share the group id.
	serverIDEnv = "EXTRACT_SERVER_ID"
	// adoptProbeTimeout bounds the health probe of a recorded server; a busy SGLang
	// answers /health_generate at once, a hung one never does.
	adoptProbeTimeout = 10 * time.Second
	// readyProbeTimeout bounds one readiness probe while the server starts.
	readyProbeTimeout = 5 * time.Second
	readyPollInterval = 500 * time.Millisecond
	readyPollFirst    = 10 * time.Millisecond
	adoptedPollPeriod = 500 * time.Millisecond
	// replaceGrace is how long a stale server gets to exit on SIGTERM before SIGKILL.
	replaceGrace = 30 * time.Second
	// killWait bounds the wait for a SIGKILLed group; longer means a process stuck in
	// the kernel (a GPU driver call), which we report rather than wait out.
	killWait     = 10 * time.Second
	logTailLines = 20
)

// ErrPortTaken means a process we did not start listens on the server's port.
var ErrPortTaken = errors.New("server port taken")

// Server is a running server that a Manager launched or adopted.
type Server struct {
	PID, PGID int
	// ServerID is in the environment of every process of the server: orphaned workers
	// are found by it.
	ServerID string
	// StartTime is /proc/<pid>/stat field 22: with PID, it identifies the process.
	StartTime   uint64
	Port        int
	Fingerprint string
	Argv        []string
	// Adopted is true when the server was found running rather than launched.
	Adopted bool
}

// Manager keeps one server matching Spec running, recorded in <StateDir>/server.json
// (server-<r>.json for replica r > 0: each replica of a job has its own Manager).
//
// The server outlives the orchestrator on purpose: it runs in its own session and logs
// to <StateDir>/logs/server.log, so a restarted run adopts a healthy server of the same
// fingerprint instead of reloading a 1T-parameter model. A recorded pid is signalled
// only after its boot, /proc start time and command line prove it is the one we started.
type Manager struct {
	StateDir string
	Spec     LaunchSpec
	// StartupTimeout bounds loading the model (default 40m: a 1T MoE over 8 GPUs).
	StartupTimeout time.Duration
	Log            *slog.Logger
	// Replica numbers this server among the job's server.replicas; it names the record
	// and the log. Replica 0 keeps the names of a single-server job, so a job that grows
	// replicas still adopts the server it had.
	Replica int

	op     sync.Mutex // serializes Ensure and Stop
	logMu  sync.Mutex // serializes the log's rotation at launch and TrimLog
	mu     sync.Mutex // guards cur and exited
	cur    *Server
	exited chan struct{}
}

// LogPath is the server's stdout and stderr, appended across launches: logs/server.log
// for replica 0, logs/server-<r>.log for the others.
func (m *Manager) LogPath() string {
	if m.Replica == 0 {
		return filepath.Join(m.StateDir, "logs", "server.log")
	}
	return filepath.Join(m.StateDir, "logs", fmt.Sprintf("server-%d.log", m.Replica))
}

func (m *Manager) log() *slog.Logger {
	if m.Log == nil {
		return slog.Default()
	}
	return m.Log
}

// Exited is closed once the current server (launched or adopted) is seen gone. It is
// nil, which blocks forever, before Ensure has produced a server.
func (m *Manager) Exited() <-chan struct{} {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.exited
}

func (m *Manager) setCurrent(s *Server, exited chan struct{}) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.cur, m.exited = s, exited
}

// Ensure returns a healthy server for Spec: the recorded one if it is still ours, has
// Spec's fingerprint and answers /health_generate; otherwise it stops what is ours and
// launches a new one, waiting until it is ready. If ctx ends while the server loads, the
// server keeps loading for a later Ensure to adopt.
func (m *Manager) Ensure(ctx context.Context) (*Server, error) {
	m.op.Lock()
	defer m.op.Unlock()
	argv, err := m.Spec.Argv()
	if err != nil {
		return nil, err
	}
	fp := m.Spec.Fingerprint()
	client := NewClient(m.Spec.BaseURL(), ClientOptions{Logger: m.log()})
	rec, err := m.readRecord()
	if err != nil {
		return nil, err
	}
	if rec != nil && rec.Launching {
		// The run that launched it died before recording its pid: whatever carries its
		// server id is ours and half-known; stop it and start clean.
		m.stopLaunching(ctx, rec)
		if err := m.removeRecord(); err != nil {
			return nil, err
		}
		rec = nil
	}
	if rec != nil {
		log := m.log().With("pid", rec.PID, "pgid", rec.PGID, "record", m.recordPath())
		switch m.identify(rec) {
		case procOurs:
			if rec.Fingerprint != fp {
				log.Info("launch spec changed; replacing server", "old_fingerprint", rec.Fingerprint, "fingerprint", fp)
			} else if err := probe(ctx, client, adoptProbeTimeout); err == nil {
				return m.adopt(rec), nil
			} else if stillStarting(err) && time.Since(rec.StartedAt) < m.startupTimeout() {
				// Interrupted while loading a model that takes half an hour: finish the
				// wait rather than throw the progress away.
				log.Info("recorded server is still starting; adopting it and waiting", "started_at", rec.StartedAt)
				s, exited := m.adopt(rec), m.Exited()
				return m.waitReady(ctx, client, s, rec.StartedAt, exited, func() string { return "" }, 0)
			} else {
				log.Warn("recorded server is unhealthy; replacing it", "error", err)
			}
			if err := m.stopGroup(ctx, rec.PGID, replaceGrace); err != nil {
				return nil, err
			}
		case procForeign:
			log.Warn("recorded pid now belongs to another process; leaving it alone and dropping the record")
		case procGone:
			m.reapOrphans(ctx, rec)
		}
		if err := m.removeRecord(); err != nil {
			return nil, err
		}
	}
	return m.launch(ctx, client, argv, fp)
}

func (m *Manager) adopt(rec *record) *Server {
	m.mu.Lock()
	cur := m.cur
	m.mu.Unlock()
	if cur != nil && cur.PID == rec.PID && cur.StartTime == rec.StartTime {
		return cur
	}
	s := &Server{PID: rec.PID, PGID: rec.PGID, ServerID: rec.ServerID, StartTime: rec.StartTime, Port: rec.Port,
		Fingerprint: rec.Fingerprint, Argv: rec.Argv, Adopted: true}
	exited := make(chan struct{})
	go watchAdopted(s.PID, s.StartTime, exited)
	m.setCurrent(s, exited)
	m.log().Info("adopting server", "pid", s.PID, "port", s.Port, "started_at", rec.StartedAt, "fingerprint", s.Fingerprint)
	return s
}

// watchAdopted closes exited when pid is gone: it is not our child, so there is no Wait.
func watchAdopted(pid int, start uint64, exited chan struct{}) {
	t := time.NewTicker(adoptedPollPeriod)
	defer t.Stop()
	for range t.C {
		if st, err := readStat(pid); err != nil || st.dead() || st.startTime != start {
			close(exited)
			return
		}
	}
}

// stillStarting tells a loading server (port not yet open, or 503 during warmup) from a
// hung one (no answer in time), judging by one failed probe.
func stillStarting(probeErr error) bool {
	var se *StatusError
	return errors.Is(probeErr, syscall.ECONNREFUSED) || (errors.As(probeErr, &se) && se.Status == http.StatusServiceUnavailable)
}

func probe(ctx context.Context, c *Client, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return c.HealthGenerate(ctx)
}

// checkPortFree refuses to launch onto a port someone else listens on; that process is
// never touched, only named.
func (m *Manager) checkPortFree() error {
	use, err := ProbePort(m.Spec.Host, m.Spec.Port)
	if err != nil {
		return fmt.Errorf("check server address %s: %w", use.Addr, err)
	}
	if !use.InUse {
		return nil
	}
	if use.TimeWait && use.HolderPID == 0 {
		// Not ErrPortTaken: nobody to stop, and a retry in a minute finds it free.
		return fmt.Errorf("port %d on %s is held by %s: try again then", m.Spec.Port, m.Spec.Host, use.Who())
	}
	return fmt.Errorf("%w: port %d on %s is taken by %s: stop it, or set server.port to a free port", ErrPortTaken, m.Spec.Port, m.Spec.Host, use.Who())
}

// launch starts the server in its own session, records it, and waits until it is ready.
func (m *Manager) launch(ctx context.Context, client *Client, argv []string, fp string) (*Server, error) {
	if err := m.checkPortFree(); err != nil {
		return nil, err
	}
	boot, err := bootID()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Dir(m.LogPath()), 0o755); err != nil {
		return nil, fmt.Errorf("server log dir: %w", err)
	}
	// The hook refuses to arm without its directory; a fresh tmpfs after a reboot has none.
	// The run made it (shm.PrepareDir, with shm_group's mode); if it is gone, only we may
	// write the new one.
	if err := os.MkdirAll(m.Spec.ShmDir, 0o700); err != nil {
		return nil, fmt.Errorf("server shm dir: %w", err)
	}
	if m.Spec.HookDir != "" {
		if err := m.Spec.installPython(); err != nil {
			return nil, err
		}
	}
	// The child gets the file itself, never a pipe to us: it must keep logging after we die.
	logf, err := m.freshLog()
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	started := time.Now()
	fmt.Fprintf(logf, "\n=== extract: launching %s server at %s: %q\n", m.Spec.Kind, started.Format(time.RFC3339), argv)
	logStart, err := logf.Seek(0, io.SeekEnd)
	if err != nil {
		return nil, fmt.Errorf("server log %s: %w", m.LogPath(), err)
	}
	var id [8]byte
	rand.Read(id[:])
	serverID := hex.EncodeToString(id[:])
	// Recorded before it exists, so that no instant leaves a server nobody can find.
	if err := m.writeRecord(&record{ServerID: serverID, BootID: boot, Port: m.Spec.Port, Fingerprint: fp, Argv: argv, StartedAt: started, Launching: true}); err != nil {
		return nil, err
	}

	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(m.Spec.Environ(), serverIDEnv+"="+serverID)
	cmd.Stdout, cmd.Stderr = logf, logf
	// Own session and process group: the server survives our death and a terminal's ^C,
	// and one signal to the group reaches every TP worker.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start server %s: %w", argv[0], err)
	}
	pid := cmd.Process.Pid
	var waitErr error
	exited := make(chan struct{})
	// Reap the child as soon as it exits so it never lingers as a zombie.
	go func() {
		waitErr = cmd.Wait()
		m.log().Info("server exited", "pid", pid, "status", cmd.ProcessState.String())
		close(exited)
	}()
	st, err := readStat(pid)
	if err != nil {
		<-exited
		return nil, fmt.Errorf("server pid %d exited at once (%v); last lines of %s:\n%s", pid, waitErr, m.LogPath(), logTail(m.LogPath(), logStart))
	}
	rec := &record{PID: pid, PGID: pid, StartTime: st.startTime, BootID: boot, ServerID: serverID,
		Port: m.Spec.Port, Fingerprint: fp, Argv: argv, StartedAt: started}
	if err := m.writeRecord(rec); err != nil {
		// An unrecorded server could never be found again: do not leave one behind.
		m.killGroup(pid)
		return nil, err
	}
	s := &Server{PID: pid, PGID: pid, ServerID: serverID, StartTime: st.startTime, Port: m.Spec.Port, Fingerprint: fp, Argv: argv}
	m.setCurrent(s, exited)
	m.log().Info("server launched; waiting until ready", "pid", pid, "port", m.Spec.Port, "log", m.LogPath(), "startup_timeout", m.startupTimeout())
	return m.waitReady(ctx, client, s, started, exited, func() string { return fmt.Sprintf(" (%v)", waitErr) }, logStart)
}

// waitReady polls /health_generate until s answers 200. It fails fast when s exits and
// stops s when StartupTimeout since started passes; if ctx ends, s keeps loading for a
// later Ensure to adopt. Failures carry the server log's tail from logStart on.
func (m *Manager) waitReady(ctx context.Context, client *Client, s *Server, started time.Time, exited <-chan struct{}, exitStatus func() string, logStart int64) (*Server, error) {
	log := m.log().With("pid", s.PID, "port", s.Port)
	deadline := time.NewTimer(time.Until(started.Add(m.startupTimeout())))
	defer deadline.Stop()
	// Poll fast at first and back off to readyPollInterval: a simulator or an adopted
	// server answers within milliseconds, a model loading for half an hour is polled as before.
	wait := readyPollFirst
	poll := time.NewTimer(wait)
	defer poll.Stop()
	for {
		if err := probe(ctx, client, readyProbeTimeout); err == nil {
			log.Info("server ready", "startup", time.Since(started).Round(time.Millisecond))
			return s, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for server pid %d to be ready: %w (it keeps loading; the next run adopts it)", s.PID, ctx.Err())
		case <-exited:
			return nil, errors.Join(fmt.Errorf("server pid %d exited during startup%s; last lines of %s:\n%s", s.PID, exitStatus(), m.LogPath(), logTail(m.LogPath(), logStart)), m.removeRecord())
		case <-deadline.C:
			log.Error("server not ready in time; stopping it", "startup_timeout", m.startupTimeout())
			stopErr := m.stopGroup(context.Background(), s.PGID, replaceGrace)
			if stopErr == nil {
				stopErr = m.removeRecord()
			}
			return nil, errors.Join(fmt.Errorf("server pid %d not ready %v after its launch; last lines of %s:\n%s", s.PID, m.startupTimeout(), m.LogPath(), logTail(m.LogPath(), logStart)), stopErr)
		case <-poll.C:
			wait = min(2*wait, readyPollInterval)
			poll.Reset(wait)
		}
	}
}

func (m *Manager) startupTimeout() time.Duration {
	if m.StartupTimeout <= 0 {
		return 40 * time.Minute
	}
	return m.StartupTimeout
}

// logTail returns the last lines of the server log written since offset, indented.
func logTail(path string, offset int64) string {
	f, err := os.Open(path)
	if err != nil {
		return "  (" + err.Error() + ")"
	}
	defer f.Close()
	const window = 64 << 10
	if fi, err := f.Stat(); err == nil && fi.Size()-offset > window {
		offset = fi.Size() - window
	}
	b, err := io.ReadAll(io.NewSectionReader(f, offset, window))
	if err != nil {
		return "  (" + err.Error() + ")"
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > logTailLines {
		lines = lines[len(lines)-logTailLines:]
	}
	return "  " + strings.Join(lines, "\n  ")
}
