package report

import (
	"bufio"
	"fmt"
	"html"
	"image/color"
	"io"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/extract-dev/extract/internal/history"
)

// CSP is the page's Content-Security-Policy: nothing may be fetched, from anywhere; the
// page is its own inline style and SVG. The status endpoint sends it as a header too.
const CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'"

// WriteHTML writes the report as one self-contained page: the scene as inline SVG and
// the events as a table.
func WriteHTML(w io.Writer, in Input) error {
	bw := bufio.NewWriter(w)
	esc := html.EscapeString
	fmt.Fprintf(bw, `<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="%s">
<link rel="icon" href="data:,">
<title>%s</title>
<style>
body{font-family:sans-serif;margin:16px;color:#222;background:#f6f6f6}
svg{background:#fafafa;border:1px solid #ddd;max-width:100%%;height:auto}
table.events{border-collapse:collapse;margin-top:12px;font-size:13px}
table.events td,table.events th{border-bottom:1px solid #ddd;padding:3px 10px;text-align:left}
</style></head><body>
`, esc(CSP), esc(in.Title))
	writeSVG(bw, Build(in))
	evs := in.Series.Events
	fmt.Fprintf(bw, "<h2>Events</h2>\n")
	if len(evs) == 0 {
		fmt.Fprintf(bw, "<p>None recorded.</p>\n")
	} else {
		const most = 500
		if len(evs) > most {
			fmt.Fprintf(bw, "<p>The last %d of %d events.</p>\n", most, len(evs))
			evs = evs[len(evs)-most:]
		}
		fmt.Fprintf(bw, "<table class=\"events\"><tr><th>when (UTC)</th><th>what</th><th>event</th></tr>\n")
		for _, e := range slices.Backward(evs) {
			what := e.Text
			if e.Kind == history.Pause {
				what += fmt.Sprintf(" (for %s)", e.Duration().Round(time.Second))
			}
			fmt.Fprintf(bw, "<tr class=\"event-row event-row-%s\"><td>%s</td><td>%s</td><td>%s</td></tr>\n", e.Kind,
				time.UnixMilli(e.T).UTC().Format("2006-01-02 15:04:05"), esc(what), e.Kind)
		}
		fmt.Fprintf(bw, "</table>\n")
	}
	fmt.Fprintf(bw, "</body></html>\n")
	return bw.Flush()
}

// writeSVG writes the scene as an SVG element.
func writeSVG(w *bufio.Writer, s Scene) {
	fmt.Fprintf(w, `<svg xmlns="http://www.w3.org/2000/svg" width="%s" height="%s" viewBox="0 0 %s %s" font-family="sans-serif">`+"\n",
		num(s.W), num(s.H), num(s.W), num(s.H))
	for _, it := range s.Items {
		writeItem(w, it)
	}
	fmt.Fprintf(w, "</svg>\n")
}

func writeItem(w *bufio.Writer, it Item) {
	esc := html.EscapeString
	switch v := it.(type) {
	case Group:
		fmt.Fprintf(w, "<g")
		if v.Class != "" {
			fmt.Fprintf(w, ` class="%s"`, esc(v.Class))
		}
		if v.ID != "" {
			fmt.Fprintf(w, ` id="%s"`, esc(v.ID))
		}
		for _, k := range slices.Sorted(maps.Keys(v.Data)) {
			fmt.Fprintf(w, ` data-%s="%s"`, esc(k), esc(v.Data[k]))
		}
		fmt.Fprintf(w, ">")
		if v.Title != "" {
			fmt.Fprintf(w, "<title>%s</title>", esc(v.Title))
		}
		for _, c := range v.Items {
			writeItem(w, c)
		}
		fmt.Fprintf(w, "</g>\n")
	case Rect:
		fmt.Fprintf(w, `<rect x="%s" y="%s" width="%s" height="%s" %s/>`, num(v.X), num(v.Y), num(v.W), num(v.H), paint("fill", v.Fill))
	case Path:
		for _, run := range runs(v.Pts) {
			var d strings.Builder
			for i, p := range run {
				if i == 0 {
					d.WriteString("M")
				} else {
					d.WriteString(" L")
				}
				d.WriteString(num(p.X) + " " + num(p.Y))
			}
			dash := ""
			if v.Dash > 0 {
				dash = fmt.Sprintf(` stroke-dasharray="%s"`, num(v.Dash))
			}
			fmt.Fprintf(w, `<path d="%s" fill="none" %s stroke-width="%s"%s/>`, d.String(), paint("stroke", v.Stroke), num(v.Width), dash)
		}
	case Text:
		anchor := map[Anchor]string{Start: "start", Middle: "middle", End: "end"}[v.Anchor]
		weight := ""
		if v.Bold {
			weight = ` font-weight="bold"`
		}
		fmt.Fprintf(w, `<text x="%s" y="%s" font-size="%s" text-anchor="%s"%s %s>%s</text>`, num(v.X), num(v.Y), num(v.Size), anchor, weight, paint("fill", v.Fill), esc(v.S))
	}
}

// paint is a fill or stroke attribute with its opacity.
func paint(attr string, c color.RGBA) string {
	s := fmt.Sprintf(`%s="#%02x%02x%02x"`, attr, c.R, c.G, c.B)
	if c.A != 0xff {
		s += fmt.Sprintf(` %s-opacity="%s"`, attr, strconv.FormatFloat(float64(c.A)/255, 'f', 2, 64))
	}
	return s
}

// num is a coordinate to a tenth of a pixel.
func num(f float64) string { return strconv.FormatFloat(math.Round(f*10)/10, 'f', -1, 64) }
