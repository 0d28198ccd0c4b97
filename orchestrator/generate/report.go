package generate

import (
	"errors"
	"fmt"
	"os"
	"sort"
)

// Report is what the index holds: the counts, the flags, and the worst lines (failed,
// then dropped, then kept with flags), each with its reason.
type Report struct {
	Total     int            `json:"total"` // this shard's lines
	Done      int            `json:"done"`
	Dropped   int            `json:"dropped"`
	Failed    int            `json:"failed"`
	Pending   int            `json:"pending"`
	Generated int64          `json:"generated_tokens"`
	Requests  int64          `json:"requests"`
	Flags     map[string]int `json:"flags"`
	Worst     []ReportLine   `json:"worst"`
	Output    string         `json:"output,omitempty"`
}

// ReportLine is one listed conversation.
type ReportLine struct {
	Line   int    `json:"line"`
	ID     string `json:"id,omitempty"`
	State  State  `json:"state"`
	Flags  []Flag `json:"flags,omitempty"`
	Reason string `json:"reason,omitempty"`
}

// ErrNoIndex: no generate has run in this state dir.
var ErrNoIndex = errors.New("no generate index")

// ReadReport reads dir's index (read-only: it waits 2 s for a running generate) and
// lists at most worst lines.
func ReadReport(dir string, worst int) (Report, error) {
	if _, err := os.Stat(IndexPath(dir)); err != nil {
		return Report{}, fmt.Errorf("%w at %s", ErrNoIndex, IndexPath(dir))
	}
	ix, err := openIndex(IndexPath(dir), true)
	if err != nil {
		return Report{}, err
	}
	defer func() { _ = ix.Close() }() // read only
	m, _, err := ix.meta()
	if err != nil {
		return Report{}, err
	}
	r := Report{Total: m.Hi - m.Lo, Flags: map[string]int{}, Output: m.Output}
	rank := map[State]int{Failed: 0, Dropped: 1, Done: 2}
	err = ix.each(func(s int, rec *Record) error {
		if s < m.Lo || s >= m.Hi {
			return nil
		}
		switch rec.State {
		case Done:
			r.Done++
		case Dropped:
			r.Dropped++
		case Failed:
			r.Failed++
		}
		r.Generated += int64(rec.Generated)
		r.Requests += int64(rec.Requests)
		for _, f := range rec.Flags {
			r.Flags[string(f)]++
		}
		if rec.State != Done || len(rec.Flags) > 0 {
			r.Worst = append(r.Worst, ReportLine{Line: rec.Line, ID: rec.ID, State: rec.State, Flags: rec.Flags, Reason: rec.Reason})
		}
		return nil
	})
	if err != nil {
		return Report{}, err
	}
	r.Pending = r.Total - r.Done - r.Dropped - r.Failed
	sort.SliceStable(r.Worst, func(a, b int) bool {
		wa, wb := r.Worst[a], r.Worst[b]
		if rank[wa.State] != rank[wb.State] {
			return rank[wa.State] < rank[wb.State]
		}
		return len(wa.Flags) > len(wb.Flags)
	})
	if len(r.Worst) > worst {
		r.Worst = r.Worst[:worst]
	}
	return r, nil
}
