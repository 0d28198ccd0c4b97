package report

import (
	"bytes"
	"flag"
	"image"
	"image/png"
	"math"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/extract-dev/extract/internal/history"
)

var writeTo = flag.String("write", "", "also write the fixture's report to this path (.html or .png), to look at")

var start = time.Date(2026, 3, 1, 1, 0, 0, 0, time.UTC)

// fixture is three hours of a two-replica job: replica 1 restarts at 1 h, admission
// pauses for the staging budget from 1 h 30 to 1 h 40, extract itself is restarted at
// 2 h, two samples fail and a dump is quarantined.
func fixture() Input {
	var recs []history.Record
	run := start.UnixMilli()
	done := [2]int{}
	total := 0
	for d := time.Duration(0); d <= 3*time.Hour; d += 5 * time.Second {
		now := start.Add(d)
		if d == 2*time.Hour {
			run, done = now.UnixMilli(), [2]int{}
		}
		r := history.Record{T: now.UnixMilli(), Run: run, PID: 4242, State: "running", Total: 20000,
			StagingBudget: 8 << 30, StagingBytes: 2 << 30, DiskFree: (900 << 30) - int64(d/time.Second)<<26, DiskReserve: 100 << 30}
		reps := []history.Replica{{State: "ready"}, {State: "ready"}}
		paused := d >= 90*time.Minute && d < 100*time.Minute
		for k := range reps {
			if !paused && !(k == 1 && d >= time.Hour && d < time.Hour+2*time.Minute) {
				done[k] += 1 + k
				total += 1 + k
			}
			reps[k].Done, reps[k].Inflight = done[k], 8
		}
		if d >= time.Hour && d < 2*time.Hour {
			reps[1].Restarts = 1
			if d < time.Hour+2*time.Minute {
				reps[1].State, reps[1].Inflight = "restarting", 0
			}
		}
		if paused {
			r.Paused = []string{"staging budget"}
			r.StagingBytes = 8 << 30
		}
		if d >= 150*time.Minute {
			r.Failed = 2
		}
		if d >= 160*time.Minute {
			r.Quarantined, r.Rejected = 1, 3
		}
		r.Done, r.Replicas, r.Rate, r.Inflight = total, reps, 0.6, 16
		recs = append(recs, r)
	}
	s := history.Merge([]history.Shard{{Records: recs}})
	now := start.Add(3 * time.Hour)
	return Input{Title: "extract report: test job", Now: now, Series: s, Facts: Facts{
		State: "running", Total: 20000, Done: total, Failed: 2, Pending: 20000 - total, SamplesPerSecond: 0.6,
		ETASeconds: float64(20000-total) / 0.6, DiskReserve: 100 << 30, OutputDir: "/data/out",
		Servers: []Server{{Name: "replica 0", State: "ready"}, {Name: "replica 1", State: "ready", Restarts: 1}},
	}}
}

// groups collects the scene's groups by class word.
func groups(items []Item, class string) []Group {
	var out []Group
	for _, it := range items {
		g, ok := it.(Group)
		if !ok {
			continue
		}
		if strings.Contains(" "+g.Class+" ", " "+class+" ") {
			out = append(out, g)
		}
		out = append(out, groups(g.Items, class)...)
	}
	return out
}

func TestTheSceneMarksTheRestartThePauseBothRunsAndBothReplicasOnEveryPanel(t *testing.T) {
	s := Build(fixture())
	panels := groups(s.Items, "panel")
	if len(panels) != 6 {
		t.Fatalf("%d panels, want 6", len(panels))
	}
	for _, c := range []struct {
		class string
		n     int
	}{{"event-restart", 6}, {"event-pause", 6}, {"event-run", 12}, {"event-failure", 1}, {"event-quarantine", 1},
		{"series-replica-0", 1}, {"series-replica-1", 1}, {"eta", 1}, {"level-reserve", 1}} {
		if got := len(groups(s.Items, c.class)); got != c.n {
			t.Errorf("%d groups of class %s, want %d", got, c.class, c.n)
		}
	}
	p := groups(s.Items, "event-pause")[0]
	if p.Data["t"] != "1772332195000" || p.Data["end"] != "1772332795000" {
		t.Errorf("the pause spans %s..%s, want 1 h 29:55 (the last record before it) to 1 h 39:55", p.Data["t"], p.Data["end"])
	}
	if r := groups(s.Items, "event-restart")[0]; r.Data["replica"] != "1" || !strings.Contains(r.Title, "replica 1 restarted") {
		t.Errorf("restart mark %+v", r)
	}
}

