package checkpoint

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"time"

	bolt "go.etcd.io/bbolt"
)

// InspectOptions controls InspectIndex.
type InspectOptions struct {
	// OutputDir is where the done samples' files are looked for.
	OutputDir string
	// StatSample bounds the done files that are stat'ed, spread evenly over the done
	// samples; 0 means 200.
	StatSample int
	// Timeout bounds the wait for the shared lock; 0 means 1s.
	Timeout time.Duration
}

// IndexFacts is what an index says about its job, read in one short read-only open,
// and how a sample of its done files stands on disk.
type IndexFacts struct {
	Path string
	// Exists is false when there is no file at Path (then nothing else is set).
	Exists bool
	// Initialised is false for an index no job has been written to yet.
	Initialised   bool
	SchemaVersion int
	Meta          Meta
	Counters      Counters
	// Progress is every sample's state and attempt, Meta.Total of them.
	Progress *Progress
	// Done lists the done samples in order.
	Done []int
	// Checked done files were stat'ed; Problems says, one line each, which of them are
	// missing or not the size the index recorded.
	Checked  int
	Problems []string
}

// InspectIndex reads what doctor reports about the index at path: schema, meta,
// counters, every sample's state, and the records of a sample of the done files. It
// closes the index before it stats those files, so that a slow disk never holds the
// index lock against a run that starts meanwhile. A missing file is Exists false and
// no error; a held index is ErrLocked; a damaged one ErrDamaged. On an error the facts
// read until then are returned with it.
func InspectIndex(path string, opt InspectOptions) (IndexFacts, error) {
	f := IndexFacts{Path: path}
	if _, err := os.Lstat(path); errors.Is(err, os.ErrNotExist) {
		return f, nil
	} else if err != nil {
		return f, fmt.Errorf("index %s: %w", path, err)
	}
	f.Exists = true
	n := opt.StatSample
	if n <= 0 {
		n = 200
	}
	ix, err := Open(path, OpenOptions{ReadOnly: true, Timeout: opt.Timeout})
	if err != nil {
		return f, err
	}
	sampled, err := f.read(ix, n)
	meta, _, merr := ix.Meta()
	if err == nil {
		err = merr
	}
	if cerr := ix.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return f, err
	}
	// The lock is released: now the slow part.
	l, err := ParseLayout(opt.OutputDir, meta.OutputFormat)
	if err != nil {
		return f, fmt.Errorf("index %s: %w", path, err)
	}
	for _, r := range sampled {
		f.Checked++
		p := l.Path(r.Sample)
		st, err := os.Stat(p)
		switch {
		case errors.Is(err, os.ErrNotExist):
			f.Problems = append(f.Problems, fmt.Sprintf("sample %d: %s missing", r.Sample, p))
		case err != nil:
			f.Problems = append(f.Problems, fmt.Sprintf("sample %d: %v", r.Sample, err))
		case st.Size() != r.Bytes:
			f.Problems = append(f.Problems, fmt.Sprintf("sample %d: %s is %d bytes, the index recorded %d", r.Sample, p, st.Size(), r.Bytes))
		}
	}
	return f, nil
}

// read fills f from the open index and returns the records of up to n done samples,
// spread evenly over them.
func (f *IndexFacts) read(ix *Index, n int) ([]Record, error) {
	err := ix.view(func(tx *bolt.Tx) error {
		if b := tx.Bucket(bucketMeta); b != nil {
			if v := b.Get(keySchemaVersion); len(v) == 8 {
				f.SchemaVersion = int(binary.BigEndian.Uint64(v))
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	m, ok, err := ix.Meta()
	if err != nil || !ok {
		return nil, err
	}
	f.Initialised, f.Meta = true, m
	if f.Counters, err = ix.Counters(); err != nil {
		return nil, err
	}
	if f.Progress, err = ix.Load(m.Total); err != nil {
		return nil, err
	}
	for s, st := range f.Progress.State {
		if st == StateDone {
			f.Done = append(f.Done, s)
		}
	}
	k := min(len(f.Done), n)
	sampled := make([]Record, 0, k)
	err = ix.view(func(tx *bolt.Tx) error {
		for i := range k {
			r, found, err := getRecord(tx, f.Done[i*len(f.Done)/k])
			if err != nil {
				return err
			}
			if found {
				sampled = append(sampled, r)
			}
		}
		return nil
	})
	return sampled, err
}
