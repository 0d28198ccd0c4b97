// Package report draws a job's history for a person: progress over time with the ETA
// projection, the rate and the load of each replica, failures and quarantines, the
// output disk against its reserve and staging against its budget, with restarts,
// pauses and extract's own restarts marked on the time axis.
//
// Build turns the history and the job's current facts into a Scene, a list of shapes;
// WriteHTML writes it as one self-contained page (inline SVG, a Content-Security-Policy
// that forbids every fetch, so the page loads nothing from anywhere) and WritePNG
// rasterises the same scene in Go. Sparkline is the terminal's small version. Nothing
// here reads a file or the clock: the caller passes both in.
package report

import (
	"fmt"
	"image/color"
	"strings"
	"time"

	"github.com/extract-dev/extract/internal/history"
)

// Input is what a report shows.
type Input struct {
	Title string
	// Now is when the report was made; it ends the time axis unless the ETA reaches
	// further.
	Now    time.Time
	Series history.Series
	Facts  Facts
}

// Facts are the job's figures now, as `extract status` gives them.
type Facts struct {
	State            string // running | stopped | complete
	Total            int
	Done             int
	Failed           int
	Pending          int
	BytesWritten     int64
	SamplesPerSecond float64
	ETASeconds       float64 // -1 unknown
	Paused           []string
	Servers          []Server
	OutputDir        string
	DiskReserve      int64
	// Notes are lines worth a person's eye (dead shards, damaged history).
	Notes []string
}

// Server is one replica's line.
type Server struct {
	Name     string
	State    string
	Restarts int
	Inflight int
}

// Layout.
const (
	width     = 1000.0
	marginL   = 80.0
	marginR   = 30.0
	panelH    = 170.0
	panelGap  = 62.0
	lineH     = 17.0
	plotLeft  = marginL
	plotRight = width - marginR
)

var (
	ink      = color.RGBA{0x22, 0x22, 0x22, 0xff}
	muted    = color.RGBA{0x77, 0x77, 0x77, 0xff}
	gridInk  = color.RGBA{0xe4, 0xe4, 0xe4, 0xff}
	white    = color.RGBA{0xff, 0xff, 0xff, 0xff}
	blue     = color.RGBA{0x1f, 0x77, 0xb4, 0xff}
	red      = color.RGBA{0xd6, 0x27, 0x28, 0xff}
	orange   = color.RGBA{0xff, 0x7f, 0x0e, 0xff}
	purple   = color.RGBA{0x94, 0x67, 0xbd, 0xff}
	green    = color.RGBA{0x2c, 0xa0, 0x2c, 0xff}
	pauseInk = color.RGBA{0xff, 0xb0, 0x40, 0x55}
	runInk   = color.RGBA{0x55, 0x55, 0x55, 0xff}
	palette  = []color.RGBA{blue, orange, green, purple, {0x8c, 0x56, 0x4b, 0xff}, {0xe3, 0x77, 0xc2, 0xff}, {0x17, 0xbe, 0xcf, 0xff}, {0xbc, 0xbd, 0x22, 0xff}}
)

// Build lays the report out.
func Build(in Input) Scene {
	var items []Item
	y := 34.0
	items = append(items, Text{X: marginL, Y: y, S: shorten(in.Title, 80), Size: 20, Fill: ink, Bold: true})
	y += 8
	for _, l := range factLines(in) {
		y += lineH
		items = append(items, Text{X: marginL, Y: y, S: l, Size: 13, Fill: ink})
	}
	y += 30
	recs := in.Series.Records
	if len(recs) == 0 {
		items = append(items, Text{X: marginL, Y: y, S: "No history recorded yet: a run records one every few seconds in its state dir.", Size: 14, Fill: muted})
		return Scene{W: width, H: y + 40, Items: items}
	}
	ax := newTimeAxis(in)
	for _, p := range panels(in, ax) {
		items = append(items, p.draw(y, ax, in.Series.Events))
		y += panelH + panelGap
	}
	items = append(items, legend(y-panelGap+40))
	return Scene{W: width, H: y + 20, Items: items}
}

// factLines are the header: the same facts `extract status` prints.
func factLines(in Input) []string {
	f := in.Facts
	pct := 0.0
	if f.Total > 0 {
		pct = 100 * float64(f.Done) / float64(f.Total)
	}
	eta := "unknown"
	switch {
	case f.State == "complete":
		eta = "done"
	case f.ETASeconds >= 0:
		d := time.Duration(f.ETASeconds) * time.Second
		eta = fmt.Sprintf("%s (%s)", d.Round(time.Second), in.Now.Add(d).UTC().Format("Jan 2 15:04 MST"))
	}
	lines := []string{
		fmt.Sprintf("state %s · %d / %d samples (%.1f%%) · %d failed · %d pending · %s written", f.State, f.Done, f.Total, pct, f.Failed, f.Pending, bytesLabel(float64(f.BytesWritten))),
		fmt.Sprintf("rate %.2f samples/s · ETA %s · report made %s", f.SamplesPerSecond, eta, in.Now.UTC().Format("2006-01-02 15:04:05 MST")),
	}
	if len(f.Servers) > 0 {
		var s []string
		for _, sv := range f.Servers {
			s = append(s, fmt.Sprintf("%s %s (%d restarts, %d in flight)", sv.Name, sv.State, sv.Restarts, sv.Inflight))
		}
		lines = append(lines, strings.Join(s, " · "))
	}
	if len(f.Paused) > 0 {
		lines = append(lines, "paused now: "+strings.Join(f.Paused, "; "))
	}
	lines = append(lines, f.Notes...)
	if f.OutputDir != "" {
		lines = append(lines, "output "+f.OutputDir)
	}
	return lines
}

// legend explains the marks.
func legend(y float64) Item {
	g := Group{Class: "legend"}
	x := plotLeft
	add := func(mark Item, label string, w float64) {
		g.Items = append(g.Items, mark, Text{X: x + 22, Y: y + 4, S: label, Size: 12, Fill: ink})
		x += w
	}
	add(Rect{X: x, Y: y - 8, W: 16, H: 14, Fill: pauseInk}, "admission paused", 150)
	add(Path{Pts: []Point{{x + 8, y - 9}, {x + 8, y + 7}}, Stroke: red, Width: 2}, "server restart", 130)
	add(Path{Pts: []Point{{x + 8, y - 9}, {x + 8, y + 7}}, Stroke: runInk, Width: 1.5, Dash: 3}, "extract (re)started", 160)
	add(Path{Pts: []Point{{x, y}, {x + 16, y}}, Stroke: blue, Width: 2, Dash: 5}, "ETA projection", 140)
	add(Path{Pts: []Point{{x, y}, {x + 16, y}}, Stroke: red, Width: 1.5, Dash: 4}, "reserve / budget", 150)
	return g
}

// shorten keeps the end of a long line (a path's end says the most), marked with "…".
func shorten(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return "…" + string(r[len(r)-n+1:])
}

// bytesLabel is n bytes in binary units.
func bytesLabel(n float64) string {
	units := []string{"B", "KiB", "MiB", "GiB", "TiB", "PiB"}
	i := 0
	for n >= 1024 && i < len(units)-1 {
		n /= 1024
		i++
	}
	if i == 0 {
		return fmt.Sprintf("%.0f B", n)
	}
	if n >= 100 {
		return fmt.Sprintf("%.0f %s", n, units[i])
	}
	return fmt.Sprintf("%.3g %s", n, units[i])
}
