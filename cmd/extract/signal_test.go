package main

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// exitOf is cmd's exit code after Wait's err; -1 with the signal's name when a signal
// ended it.
func exitOf(t *testing.T, err error) (int, string) {
	t.Helper()
	var ee *exec.ExitError
	if err == nil {
		return 0, ""
	}
	if !errors.As(err, &ee) {
		t.Fatal(err)
	}
	if ws := ee.Sys().(syscall.WaitStatus); ws.Signaled() {
		return -1, ws.Signal().String()
	}
	return ee.ExitCode(), ""
}

// `extract run | tee log`, then ^C: tee dies first and the run's stdout and stderr are a
// pipe nobody reads. The run must still drain, stop its server and exit 75.
func TestAClosedStdoutAndStderrNeverEndTheRunOrLeakItsServer(t *testing.T) {
	j := newJob(t, 200, 2000)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd := j.command("run")
	cmd.Stdout, cmd.Stderr = w, w
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() { cmd.Process.Kill() })
	st := j.waitStatus("progress", func(st map[string]any) bool { return num(st["done"]) > 5 })
	srv := num(server(st)["pid"])
	r.Close() // tee is gone
	// A second of log lines into the closed pipe, then the ^C.
	time.Sleep(time.Second)
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatalf("the run died once its stdout closed: %v", err)
	}
	select {
	case err := <-exited:
		if code, sig := exitOf(t, err); code != 75 {
			t.Errorf("run with its output pipe closed: exit %d %s, want 75 (stopped, resumable)", code, sig)
		}
	case <-time.After(90 * time.Second):
		t.Fatal("the run did not stop in 90 s")
	}
	if alive(srv) {
		t.Errorf("server pid %d still runs after the run stopped", srv)
	}
	if b, _ := os.ReadFile(filepath.Join(j.state, "logs", "extract.log")); !strings.Contains(string(b), "stopping: no new samples") {
		t.Errorf("extract.log lacks the graceful stop: the log file must keep what stderr could not take")
	}
}

// A dataset that is a FIFO used to hang the run past SIGTERM; under `timeout -s TERM`
// it must end at once, refused (exit 2), saying what the dataset is.
func TestAFIFODatasetEndsTheRunAtOnceEvenUnderTimeoutTERM(t *testing.T) {
	timeout, err := exec.LookPath("timeout")
	if err != nil {
		t.Skip("timeout (coreutils) is not installed")
	}
	j := newJob(t, 10, 0)
	fifo := filepath.Join(t.TempDir(), "fifo.jsonl")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(timeout, "-s", "TERM", "20", extractBin, "run", "--config", j.config)
	cmd.Env = append(j.env, "EXTRACT_DATASET="+fifo)
	start := time.Now()
	out, err := cmd.CombinedOutput()
	code, sig := exitOf(t, err)
	if took := time.Since(start); took > 10*time.Second || code != 2 || !strings.Contains(string(out), "is a FIFO (named pipe), not a regular file") {
		t.Errorf("run over a FIFO dataset: exit %d %s after %v, want 2 at once saying it is a FIFO:\n%s", code, sig, took.Round(time.Millisecond), out)
	}
}

// SIGTERM while doctor waits on a probe that never answers (an interpreter on a hung
// filesystem) ends it with exit 75 within seconds, for run's preflight and doctor alike.
func TestSIGTERMDuringThePreflightChecksExits75(t *testing.T) {
	j := newJob(t, 10, 0)
	dir := t.TempDir()
	python, probed := filepath.Join(dir, "python3"), filepath.Join(dir, "probed")
	if err := os.WriteFile(python, []byte("#!/bin/sh\ntouch "+probed+"\nexec sleep 300\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(filepath.Join(dir, "model"), 0o755)
	os.WriteFile(filepath.Join(dir, "model", "config.json"), []byte(`{"hidden_size":32,"num_hidden_layers":61}`), 0o644)
	j.env = append(j.env, "EXTRACT_SERVER_KIND=sglang", "EXTRACT_SERVER_PYTHON="+python, "EXTRACT_SERVER_MODEL_PATH="+filepath.Join(dir, "model"), "EXTRACT_SERVER_HIDDEN_SIZE=32")
	for _, args := range [][]string{{"doctor"}, {"run"}} {
		os.Remove(probed)
		cmd := j.command(args...)
		var out strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			if _, err := os.Stat(probed); err == nil {
				break // in the probe that never answers
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s never probed the interpreter:\n%s", args[0], out.String())
			}
		}
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-exited:
			if code, sig := exitOf(t, err); code != 75 {
				t.Errorf("%s stopped by SIGTERM during its checks: exit %d %s, want 75:\n%s", args[0], code, sig, out.String())
			}
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			t.Errorf("%s ignored SIGTERM during its checks for 30 s:\n%s", args[0], out.String())
		}
	}
}
