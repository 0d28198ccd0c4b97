package sglang

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/extract-dev/extract/sglang/simulator"
)

// TestMain lets the test binary stand in for the extract binary: with SIM_CHILD=1 it
// runs "simulate" from its arguments, as LaunchSpec.Argv starts it; with SIM_CHILD=worker
// it idles like an SGLang TP worker.
func TestMain(m *testing.M) {
	switch os.Getenv("SIM_CHILD") {
	case "1":
		os.Exit(runSimulatorChild(os.Args[1:]))
	case "worker":
		if os.Getenv("SIM_WORKER") == "stubborn" {
			signal.Ignore(syscall.SIGTERM)
		}
		// The worker is in the group from its fork, but ignores SIGTERM only from here.
		if ready := os.Getenv("SIM_WORKER_READY"); ready != "" {
			if err := os.WriteFile(ready, nil, 0o644); err != nil {
				os.Exit(1)
			}
		}
		for {
			time.Sleep(time.Hour)
		}
	}
	os.Exit(m.Run())
}

func runSimulatorChild(args []string) int {
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	if len(args) == 0 || args[0] != "simulate" {
		log.Error("child expects the simulate command", "args", args)
		return 2
	}
	var cfg simulator.Config
	fs := pflag.NewFlagSet("simulate", pflag.ContinueOnError)
	cfg.BindFlags(fs)
	if err := fs.Parse(args[1:]); err != nil {
		return 2
	}
	if os.Getenv("SIM_WORKER") != "" {
		// A TP worker in the server's process group, like SGLang's scheduler processes.
		w := exec.Command(os.Args[0])
		w.Env = append(os.Environ(), "SIM_CHILD=worker")
		if err := w.Start(); err != nil {
			log.Error("start worker", "error", err)
			return 1
		}
		log.Info("worker started", "pid", w.Process.Pid)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := simulator.Run(ctx, cfg, log); err != nil {
		log.Error("simulator failed", "error", err)
		return 1
	}
	return 0
}

// logBuffer keeps a test's logs, shown only when it fails: goroutines may still log
// after the test is over, which t.Log would not allow.
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

func testLogger(t *testing.T) (*slog.Logger, *logBuffer) {
	buf := &logBuffer{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("logs:\n%s", buf)
		}
	})
	return slog.New(slog.NewTextHandler(buf, &slog.HandlerOptions{Level: slog.LevelDebug})), buf
}

// waitFor polls cond until it holds or d passes.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, d)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
