package orchestrator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/extract-dev/extract/checkpoint"
	"github.com/extract-dev/extract/configs"
)

// SampleStatus is one sample as `extract status --sample N` (or --source-id ID) shows
// it: where it stands, its output file, and the id of the conversation it came from, so
// that a file can be traced back to its conversation and a conversation to its file.
type SampleStatus struct {
	Sample   int        `json:"sample"`
	State    string     `json:"state"` // pending | inflight | done | failed
	Attempt  int        `json:"attempt"`
	RID      string     `json:"rid,omitempty"`
	SourceID string     `json:"source_id,omitempty"` // the conversation's own id, once the sample was sent
	File     string     `json:"file,omitempty"`      // done: the output file
	Bytes    int64      `json:"bytes,omitempty"`
	Tokens   int        `json:"tokens,omitempty"`
	CRC32C   string     `json:"crc32c,omitempty"`
	Imported bool       `json:"imported,omitempty"`
	Error    string     `json:"error,omitempty"`
	Updated  *time.Time `json:"updated,omitempty"`
	Source   string     `json:"source"` // live | index: who answered
}

// SampleQuery names the samples asked for: one by index, or every one with a source id.
type SampleQuery struct {
	Sample   int // -1: by SourceID
	SourceID string
}

// QuerySamples answers status --sample and --source-id: from the running process when
// a run holds the lock (it has the index open), else from the index read-only. An
// unknown source id, or a sample outside the job, is ErrRefused.
func QuerySamples(ctx context.Context, cfg *configs.Config, q SampleQuery) ([]SampleStatus, error) {
	h, held := LockHolder(cfg.StateDir)
	if held && h.IsRun() {
		return querySamplesLive(ctx, cfg.StateDir, q, h.PID)
	}
	ix, _, err := openIndexToQuery(cfg)
	if errors.Is(err, checkpoint.ErrLocked) && held {
		// verify --repair or import writes it: ask again once it ends (exit 75).
		return nil, fmt.Errorf("%w: %s holds the index: %v", ErrTemporary, h, err)
	}
	if err != nil {
		return nil, err
	}
	defer func() { _ = ix.Close() }()
	out, err := lookupSamples(ix, outputLayout(cfg), q)
	for i := range out {
		out[i].Source = "index"
	}
	return out, err
}

// lookupSamples reads the samples q names from ix.
func lookupSamples(ix *checkpoint.Index, l checkpoint.Layout, q SampleQuery) ([]SampleStatus, error) {
	if q.Sample < 0 {
		rs, err := ix.WithSourceID(q.SourceID)
		if err != nil {
			return nil, err
		}
		if len(rs) == 0 {
			return nil, fmt.Errorf("%w: no sample with source id %q in the index (a sample's id is recorded when it is first sent)", ErrRefused, q.SourceID)
		}
		out := make([]SampleStatus, len(rs))
		for i, r := range rs {
			out[i] = sampleStatusOf(r, l)
		}
		return out, nil
	}
	meta, ok, err := ix.Meta()
	if err != nil {
		return nil, err
	}
	if lo, hi := ShardRange(meta.Total, meta.ShardIndex, meta.ShardCount); !ok || q.Sample < lo || q.Sample >= hi {
		return nil, fmt.Errorf("%w: sample %d is not in this job (samples %d to %d)", ErrRefused, q.Sample, lo, hi-1)
	}
	r, _, err := ix.Get(q.Sample)
	if err != nil {
		return nil, err
	}
	return []SampleStatus{sampleStatusOf(r, l)}, nil
}

func sampleStatusOf(r checkpoint.Record, l checkpoint.Layout) SampleStatus {
	s := SampleStatus{Sample: r.Sample, State: r.State.String(), Attempt: r.Attempt, RID: r.RID, SourceID: r.SourceID,
		Imported: r.Imported, Error: r.Error}
	if !r.Updated.IsZero() {
		u := r.Updated.UTC()
		s.Updated = &u
	}
	if r.State == checkpoint.StateDone {
		s.File, s.Bytes, s.Tokens, s.CRC32C = l.Path(r.Sample), r.Bytes, r.Tokens, fmt.Sprintf("%08x", r.CRC32C)
	}
	return s
}

// serveSamples adds /sample?n=N and /sample?source_id=ID to the status endpoint. A
// source id is one read transaction over every record: one at a time, so that queries in
// a loop cannot hold off the run's commits (a growing file waits for its readers).
func serveSamples(s *statusServer, ix *checkpoint.Index, l checkpoint.Layout) {
	scan := make(chan struct{}, 1)
	s.mux.HandleFunc("/sample", func(w http.ResponseWriter, r *http.Request) {
		q, err := parseSampleQuery(r.URL.Query())
		var out []SampleStatus
		if err == nil && q.Sample < 0 {
			select {
			case scan <- struct{}{}:
				out, err = lookupSamples(ix, l, q)
				<-scan
			case <-r.Context().Done():
				return
			}
		} else if err == nil {
			out, err = lookupSamples(ix, l, q)
		}
		w.Header().Set("Content-Type", "application/json")
		if err != nil {
			code, msg := http.StatusInternalServerError, err.Error()
			if errors.Is(err, ErrRefused) {
				code, msg = http.StatusNotFound, strings.TrimPrefix(msg, ErrRefused.Error()+": ")
			}
			w.WriteHeader(code)
			_ = json.NewEncoder(w).Encode(map[string]string{"error": msg})
			return
		}
		for i := range out {
			out[i].Source = "live"
		}
		_ = json.NewEncoder(w).Encode(out) // a client gone mid-answer is no fault of ours
	})
}

func parseSampleQuery(v url.Values) (SampleQuery, error) {
	if id := v.Get("source_id"); id != "" {
		return SampleQuery{Sample: -1, SourceID: id}, nil
	}
	n, err := strconv.Atoi(v.Get("n"))
	if err != nil || n < 0 {
		return SampleQuery{}, fmt.Errorf("%w: /sample wants n=<sample> or source_id=<id>", ErrRefused)
	}
	return SampleQuery{Sample: n}, nil
}

func querySamplesLive(ctx context.Context, stateDir string, q SampleQuery, pid int) ([]SampleStatus, error) {
	ri, err := readRunInfo(stateDir)
	// run.json outlives its run: an address of an earlier one may be another's by now.
	if err != nil || ri.StatusAddr == "" || ri.PID != pid {
		return nil, fmt.Errorf("%w: the run (pid %d) holds the index and is not answering yet; try again in a moment", ErrTemporary, pid)
	}
	v := url.Values{}
	if q.Sample < 0 {
		v.Set("source_id", q.SourceID)
	} else {
		v.Set("n", strconv.Itoa(q.Sample))
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+ri.StatusAddr+"/sample?"+v.Encode(), nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%w: the run (pid %d) holds the index and did not answer: %v", ErrTemporary, pid, err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		var e struct {
			Error string `json:"error"`
		}
		switch {
		case json.Unmarshal(b, &e) != nil || e.Error == "":
			// Not our handler's answer: a run of an older build, or one still starting.
			return nil, fmt.Errorf("%w: the run (pid %d) does not answer /sample (%s; a run of an older extract?): try again, or once it has stopped", ErrTemporary, pid, resp.Status)
		case resp.StatusCode == http.StatusNotFound:
			return nil, fmt.Errorf("%w: %s", ErrRefused, e.Error)
		}
		return nil, fmt.Errorf("the run (pid %d) answered %s: %s", pid, resp.Status, e.Error)
	}
	var out []SampleStatus
	return out, json.Unmarshal(b, &out)
}
