package main

import (
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/extract-dev/extract/configs"
	"github.com/extract-dev/extract/orchestrator"
	"golang.org/x/sys/unix"
)

// isTerminal reports whether f is a terminal, where a progress bar beats log lines.
func isTerminal(f *os.File) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// terminalWidth is f's width in columns, 80 when the terminal does not say.
func terminalWidth(f *os.File) int {
	ws, err := unix.IoctlGetWinsize(int(f.Fd()), unix.TIOCGWINSZ)
	if err != nil || ws.Col == 0 {
		return 80
	}
	return int(ws.Col)
}

// progressBar keeps one redrawn status line at the bottom of a terminal; log lines
// written through it appear above the bar. The line never reaches the terminal's last
// column: a line that wraps is redrawn below itself on every update, not over itself.
type progressBar struct {
	mu    sync.Mutex
	w     io.Writer
	cols  int // the terminal's width
	line  string
	last  orchestrator.Status
	drawn bool
}

// newTerminalBar draws on the terminal f and follows its width: each SIGWINCH re-reads
// it and redraws. stop ends the watch and leaves the bar's last line on its own line.
func newTerminalBar(f *os.File) (bar *progressBar, stop func()) {
	bar = &progressBar{w: f, cols: terminalWidth(f)}
	winch := make(chan os.Signal, 1)
	signal.Notify(winch, syscall.SIGWINCH)
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-done:
				return
			case <-winch:
				bar.resize(terminalWidth(f))
			}
		}
	})
	var once sync.Once
	return bar, func() {
		once.Do(func() {
			signal.Stop(winch)
			close(done)
			wg.Wait()
			bar.finish()
		})
	}
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
	p.last, p.drawn = st, true
	p.redraw()
}

// resize takes the terminal's new width and redraws the last snapshot to fit it.
func (p *progressBar) resize(cols int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cols = cols
	if p.drawn {
		p.redraw()
	}
}

func (p *progressBar) redraw() {
	p.line = renderBar(p.last, p.cols)
	fmt.Fprint(p.w, "\r\033[K"+p.line)
}

// width is the terminal width the bar fits now.
func (p *progressBar) width() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cols
}

// finish leaves the last bar on its own line, so what is printed next (the run's
// outcome) starts a line of its own.
func (p *progressBar) finish() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.line != "" {
		fmt.Fprintln(p.w)
		p.line = ""
	}
}

// barPart is one field of the bar; when the terminal is narrow, the parts of lowest
// keep go first.
type barPart struct {
	text string
	keep int
}

// renderBar lays out st in fewer than cols columns: the bar itself takes what the fields
// leave (10 to 40 columns, none on a very narrow terminal). While admission is paused the
// bar says so instead of a rate that only decays and an ETA that only grows.
func renderBar(st orchestrator.Status, cols int) string {
	limit := max(cols-1, 1)
	frac := 0.0
	if st.Total > 0 {
		frac = float64(st.Done) / float64(st.Total)
	}
	parts := []barPart{{fmt.Sprintf("%5.1f%% %d/%d", 100*frac, st.Done, st.Total), 9}}
	if len(st.Paused) > 0 {
		reason := "PAUSED: " + st.Paused[0]
		if n := len(st.Paused) - 1; n > 0 {
			reason += fmt.Sprintf(" (and %d more)", n)
		}
		parts = append(parts, barPart{reason, 8})
	} else {
		eta := "--"
		if st.ETASeconds >= 0 {
			eta = (time.Duration(st.ETASeconds) * time.Second).String()
		}
		parts = append(parts,
			barPart{fmt.Sprintf("%.1f samples/s", st.SamplesPerSecond), 5},
			barPart{"ETA " + eta, 6},
			barPart{configs.ByteSize(st.BytesPerSecond).String() + "/s", 2})
	}
	if st.Failed > 0 {
		parts = append(parts, barPart{fmt.Sprintf("%d failed", st.Failed), 7})
	}
	if st.Server.State != "" && st.Server.State != "ready" {
		parts = append(parts, barPart{"server " + st.Server.State, 4})
	}
	for {
		text := joinParts(parts)
		room := limit - runeLen(text) - 3 // "[", "] "
		if room >= 10 || len(parts) == 1 {
			if room < 10 {
				return clip(text, limit)
			}
			width := min(room, 40)
			filled := int(frac * float64(width))
			return clip("["+strings.Repeat("#", filled)+strings.Repeat("-", width-filled)+"] "+text, limit)
		}
		low := 1
		for i, pt := range parts[1:] {
			if pt.keep < parts[low].keep {
				low = i + 1
			}
		}
		if parts[low].keep >= 8 { // the pause and the counts stay; the bar goes
			return clip(text, limit)
		}
		parts = append(parts[:low:low], parts[low+1:]...)
	}
}

func joinParts(parts []barPart) string {
	texts := make([]string, len(parts))
	for i, pt := range parts {
		texts[i] = pt.text
	}
	return strings.Join(texts, "  ")
}

func runeLen(s string) int { return utf8.RuneCountInString(s) }

// clip cuts s to at most n runes, marking the cut.
func clip(s string, n int) string {
	if runeLen(s) <= n {
		return s
	}
	r := []rune(s)
	if n <= 1 {
		return string(r[:n])
	}
	return string(r[:n-1]) + "…"
}
