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

// RecentRates is the job's rate over the span before now (or since the history's
// first record, if later) in n equal slots: each slot's last recorded rate (a slot
// between two records keeps the one before), NaN before the first record and after the
// last. It also returns the largest rate and the span drawn.
func RecentRates(recs []history.Record, now time.Time, span time.Duration, n int) ([]float64, float64, time.Duration) {
	out := make([]float64, n)
	for i := range out {
		out[i] = math.NaN()
	}
	from := now.Add(-span).UnixMilli()
	if len(recs) > 0 && recs[0].T > from && recs[0].T < now.UnixMilli() {
		from = recs[0].T
		span = now.Sub(recs[0].Time())
	}
	slot := float64(span.Milliseconds()) / float64(n)
	hi := 0.0
	lastSlot := -1
	for _, r := range recs {
		if r.T < from || r.T > now.UnixMilli() {
			continue
		}
		i := min(int(float64(r.T-from)/slot), n-1)
		out[i] = r.Rate
		hi = max(hi, r.Rate)
		lastSlot = max(lastSlot, i)
	}
	// Slots narrower than the record interval hold the rate of the slot before.
	for i := 1; i <= lastSlot; i++ {
		if math.IsNaN(out[i]) {
			out[i] = out[i-1]
		}
	}
	return out, hi, span
}
