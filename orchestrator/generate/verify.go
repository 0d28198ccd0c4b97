package generate

import (
	"bufio"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
)

// VerifyReport is one generate index checked against itself and its output file.
type VerifyReport struct {
	Dir           string   `json:"dir"`
	Conversations string   `json:"conversations_sha256"`
	Lines         int      `json:"lines"`
	Lo            int      `json:"lo"`
	Hi            int      `json:"hi"`
	Done          int      `json:"done"`
	Dropped       int      `json:"dropped"`
	Failed        int      `json:"failed"`
	Pending       int      `json:"pending"`
	OutputLines   int      `json:"output_lines"`
	Problems      []string `json:"problems"`
}

// OK says the index and its output agree.
func (r VerifyReport) OK() bool { return len(r.Problems) == 0 }

func (r *VerifyReport) problem(format string, a ...any) {
	if len(r.Problems) < 100 {
		r.Problems = append(r.Problems, fmt.Sprintf(format, a...))
	}
}

// Verify reads dir's index read-only: every record in its span, each done one's ids
// and mask of one length with a 0/1 mask, and, once nothing is pending, the output file
// holding exactly the done records in sample order.
func Verify(dir string) (VerifyReport, error) {
	rep := VerifyReport{Dir: dir, Problems: []string{}}
	ix, err := openIndex(IndexPath(dir), true)
	if err != nil {
		return rep, err
	}
	defer func() { _ = ix.Close() }() // read only
	m, ok, err := ix.meta()
	if err != nil {
		return rep, err
	}
	if !ok {
		rep.problem("%s has no job definition (killed before its first commit?)", IndexPath(dir))
		return rep, nil
	}
	rep.Conversations, rep.Lines, rep.Lo, rep.Hi = m.Conversations, m.Lines, m.Lo, m.Hi
	var done []outLine
	err = ix.each(func(s int, r *Record) error {
		if s < m.Lo || s >= m.Hi {
			rep.problem("sample %d (line %d) is outside the span %d..%d", s, r.Line, m.Lo, m.Hi)
			return nil
		}
		switch r.State {
		case Done:
			rep.Done++
			if len(r.InputIDs) != len(r.LossMask) || len(r.InputIDs) == 0 {
				rep.problem("sample %d (line %d): %d input ids, %d mask values", s, r.Line, len(r.InputIDs), len(r.LossMask))
			}
			if slices.ContainsFunc(r.LossMask, func(v int64) bool { return v != 0 && v != 1 }) {
				rep.problem("sample %d (line %d): a mask value other than 0 or 1", s, r.Line)
			}
			id := r.ID
			if id == "" {
				id = "line-" + strconv.Itoa(r.Line)
			}
			done = append(done, outLine{ID: id, InputIDs: r.InputIDs, LossMask: r.LossMask})
		case Dropped:
			rep.Dropped++
		case Failed:
			rep.Failed++
		default:
			rep.problem("sample %d: unknown state %q", s, r.State)
		}
		return nil
	})
	if err != nil {
		return rep, err
	}
	rep.Pending = m.Hi - m.Lo - rep.Done - rep.Dropped - rep.Failed
	if rep.Pending > 0 || m.Output == "" {
		return rep, nil
	}
	f, err := openRegular(m.Output)
	if err != nil {
		rep.problem("output %s: %v", m.Output, err)
		return rep, nil
	}
	defer func() { _ = f.Close() }() // read only
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<30)
	for sc.Scan() {
		k := rep.OutputLines
		rep.OutputLines++
		var l outLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			rep.problem("output %s line %d does not parse: %v", m.Output, k+1, err)
			continue
		}
		if k >= len(done) {
			continue
		}
		if w := done[k]; l.ID != w.ID || !slices.Equal(l.InputIDs, w.InputIDs) || !slices.Equal(l.LossMask, w.LossMask) {
			rep.problem("output %s line %d (id %q) is not the index's conversation %q", m.Output, k+1, l.ID, w.ID)
		}
	}
	if err := sc.Err(); err != nil {
		rep.problem("read output %s: %v", m.Output, err)
	}
	if rep.OutputLines != len(done) {
		rep.problem("output %s has %d lines, the index %d done conversations", m.Output, rep.OutputLines, len(done))
	}
	return rep, nil
}

// CheckPlan checks that shard reports tile one conversation file: the same file, spans
// that meet end to end from line 0 to its last, each shard with nothing pending.
func CheckPlan(reps []VerifyReport) []string {
	var p []string
	next := 0
	for i, r := range reps {
		if r.Conversations != reps[0].Conversations || r.Lines != reps[0].Lines {
			p = append(p, fmt.Sprintf("shard %d generated from another conversation file (sha256 %.12s…, %d lines) than shard 0", i, r.Conversations, r.Lines))
		}
		if r.Lo != next {
			p = append(p, fmt.Sprintf("shard %d spans lines %d..%d, the previous shard ends at %d", i, r.Lo, r.Hi, next))
		}
		next = r.Hi
		if r.Pending > 0 {
			p = append(p, fmt.Sprintf("shard %d has %d conversations pending", i, r.Pending))
		}
	}
	if len(reps) > 0 && next != reps[0].Lines {
		p = append(p, fmt.Sprintf("the shards end at line %d of %d", next, reps[0].Lines))
	}
	return p
}
