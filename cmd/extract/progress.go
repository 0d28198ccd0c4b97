package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/extract-dev/extract/configs"
	"github.com/extract-dev/extract/orchestrator"
	"golang.org/x/sys/unix"
)

// isTerminal reports whether f is a terminal, where a progress bar beats log lines.
func isTerminal(f *os.File) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// progressBar keeps one redrawn status line at the bottom of a terminal; log lines
// written through it appear above the bar.
type progressBar struct {
	mu   sync.Mutex
	w    io.Writer
	line string
}

// Write prints a log line above the bar.
func (p *progressBar) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprint(p.w, "\r\033[K")
	n, err := p.w.Write(b)
	if p.line != "" {
		fmt.Fprint(p.w, p.line)
	}
	return n, err
}

// update redraws the bar from a status snapshot.
func (p *progressBar) update(st orchestrator.Status) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.line = renderBar(st, 30)
	fmt.Fprint(p.w, "\r\033[K"+p.line)
}

// finish leaves the last bar on its own line.
func (p *progressBar) finish() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.line != "" {
		fmt.Fprintln(p.w)
		p.line = ""
	}
}

func renderBar(st orchestrator.Status, width int) string {
	frac := 0.0
	if st.Total > 0 {
		frac = float64(st.Done) / float64(st.Total)
	}
	filled := int(frac * float64(width))
	eta := "--"
	if st.ETASeconds >= 0 {
		eta = (time.Duration(st.ETASeconds) * time.Second).String()
	}
	line := fmt.Sprintf("[%s%s] %5.1f%% %d/%d  %.1f samples/s  %s/s  ETA %s",
		strings.Repeat("#", filled), strings.Repeat("-", width-filled), 100*frac, st.Done, st.Total,
		st.SamplesPerSecond, configs.ByteSize(st.BytesPerSecond), eta)
	if st.Failed > 0 {
		line += fmt.Sprintf("  %d failed", st.Failed)
	}
	if len(st.Paused) > 0 {
		line += "  PAUSED: " + st.Paused[0]
	}
	if st.Server.State != "" && st.Server.State != "ready" {
		line += "  server " + st.Server.State
	}
	return line
}
