package report

import (
	"math"
	"strings"
	"time"

	"github.com/extract-dev/extract/internal/history"
)

var bars = []rune("▁▂▃▄▅▆▇█")

// Sparkline draws values as one line of block characters, scaled to the largest; a
// NaN (no record then) is a space.
func Sparkline(values []float64) string {
	hi := 0.0
	for _, v := range values {
		if !math.IsNaN(v) {
			hi = max(hi, v)
		}
	}
	var b strings.Builder
	for _, v := range values {
		switch {
		case math.IsNaN(v):
			b.WriteRune(' ')
		case hi <= 0:
			b.WriteRune(bars[0])
		default:
			b.WriteRune(bars[min(int(v/hi*float64(len(bars)-1)+0.5), len(bars)-1)])
		}
	}
	return b.String()
}

// RecentRates is the job's rate over the span before now in n equal slots: each slot's
// last recorded rate, NaN for a slot without records. It also returns the largest.
func RecentRates(recs []history.Record, now time.Time, span time.Duration, n int) ([]float64, float64) {
	out := make([]float64, n)
	for i := range out {
		out[i] = math.NaN()
	}
	from := now.Add(-span).UnixMilli()
	slot := float64(span.Milliseconds()) / float64(n)
	hi := 0.0
	for _, r := range recs {
		if r.T < from || r.T > now.UnixMilli() {
			continue
		}
		i := min(int(float64(r.T-from)/slot), n-1)
		out[i] = r.Rate
		hi = max(hi, r.Rate)
	}
	return out, hi
}
