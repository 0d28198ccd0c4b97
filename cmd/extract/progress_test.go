package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/extract-dev/extract/orchestrator"
	"golang.org/x/sys/unix"
)

func TestProgressBarShowsRateAndETA(t *testing.T) {
	st := orchestrator.Status{Total: 200, Done: 50, SamplesPerSecond: 2.5, ETASeconds: 60, Server: orchestrator.ServerStatus{State: "ready"}}
	line := renderBar(st, 120)
	for _, want := range []string{"[##########------------------------------]", "25.0%", "50/200", "2.5 samples/s", "ETA 1m0s"} {
		if !strings.Contains(line, want) {
			t.Errorf("bar %q lacks %q", line, want)
		}
	}
}

func TestAPausedBarSaysPausedInsteadOfARateAndETA(t *testing.T) {
	// While paused the rate only decays and the ETA only grows: neither says anything.
	st := orchestrator.Status{Total: 200, Done: 50, SamplesPerSecond: 0.3, ETASeconds: 500, Paused: []string{"output disk reserve: 1 GiB free", "staging full"}}
	line := renderBar(st, 120)
	for _, want := range []string{"PAUSED: output disk reserve: 1 GiB free", "and 1 more", "50/200"} {
		if !strings.Contains(line, want) {
			t.Errorf("bar %q lacks %q", line, want)
		}
	}
	for _, not := range []string{"samples/s", "ETA"} {
		if strings.Contains(line, not) {
			t.Errorf("paused bar %q shows %q", line, not)
		}
	}
}

func TestTheBarFitsEveryWidthBelowTheLastColumn(t *testing.T) {
	long := orchestrator.Status{Total: 37312, Done: 18421, Failed: 12, SamplesPerSecond: 12.5, BytesPerSecond: 1 << 30, ETASeconds: 3600,
		Server: orchestrator.ServerStatus{State: "restarting"}}
	paused := long
	paused.Paused = []string{"output disk reserve: 1.0 GiB free of the 1.0 GiB kept; waiting for room (admission resumes by itself)"}
	for _, st := range []orchestrator.Status{long, paused} {
		for cols := 1; cols <= 200; cols++ {
			line := renderBar(st, cols)
			if n := utf8.RuneCountInString(line); n > max(cols-1, 1) {
				t.Fatalf("at %d columns the bar is %d wide (wraps): %q", cols, n, line)
			}
			if cols >= 80 && !strings.Contains(line, "18421/37312") {
				t.Errorf("at %d columns the bar lost the counts: %q", cols, line)
			}
			if cols >= 80 && len(st.Paused) > 0 && !strings.Contains(line, "PAUSED") {
				t.Errorf("at %d columns the bar lost the pause: %q", cols, line)
			}
		}
	}
}

func TestLogLinesPrintAboveTheBar(t *testing.T) {
	var out bytes.Buffer
	bar := &progressBar{w: &out, cols: 80}
	bar.update(orchestrator.Status{Total: 10, Done: 1, ETASeconds: -1})
	bar.Write([]byte("level=INFO msg=hello\n"))
	got := out.String()
	i, j := strings.LastIndex(got, "msg=hello"), strings.LastIndex(got, "1/10")
	if i < 0 || j < i {
		t.Errorf("the bar is not redrawn below the log line: %q", got)
	}
}

// openPTY opens a pseudo-terminal: what is written to tty reads back from master.
func openPTY(t *testing.T, cols int) (master, tty *os.File) {
	t.Helper()
	master, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatalf("no pseudo-terminals here: %v", err)
	}
	t.Cleanup(func() { master.Close() })
	fd := int(master.Fd())
	if err := unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0); err != nil {
		t.Fatal(err)
	}
	n, err := unix.IoctlGetInt(fd, unix.TIOCGPTN)
	if err != nil {
		t.Fatal(err)
	}
	tty, err = os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tty.Close() })
	setWidth(t, master, cols)
	return master, tty
}

func setWidth(t *testing.T, master *os.File, cols int) {
	t.Helper()
	if err := unix.IoctlSetWinsize(int(master.Fd()), unix.TIOCSWINSZ, &unix.Winsize{Row: 24, Col: uint16(cols)}); err != nil {
		t.Fatal(err)
	}
}

func TestTheBarRereadsTheWidthOnSIGWINCH(t *testing.T) {
	master, tty := openPTY(t, 60)
	go io.Copy(io.Discard, master)
	bar, stop := newTerminalBar(tty)
	defer stop()
	if got := bar.width(); got != 60 {
		t.Fatalf("width at start = %d, want the terminal's 60", got)
	}
	setWidth(t, master, 150)
	// The terminal is not this process's controlling one, so the kernel signals nobody:
	// send the SIGWINCH a shell's terminal would.
	if err := syscall.Kill(os.Getpid(), syscall.SIGWINCH); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for bar.width() != 150 {
		if time.Now().After(deadline) {
			t.Fatalf("width = %d 30s after SIGWINCH, want 150", bar.width())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

var csi = regexp.MustCompile("\x1b\\[[0-9;?]*[A-Za-z]")

// A run on a narrow terminal draws its bar without wrapping (a wrapped bar is redrawn
// below itself on every update: 36 lines in 8 s), and its last line is its own.
func TestARunOnATerminalNeverWrapsAndPrintsTheOutcomeOnItsOwnLine(t *testing.T) {
	const cols = 60
	j := newJob(t, 40, 4000) // a few seconds: several redraws
	master, tty := openPTY(t, cols)
	var screen bytes.Buffer
	copied := make(chan struct{})
	go func() {
		io.Copy(&screen, master) // ends with EIO once every tty fd is closed
		close(copied)
	}()
	cmd := j.command("run")
	cmd.Stdout, cmd.Stderr = tty, tty
	err := cmd.Run()
	tty.Close()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatal(err)
	}
	select {
	case <-copied:
	case <-time.After(30 * time.Second):
		t.Fatal("the terminal's output did not end")
	}
	out := screen.String()
	if err != nil {
		t.Fatalf("run: %v\n%s", err, out)
	}
	if !strings.Contains(out, "samples/s") {
		t.Fatalf("no progress bar was drawn:\n%q", out)
	}
	for _, seg := range regexp.MustCompile("[\r\n]").Split(out, -1) {
		if vis := csi.ReplaceAllString(seg, ""); utf8.RuneCountInString(vis) >= cols && strings.Contains(vis, "samples/s") {
			t.Errorf("a bar line of %d columns on a %d-column terminal wraps: %q", utf8.RuneCountInString(vis), cols, vis)
		}
	}
	i := strings.Index(out, "done: ")
	if i < 0 {
		t.Fatalf("no outcome line:\n%q", out)
	}
	if before := strings.TrimRight(out[:i], "\r"); !strings.HasSuffix(before, "\n") {
		t.Errorf("the outcome is glued to the bar: %q", out[max(0, i-80):i+20])
	}
}
