package report

import (
	"fmt"
	"math"
	"time"

	"github.com/extract-dev/extract/internal/history"
)

// rateWindow is the span a replica's rate is measured over: long enough that a few
// samples a second do not read as noise.
const rateWindow = time.Minute

var gap = tv{v: math.NaN()}

// panels are the report's charts, top to bottom.
func panels(in Input, ax timeAxis) []panel {
	recs := in.Series.Records
	last := recs[len(recs)-1]
	pick := func(f func(history.Record) float64) []tv {
		out := make([]tv, len(recs))
		for i, r := range recs {
			out[i] = tv{r.T, f(r)}
		}
		return out
	}

	progress := panel{id: "progress", title: "Progress (samples done)", format: countLabel,
		lines: []series{
			{name: "done", class: "series-done", color: blue, width: 2, pts: pick(func(r history.Record) float64 { return float64(r.Done) })},
		},
		levels: []hline{{v: float64(max(in.Facts.Total, last.Total)), label: fmt.Sprintf("total %d", max(in.Facts.Total, last.Total)), class: "level-total", color: muted}},
	}
	if eta, ok := projection(in, ax); ok {
		progress.lines = append(progress.lines, eta)
	}

	rates := panel{id: "rate", title: "Rate per replica (samples/s, over the last minute)", format: rateLabel}
	inflight := panel{id: "inflight", title: "In flight per replica (samples sent, dump not yet in)", format: countLabel}
	for k, name := range in.Series.Replicas {
		c := palette[k%len(palette)]
		rates.lines = append(rates.lines, series{name: name, class: fmt.Sprintf("series-replica series-replica-%d", k), color: c, width: 1.5, pts: replicaRate(recs, k)})
		inflight.lines = append(inflight.lines, series{name: name, class: fmt.Sprintf("series-inflight series-inflight-%d", k), color: c, width: 1.5,
			pts: pick(func(r history.Record) float64 {
				if k >= len(r.Replicas) {
					return math.NaN()
				}
				return float64(r.Replicas[k].Inflight)
			})})
	}
	rates.lines = append(rates.lines, series{name: "all", class: "series-rate", color: ink, width: 1, pts: pick(func(r history.Record) float64 { return r.Rate })})

	failures := panel{id: "failures", title: "Failures and quarantines (this run's rejected dumps; failed samples)", format: countLabel, markEvents: true,
		lines: []series{
			{name: "failed samples", class: "series-failed", color: red, width: 2, pts: pick(func(r history.Record) float64 { return float64(r.Failed) })},
			{name: "rejected dumps", class: "series-rejected", color: orange, width: 1.5, pts: pick(func(r history.Record) float64 { return float64(r.Rejected) })},
			{name: "quarantined", class: "series-quarantined", color: purple, width: 1.5, pts: pick(func(r history.Record) float64 { return float64(r.Quarantined) })},
		}}

	reserve := max(in.Facts.DiskReserve, lastNonZero(recs, func(r history.Record) int64 { return r.DiskReserve }))
	disk := panel{id: "disk", title: "Output disk free against the reserve", format: bytesLabel, binary: true,
		lines: []series{{name: "free", class: "series-disk-free", color: green, width: 2, pts: pick(func(r history.Record) float64 {
			if r.DiskFree == 0 {
				return math.NaN() // not measured (a stopped run's last word)
			}
			return float64(r.DiskFree)
		})}},
		levels: []hline{{v: float64(reserve), label: "reserve " + bytesLabel(float64(reserve)), class: "level-reserve", color: red}},
	}
	budget := lastNonZero(recs, func(r history.Record) int64 { return r.StagingBudget })
	staging := panel{id: "staging", title: "Staging (shm) used against its budget", format: bytesLabel, binary: true,
		lines:  []series{{name: "used", class: "series-staging", color: purple, width: 1.5, pts: pick(func(r history.Record) float64 { return float64(r.StagingBytes) })}},
		levels: []hline{{v: float64(budget), label: "budget " + bytesLabel(float64(budget)), class: "level-budget", color: red}},
	}
	return []panel{progress, rates, inflight, failures, disk, staging}
}

// projection is the ETA's dashed line: from the last record at the current rate to
// the total, cut at the axis's end.
func projection(in Input, ax timeAxis) (series, bool) {
	end, ok := etaEnd(in)
	if !ok {
		return series{}, false
	}
	recs := in.Series.Records
	last := recs[len(recs)-1]
	from := tv{max(last.T, in.Now.UnixMilli()), float64(in.Facts.Done)}
	to := tv{end, float64(in.Facts.Total)}
	if end > ax.t1 {
		frac := float64(ax.t1-from.t) / float64(end-from.t)
		to = tv{ax.t1, from.v + frac*(to.v-from.v)}
	}
	name := "ETA " + time.UnixMilli(end).UTC().Format("Jan 2 15:04 MST")
	return series{name: name, class: "eta", color: blue, width: 2, dash: 6, pts: []tv{from, to}}, true
}

// replicaRate is replica k's samples per second: the rise of its done count over the
// last rateWindow (or since the record before, where records are sparser). The line
// breaks where the count starts over (a new run) or the replica is missing.
func replicaRate(recs []history.Record, k int) []tv {
	out := make([]tv, 0, len(recs))
	seg := -1 // first record of the current stretch
	j := 0
	for i, r := range recs {
		if k >= len(r.Replicas) {
			out, seg = append(out, gap), -1
			continue
		}
		if seg >= 0 {
			p := recs[i-1]
			if p.Run != r.Run || k >= len(p.Replicas) || r.Replicas[k].Done < p.Replicas[k].Done {
				seg = -1
			}
		}
		if seg < 0 {
			seg, j = i, i
			out = append(out, gap)
			continue
		}
		for j < i-1 && recs[j+1].T <= r.T-rateWindow.Milliseconds() {
			j++
		}
		dt := float64(r.T-recs[j].T) / 1000
		if dt <= 0 {
			continue
		}
		out = append(out, tv{r.T, float64(r.Replicas[k].Done-recs[j].Replicas[k].Done) / dt})
	}
	return out
}

func lastNonZero(recs []history.Record, f func(history.Record) int64) int64 {
	for i := len(recs) - 1; i >= 0; i-- {
		if v := f(recs[i]); v != 0 {
			return v
		}
	}
	return 0
}
