package orchestrator

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
)

// ErrBadDataset marks a dataset the user must fix (exit 2).
var ErrBadDataset = errors.New("bad dataset")

// Dataset is a validated JSONL dataset. It keeps each line's offset, not its content,
// so memory stays small however long the prompts are; a sample is re-read when sent.
type Dataset struct {
	Path        string
	Fingerprint string // sha256 of the file's bytes
	Size        int64
	lines       []lineRef
	f           *os.File // kept open for Sample; ReadAt is safe from many goroutines
}

type lineRef struct {
	off    int64
	len    int32
	tokens int32 // exact for input_ids; an upper bound (bytes) for text
	text   bool
}

// Sample is one dataset line, decoded.
type Sample struct {
	Index    int
	InputIDs []int64 // nil for a text sample
	LossMask []int64 // nil: all ones
	Text     string
}

type rawSample struct {
	InputIDs *[]int64 `json:"input_ids"`
	LossMask *[]int64 `json:"loss_mask"`
	Text     *string  `json:"text"`
}

// OpenDataset reads and checks every line before any GPU time is spent. An error names
// the line (1-based, as editors show it) and the sample index (0-based).
func OpenDataset(path string) (*Dataset, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadDataset, err)
	}
	d := &Dataset{Path: path, f: f}
	if err := d.index(); err != nil {
		f.Close()
		return nil, err
	}
	return d, nil
}

func (d *Dataset) index() error {
	path, f := d.Path, d.f
	h := sha256.New()
	r := bufio.NewReaderSize(io.TeeReader(f, h), 1<<20)
	var off int64
	for {
		line, err := r.ReadBytes('\n')
		if len(line) > 0 {
			n := len(d.lines)
			trimmed := bytes.TrimRight(line, "\r\n")
			s, perr := decodeLine(trimmed, n)
			if perr != nil {
				return fmt.Errorf("%w: %s line %d (sample %d): %v", ErrBadDataset, path, n+1, n, perr)
			}
			ref := lineRef{off: off, len: int32(len(trimmed)), text: s.InputIDs == nil}
			if ref.text {
				ref.tokens = int32(len(s.Text))
			} else {
				ref.tokens = int32(len(s.InputIDs))
			}
			d.lines = append(d.lines, ref)
			off += int64(len(line))
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("read dataset %s: %w", path, err)
		}
	}
	if len(d.lines) == 0 {
		return fmt.Errorf("%w: %s has no samples", ErrBadDataset, path)
	}
	d.Size = off
	d.Fingerprint = hex.EncodeToString(h.Sum(nil))
	return nil
}

func decodeLine(line []byte, index int) (Sample, error) {
	var raw rawSample
	// Other fields (ids, conversations, sources) are common in datasets and ignored.
	dec := json.NewDecoder(bytes.NewReader(line))
	if len(bytes.TrimSpace(line)) == 0 {
		return Sample{}, errors.New("empty line (every line must be one JSON sample)")
	}
	if err := dec.Decode(&raw); err != nil {
		return Sample{}, fmt.Errorf("invalid JSON: %v", err)
	}
	if dec.More() {
		return Sample{}, errors.New("more than one JSON value on the line")
	}
	s := Sample{Index: index}
	switch {
	case raw.InputIDs != nil && raw.Text != nil:
		return s, errors.New(`has both "input_ids" and "text"; give one`)
	case raw.InputIDs != nil:
		if len(*raw.InputIDs) == 0 {
			return s, errors.New(`"input_ids" is empty`)
		}
		for i, id := range *raw.InputIDs {
			if id < 0 {
				return s, fmt.Errorf(`"input_ids"[%d] = %d is negative`, i, id)
			}
		}
		s.InputIDs = *raw.InputIDs
	case raw.Text != nil:
		if *raw.Text == "" {
			return s, errors.New(`"text" is empty`)
		}
		if raw.LossMask != nil {
			return s, errors.New(`"loss_mask" needs "input_ids" (with "text" the server tokenizes, so the mask is all 1)`)
		}
		s.Text = *raw.Text
	default:
		return s, errors.New(`missing "input_ids" (list of int) or "text"`)
	}
	if raw.LossMask != nil {
		if len(*raw.LossMask) != len(s.InputIDs) {
			return s, fmt.Errorf(`"loss_mask" has %d values, "input_ids" has %d`, len(*raw.LossMask), len(s.InputIDs))
		}
		for i, m := range *raw.LossMask {
			if m != 0 && m != 1 {
				return s, fmt.Errorf(`"loss_mask"[%d] = %d, want 0 or 1`, i, m)
			}
		}
		s.LossMask = *raw.LossMask
	}
	return s, nil
}

// Len is the number of samples.
func (d *Dataset) Len() int { return len(d.lines) }

// Tokens is the sample's token count (an upper bound for a text sample).
func (d *Dataset) Tokens(i int) int { return int(d.lines[i].tokens) }

// TotalTokens sums Tokens over the samples where include is true (all if nil).
func (d *Dataset) TotalTokens(include func(int) bool) int64 {
	var n int64
	for i, l := range d.lines {
		if include == nil || include(i) {
			n += int64(l.tokens)
		}
	}
	return n
}

// Sample reads sample i back from the file. The file must not change under a running
// job; if it did, the error says so.
func (d *Dataset) Sample(i int) (Sample, error) {
	l := d.lines[i]
	b := make([]byte, l.len)
	if _, err := d.f.ReadAt(b, l.off); err != nil {
		return Sample{}, fmt.Errorf("read dataset %s sample %d: %w", d.Path, i, err)
	}
	s, err := decodeLine(b, i)
	if err != nil {
		return Sample{}, fmt.Errorf("dataset %s changed under the job at sample %d: %v", d.Path, i, err)
	}
	return s, nil
}

// Close closes the dataset file.
func (d *Dataset) Close() error { return d.f.Close() }
