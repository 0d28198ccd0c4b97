package report

import (
	"fmt"
	"image/color"
	"math"
	"strconv"
	"time"

	"github.com/extract-dev/extract/internal/history"
)

// timeAxis maps Unix milliseconds onto the plots' width.
type timeAxis struct{ t0, t1 int64 }

// newTimeAxis spans the history, up to now while the job runs, and on to the ETA, but
// the projection at most doubles the span so that the past stays readable.
func newTimeAxis(in Input) timeAxis {
	recs := in.Series.Records
	t0, t1 := recs[0].T, recs[len(recs)-1].T
	if in.Facts.State == "running" {
		t1 = max(t1, in.Now.UnixMilli())
	}
	if end, ok := etaEnd(in); ok && end > t1 {
		t1 = min(end, t1+max(t1-t0, 60_000))
	}
	if t1 <= t0 {
		t1 = t0 + 60_000
	}
	return timeAxis{t0, t1}
}

// etaEnd is when the job should finish at its current rate.
func etaEnd(in Input) (int64, bool) {
	f := in.Facts
	if f.State != "running" || f.ETASeconds <= 0 || math.IsInf(f.ETASeconds, 0) {
		return 0, false
	}
	return in.Now.UnixMilli() + int64(f.ETASeconds*1000), true
}

func (a timeAxis) x(t int64) float64 {
	return plotLeft + (plotRight-plotLeft)*float64(t-a.t0)/float64(a.t1-a.t0)
}

// ticks are the time axis's marks at a round step, with their labels (UTC).
func (a timeAxis) ticks() ([]int64, []string) {
	span := time.Duration(a.t1-a.t0) * time.Millisecond
	steps := []time.Duration{time.Second, 5 * time.Second, 15 * time.Second, 30 * time.Second, time.Minute, 5 * time.Minute,
		15 * time.Minute, 30 * time.Minute, time.Hour, 3 * time.Hour, 6 * time.Hour, 12 * time.Hour, 24 * time.Hour, 48 * time.Hour, 7 * 24 * time.Hour, 30 * 24 * time.Hour}
	step := steps[len(steps)-1]
	for _, s := range steps {
		if span/s <= 8 {
			step = s
			break
		}
	}
	layout := "15:04"
	switch {
	case step >= 24*time.Hour:
		layout = "Jan 2"
	case span > 24*time.Hour:
		layout = "Jan 2 15:04"
	case step < time.Minute:
		layout = "15:04:05"
	}
	ms := step.Milliseconds()
	var ts []int64
	var labels []string
	for t := (a.t0/ms + 1) * ms; t <= a.t1; t += ms {
		ts = append(ts, t)
		labels = append(labels, time.UnixMilli(t).UTC().Format(layout))
	}
	return ts, labels
}

// tv is one value at one moment; a NaN value breaks the line.
type tv struct {
	t int64
	v float64
}

type series struct {
	name  string
	class string
	color color.RGBA
	width float64
	dash  float64
	pts   []tv
}

// hline is a level drawn across a panel: a reserve, a budget, the total.
type hline struct {
	v     float64
	label string
	class string
	color color.RGBA
}

type panel struct {
	id, title string
	format    func(float64) string
	lines     []series
	levels    []hline
	// markEvents draws failures and quarantines as marks on this panel.
	markEvents bool
	// binary puts the value axis's marks at round numbers of KiB, MiB, GiB...
	binary bool
}

