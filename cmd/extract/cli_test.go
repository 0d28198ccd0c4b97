package main

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/extract-dev/extract/sglang"
	"github.com/spf13/cobra"
)

// bare runs extract with args alone: no --config appended.
func bare(t *testing.T, args ...string) result {
	t.Helper()
	cmd := exec.Command(extractBin, args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var ee *exec.ExitError
	if err != nil && !asExit(err, &ee) {
		t.Fatal(err)
	}
	return result{code: cmd.ProcessState.ExitCode(), stdout: out.String(), stderr: errb.String()}
}

func TestVersionNamesTheVersionCommitBuildDateAndHook(t *testing.T) {
	r := bare(t, "--version")
	if r.code != 0 {
		t.Fatalf("--version: exit %d: %s", r.code, r.stderr)
	}
	for _, want := range []string{"extract ", "commit:", "built:", "dump hook:  " + sglang.HookVersion()} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("--version says %q, lacking %q", r.stdout, want)
		}
	}
	version, buildDate = "v9.9.9", "2026-01-02T03:04:05Z"
	defer func() { version, buildDate = "", "" }()
	if line := versionLine(); !strings.Contains(line, "extract v9.9.9") || !strings.Contains(line, "built:      2026-01-02T03:04:05Z") {
		t.Errorf("with -X main.version and main.buildDate the line is %q", line)
	}
}

func TestAMistypedCommandSuggestsTheNearestOne(t *testing.T) {
	r := bare(t, "stauts")
	if r.code != 2 || !strings.Contains(r.stderr, "did you mean status?") {
		t.Fatalf("extract stauts: exit %d, %q; want 2 suggesting status", r.code, r.stderr)
	}
}

// Each command's synopsis names only flags it has, and its help says its exit codes.
func TestEveryCommandsHelpListsOnlyItsFlagsAndItsExitCodes(t *testing.T) {
	flagRe := regexp.MustCompile(`--([a-z][a-z-]*)`)
	for _, cmd := range newRootCmd().Commands() {
		if cmd.Hidden || cmd.Name() == "help" || cmd.Name() == "completion" {
			continue
		}
		for _, m := range flagRe.FindAllStringSubmatch(cmd.Use, -1) {
			if cmd.Flags().Lookup(m[1]) == nil {
				t.Errorf("`%s` names --%s, which it does not take", cmd.Use, m[1])
			}
		}
		if !strings.Contains(cmd.Long, "Exit codes:") {
			t.Errorf("`extract %s --help` does not say its exit codes", cmd.Name())
		}
	}
	plan := find(t, "plan")
	for _, name := range []string{"shard", "status-listen"} {
		if plan.Flags().Lookup(name) != nil {
			t.Errorf("plan splits the job but takes --%s", name)
		}
	}
}

func find(t *testing.T, name string) *cobra.Command {
	t.Helper()
	cmd, _, err := newRootCmd().Find([]string{name})
	if err != nil {
		t.Fatal(err)
	}
	return cmd
}

// watchPiped runs `extract args...` with stdout into a pipe for a while, then stops it
// as Ctrl-C would, and returns what it wrote.
func watchPiped(t *testing.T, j *job, env []string, args ...string) string {
	t.Helper()
	cmd := j.command(args...)
	if env != nil {
		cmd.Env = env
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond)
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("%v: %v\n%s", args, err, out.String())
	}
	return out.String()
}

func TestStatusWatchIntoAPipeAppendsSnapshotsWithoutEscapes(t *testing.T) {
	j := newJob(t, 3, 0)
	if r := j.run("run"); r.code != 0 {
		t.Fatalf("run: exit %d\n%s", r.code, r.stderr)
	}
	out := watchPiped(t, j, nil, "status", "--watch", "200ms")
	if n := strings.Count(out, "state:"); n < 2 {
		t.Fatalf("%d snapshots in 1.5s of --watch 200ms:\n%s", n, out)
	}
	if strings.Contains(out, "\x1b") {
		t.Errorf("--watch wrote escape codes into a pipe: %q", out)
	}
}

func TestStatusAllWatchWatches(t *testing.T) {
	j := newJob(t, 6, 0)
	env := j.shardEnv(t)
	cmd := j.command("run", "--shard", "0/2")
	cmd.Env = env
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("run --shard 0/2: %v\n%s", err, b)
	}
	defer j.stopShardServers(2)
	out := watchPiped(t, j, env, "status", "--all", "--watch", "200ms")
	if n := strings.Count(out, "job:"); n < 2 {
		t.Fatalf("status --all --watch printed %d snapshots in 1.5s:\n%s", n, out)
	}
	if strings.Contains(out, "\x1b") {
		t.Errorf("--watch wrote escape codes into a pipe: %q", out)
	}
}