func TestTheRateOfAReplicaDropsToZeroWhileItRestartsAndBreaksAtANewRun(t *testing.T) {
	in := fixture()
	rate := replicaRate(in.Series.Records, 1)
	at := func(d time.Duration) float64 {
		for i, r := range in.Series.Records {
			if r.T == start.Add(d).UnixMilli() {
				return rate[i].v
			}
		}
		t.Fatalf("no record at %v", d)
		return 0
	}
	if v := at(50 * time.Minute); math.Abs(v-0.4) > 0.01 {
		t.Errorf("replica 1 at 50 min: %.3f samples/s, want 0.4 (2 every 5 s)", v)
	}
	if v := at(time.Hour + 90*time.Second); v != 0 {
		t.Errorf("replica 1 while restarting: %.3f samples/s, want 0", v)
	}
	if v := at(2 * time.Hour); !math.IsNaN(v) {
		t.Errorf("at the new run: %v, want a break in the line", v)
	}
}

func TestTheHTMLPageFetchesNothing(t *testing.T) {
	var b bytes.Buffer
	if err := WriteHTML(&b, fixture()); err != nil {
		t.Fatal(err)
	}
	page := b.String()
	if *writeTo != "" && strings.HasSuffix(*writeTo, ".html") {
		os.WriteFile(*writeTo, b.Bytes(), 0o644)
	}
	if !strings.Contains(page, `content="default-src &#39;none&#39;`) {
		t.Errorf("the page has no CSP that forbids fetches")
	}
	for _, bad := range []*regexp.Regexp{
		regexp.MustCompile(`(?i)<script`),
		regexp.MustCompile(`(?i)\ssrc=`),
		regexp.MustCompile(`(?i)url\(`),
		regexp.MustCompile(`(?i)href="[^d#]`),
		regexp.MustCompile(`(?i)@import`),
	} {
		if m := bad.FindString(page); m != "" {
			t.Errorf("the page refers to something outside it: %q", m)
		}
	}
	// The only URL is the SVG namespace, which is a name, not a fetch.
	if n := strings.Count(page, "://"); n != strings.Count(page, `xmlns="http://www.w3.org/2000/svg"`) {
		t.Errorf("the page names %d URLs besides the SVG namespace", n-1)
	}
}

func TestThePNGShowsTheRestartInRedAtItsTime(t *testing.T) {
	in := fixture()
	var b bytes.Buffer
	if err := WritePNG(&b, in); err != nil {
		t.Fatal(err)
	}
	if *writeTo != "" && strings.HasSuffix(*writeTo, ".png") {
		os.WriteFile(*writeTo, b.Bytes(), 0o644)
	}
	img, err := png.Decode(&b)
	if err != nil {
		t.Fatal(err)
	}
	s := Build(in)
	if img.Bounds() != image.Rect(0, 0, int(s.W), int(math.Ceil(s.H))) {
		t.Fatalf("image %v, scene %vx%v", img.Bounds(), s.W, s.H)
	}
	// The restart line of the first panel, halfway down the plot.
	restart := groups(s.Items, "event-restart")[0].Items[0].(Path)
	x, y := restart.Pts[0].X, (restart.Pts[0].Y+restart.Pts[1].Y)/2
	r, g, bl, _ := img.At(int(x), int(y)).RGBA()
	if r>>8 < 0xb0 || g>>8 > 0x70 || bl>>8 > 0x70 {
		t.Errorf("pixel at the restart (%v, %v) is %02x%02x%02x, want red", x, y, r>>8, g>>8, bl>>8)
	}
}

func TestSparklineScalesToTheLargestAndLeavesGapsBlank(t *testing.T) {
	if got := Sparkline([]float64{0, 1, 2, math.NaN(), 4}); got != "▁▃▅ █" {
		t.Errorf("sparkline %q", got)
	}
	recs := fixture().Series.Records
	vals, hi, span := RecentRates(recs, start.Add(3*time.Hour), 5*time.Minute, 30)
	if hi != 0.6 || len(vals) != 30 || math.IsNaN(vals[29]) || span != 5*time.Minute {
		t.Errorf("recent rates %v (max %v, over %v)", vals, hi, span)
	}
	// A job younger than the span is drawn from its start, not squeezed into its end.
	vals, _, span = RecentRates(recs[:25], start.Add(2*time.Minute), 10*time.Minute, 24)
	if span != 2*time.Minute || math.IsNaN(vals[0]) || math.IsNaN(vals[11]) {
		t.Errorf("a 2-minute history: rates %v over %v", vals, span)
	}
}

func TestAJobWithoutHistorySaysSoAndStillShowsItsFacts(t *testing.T) {
	var b bytes.Buffer
	in := Input{Title: "t", Now: start, Facts: Facts{State: "stopped", Total: 10, ETASeconds: -1}}
	if err := WriteHTML(&b, in); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "No history recorded yet") || !strings.Contains(b.String(), "0 / 10 samples") {
		t.Errorf("page without history:\n%s", b.String())
	}
	if err := WritePNG(&b, in); err != nil {
		t.Fatal(err)
	}
}