// draw lays the panel out with its top at y.
func (p panel) draw(y float64, ax timeAxis, events []history.Event) Item {
	g := Group{Class: "panel", ID: "panel-" + p.id}
	top, bottom := y, y+panelH
	g.Items = append(g.Items,
		Text{X: plotLeft, Y: top - 10, S: p.title, Size: 14, Fill: ink, Bold: true},
		Rect{X: plotLeft, Y: top, W: plotRight - plotLeft, H: panelH, Fill: white})

	hi := 0.0
	for _, s := range p.lines {
		for _, q := range s.pts {
			if !math.IsNaN(q.v) {
				hi = max(hi, q.v)
			}
		}
	}
	for _, l := range p.levels {
		hi = max(hi, l.v)
	}
	unit := 1.0
	for p.binary && hi/unit >= 1024 {
		unit *= 1024
	}
	step := niceStep(hi*1.05/unit, 4) * unit
	hi = math.Max(step*math.Ceil(hi*1.05/step), step)
	yOf := func(v float64) float64 { return bottom - panelH*math.Min(math.Max(v, 0), hi)/hi }

	for v := 0.0; v <= hi+step/2; v += step {
		yy := yOf(v)
		g.Items = append(g.Items, Path{Pts: []Point{{plotLeft, yy}, {plotRight, yy}}, Stroke: gridInk, Width: 1},
			Text{X: plotLeft - 6, Y: yy + 4, S: p.format(v), Size: 11, Fill: muted, Anchor: End})
	}
	ts, labels := ax.ticks()
	for i, t := range ts {
		xx := ax.x(t)
		g.Items = append(g.Items, Path{Pts: []Point{{xx, top}, {xx, bottom}}, Stroke: gridInk, Width: 1},
			Text{X: xx, Y: bottom + 15, S: labels[i], Size: 11, Fill: muted, Anchor: Middle})
	}
	g.Items = append(g.Items, eventMarks(events, ax, top, bottom, p.markEvents)...)
	for _, l := range p.levels {
		yy := yOf(l.v)
		g.Items = append(g.Items, Group{Class: "level " + l.class, Title: l.label, Items: []Item{
			Path{Pts: []Point{{plotLeft, yy}, {plotRight, yy}}, Stroke: l.color, Width: 1.5, Dash: 4},
			Text{X: plotRight - 4, Y: yy - 4, S: l.label, Size: 11, Fill: l.color, Anchor: End},
		}})
	}
	lx := plotLeft + 8
	for _, s := range p.lines {
		pts := make([]Point, 0, len(s.pts))
		for _, q := range s.pts {
			if math.IsNaN(q.v) {
				pts = append(pts, broken)
				continue
			}
			pts = append(pts, Point{ax.x(q.t), yOf(q.v)})
		}
		g.Items = append(g.Items, Group{Class: "series " + s.class, Title: s.name, Items: []Item{
			Path{Pts: decimate(pts), Stroke: s.color, Width: s.width, Dash: s.dash},
		}})
		if s.name != "" {
			g.Items = append(g.Items, Text{X: lx, Y: top + 15, S: s.name, Size: 11, Fill: s.color, Bold: true})
			lx += 12 + 7*float64(len([]rune(s.name)))
		}
	}
	g.Items = append(g.Items, Path{Pts: []Point{{plotLeft, top}, {plotLeft, bottom}, {plotRight, bottom}}, Stroke: muted, Width: 1})
	return g
}

// eventMarks draws the events over a panel: pauses as bands, restarts of a server and
// of extract as vertical lines, failures and quarantines (when marked) as ticks on top.
func eventMarks(events []history.Event, ax timeAxis, top, bottom float64, marks bool) []Item {
	var items []Item
	for _, e := range events {
		x := ax.x(e.T)
		when := time.UnixMilli(e.T).UTC().Format("Jan 2 15:04:05")
		data := map[string]string{"t": strconv.FormatInt(e.T, 10)}
		switch e.Kind {
		case history.Pause:
			w := math.Max(ax.x(e.End)-x, 2)
			data["end"] = strconv.FormatInt(e.End, 10)
			items = append(items, Group{Class: "event event-pause", Title: fmt.Sprintf("%s, %s for %s", e.Text, when, e.Duration().Round(time.Second)), Data: data,
				Items: []Item{Rect{X: x, Y: top, W: w, H: bottom - top, Fill: pauseInk}}})
		case history.Restart:
			data["replica"] = strconv.Itoa(e.Replica)
			items = append(items, Group{Class: "event event-restart", Title: e.Text + ", " + when, Data: data,
				Items: []Item{Path{Pts: []Point{{x, top}, {x, bottom}}, Stroke: red, Width: 2}}})
		case history.RunStart:
			items = append(items, Group{Class: "event event-run", Title: e.Text + ", " + when, Data: data,
				Items: []Item{Path{Pts: []Point{{x, top}, {x, bottom}}, Stroke: runInk, Width: 1.5, Dash: 3}}})
		case history.Failure, history.Quarantine:
			if !marks {
				continue
			}
			c, class := red, "event event-failure"
			if e.Kind == history.Quarantine {
				c, class = purple, "event event-quarantine"
			}
			data["count"] = strconv.Itoa(e.Count)
			items = append(items, Group{Class: class, Title: e.Text + ", " + when, Data: data,
				Items: []Item{Path{Pts: []Point{{x, top}, {x, top + 12}}, Stroke: c, Width: 4}}})
		}
	}
	return items
}

// niceStep is a round step (1, 2 or 5 times a power of ten) that cuts hi into about n.
func niceStep(hi float64, n int) float64 {
	if hi <= 0 {
		return 1
	}
	raw := hi / float64(n)
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*mag >= raw {
			return m * mag
		}
	}
	return 10 * mag
}

func countLabel(v float64) string {
	switch {
	case v >= 1e6:
		return strconv.FormatFloat(v/1e6, 'g', 3, 64) + "M"
	case v >= 1e4:
		return strconv.FormatFloat(v/1e3, 'g', 3, 64) + "k"
	}
	return strconv.FormatFloat(v, 'g', 4, 64)
}

func rateLabel(v float64) string { return strconv.FormatFloat(v, 'g', 3, 64) }