func TestWatchOnATerminalRedrawsTheScreen(t *testing.T) {
	master, tty := openPTY(t, 100)
	var screen bytes.Buffer
	done := make(chan struct{})
	go func() {
		io.Copy(&screen, master)
		close(done)
	}()
	n := 0
	err := watchLoop(t.Context(), tty, time.Millisecond, false, func(w io.Writer) error {
		n++
		if n == 3 {
			return io.EOF
		}
		_, err := io.WriteString(w, "snapshot\n")
		return err
	})
	tty.Close()
	if err != io.EOF {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
	}
	if got := strings.Count(screen.String(), "\x1b[H\x1b[2J"); got < 2 {
		t.Errorf("on a terminal --watch cleared the screen %d times for 2 snapshots: %q", got, screen.String())
	}
}

func TestImportOfNoFilesIsNotASuccess(t *testing.T) {
	j := newJob(t, 3, 0)
	empty := t.TempDir()
	r := j.run("import", "--from", empty)
	if r.code != 2 || !strings.Contains(r.stderr, "no sample files") {
		t.Fatalf("import of an empty dir: exit %d, %q %q; want 2 saying there is nothing to import", r.code, r.stdout, r.stderr)
	}
}

func TestImportSaysEachRefusedFileOnce(t *testing.T) {
	j := newJob(t, 3, 0)
	from := t.TempDir()
	if err := os.WriteFile(filepath.Join(from, "7.safetensors"), []byte("not a safetensors file"), 0o644); err != nil {
		t.Fatal(err)
	}
	r := j.run("import", "--from", from)
	if r.code != 1 {
		t.Errorf("import whose every file is refused: exit %d, want 1\n%s%s", r.code, r.stdout, r.stderr)
	}
	if n := strings.Count(r.stdout+r.stderr, "7.safetensors"); n != 1 {
		t.Errorf("the refused file is named %d times, want once:\n%s%s", n, r.stdout, r.stderr)
	}
}

func TestStopTimeoutWhileTheRunDrainsExits75SayingSo(t *testing.T) {
	j := newJob(t, 200, 400) // slow: in-flight samples take seconds to drain
	run := j.command("run")
	// A file, not a buffer: Wait must not wait for a pipe the server inherited.
	runOut, err := os.Create(filepath.Join(j.dir, "run.out"))
	if err != nil {
		t.Fatal(err)
	}
	defer runOut.Close()
	run.Stdout, run.Stderr = runOut, runOut
	if err := run.Start(); err != nil {
		t.Fatal(err)
	}
	ended := make(chan error, 1)
	go func() { ended <- run.Wait() }()
	reaped := false
	defer func() {
		if !reaped {
			run.Process.Kill()
			<-ended
		}
	}()
	j.waitStatus("samples in flight", func(st map[string]any) bool { f, _ := st["inflight"].(float64); return f > 0 })
	r := j.run("stop", "--timeout", "10ms")
	if r.code != 75 || !strings.Contains(r.stderr, "still draining") || strings.Contains(r.stderr, "context deadline exceeded") {
		t.Fatalf("stop --timeout during the drain: exit %d, %q; want 75 saying it is still draining", r.code, r.stderr)
	}
	select {
	case err := <-ended:
		reaped = true
		var ee *exec.ExitError
		if err != nil && (!asExit(err, &ee) || ee.ExitCode() != 75) {
			t.Errorf("the stopped run ended with %v, want exit 75 (stopped before finishing)\n%s", err, mustRead(t, runOut.Name()))
		}
	case <-time.After(time.Minute):
		t.Fatalf("the run did not stop after SIGTERM:\n%s", mustRead(t, runOut.Name()))
	}
}

func asExit(err error, ee **exec.ExitError) bool {
	e, ok := err.(*exec.ExitError)
	*ee = e
	return ok
}

func TestACappedListOfProblemsSaysHowManyItLeftOut(t *testing.T) {
	j := newJob(t, 110, 0)
	if r := j.run("run"); r.code != 0 {
		t.Fatalf("run: exit %d: %s", r.code, r.stderr)
	}
	removed := 0
	filepath.WalkDir(j.out, func(path string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasPrefix(d.Name(), "data_") {
			if os.Remove(path) == nil {
				removed++
			}
		}
		return nil
	})
	r := j.run("verify")
	listed := strings.Count(r.stdout, " missing\n")
	if r.code != 1 || removed != 110 || !strings.Contains(r.stdout, fmt.Sprintf("and %d more", removed-listed)) || listed == removed {
		t.Fatalf("verify of %d missing files: exit %d, %d listed; want the list to end in \"and %d more\":\n%s", removed, r.code, listed, removed-listed, r.stdout)
	}
}
