package main

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"

	"github.com/extract-dev/extract/configs"
)

// newLogger logs text to stderr and JSON to state_dir/logs/extract.log, so the history of
// a cron-driven job survives its terminal.
func newLogger(cfg *configs.Config, stderr io.Writer) (*slog.Logger, func(), error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(cfg.Log.Level)); err != nil {
		return nil, nil, fmt.Errorf("log.level: %w", err)
	}
	file := &lazyFile{path: filepath.Join(cfg.StateDir, "logs", "extract.log")}
	h := slog.NewMultiHandler(
		slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}),
		slog.NewJSONHandler(file, &slog.HandlerOptions{Level: level}),
	)
	return slog.New(h), file.close, nil
}

// survivePipeClose keeps a closed stdout or stderr from ending the process. Go kills a
// program that writes to a broken pipe on fd 1 or 2 with SIGPIPE unless SIGPIPE is
// notified; `extract run | tee log` and a ^C (which ends tee first) would then leave the
// run dead mid-drain and its server running. Notified, such a write fails with EPIPE,
// which every writer to stdout and stderr ignores (the log file keeps the lines). Notify
// rather than Ignore: an ignored signal is inherited by the server we exec.
func survivePipeClose() {
	signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)
}

// lazyFile creates the log file on the first write, so a run refused for a bad dataset
// writes nothing at all.
type lazyFile struct {
	path string
	mu   sync.Mutex
	f    *os.File
	err  error
}

func (l *lazyFile) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil && l.err == nil {
		if l.err = os.MkdirAll(filepath.Dir(l.path), 0o755); l.err == nil {
			l.f, l.err = os.OpenFile(l.path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
		}
	}
	if l.err != nil {
		return len(p), nil // stderr still has the line; a log file problem must not stop the job
	}
	return l.f.Write(p)
}

func (l *lazyFile) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f != nil {
		if err := l.f.Close(); err != nil {
			// The log is closing at exit: stderr is the one place left to say it.
			fmt.Fprintf(os.Stderr, "extract: close %s: %v\n", l.path, err)
		}
	}
}
