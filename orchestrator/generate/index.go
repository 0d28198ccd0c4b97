package generate

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"

	"github.com/extract-dev/extract/internal/atomicfile"
	"github.com/extract-dev/extract/internal/conversation"
)

// The index's buckets: the job's definition, one record per finished conversation (by
// its 0-based line), and the server deaths each conversation was in flight at.
var (
	bucketMeta    = []byte("meta")
	bucketRecords = []byte("records")
	bucketDeaths  = []byte("deaths")
	keyMeta       = []byte("meta")
)

// State is how a conversation finished.
type State string

// The finished states: done is in the output; dropped (a validation rule) and failed
// (the server, the template, the input) are listed with their reason.
const (
	Done    State = "done"
	Dropped State = "dropped"
	Failed  State = "failed"
)

// Record is one finished conversation as the index keeps it.
type Record struct {
	State    State                  `json:"state"`
	Line     int                    `json:"line"` // 1-based
	ID       string                 `json:"id,omitempty"`
	Messages []conversation.Message `json:"messages,omitempty"`
	InputIDs []int64                `json:"input_ids,omitempty"`
	LossMask []int64                `json:"loss_mask,omitempty"`
	Tools    []json.RawMessage      `json:"tools,omitempty"`
	// Generated is the ids the server generated, over all turns; Requests the sends.
	Generated int    `json:"generated"`
	Requests  int    `json:"requests"`
	Flags     []Flag `json:"flags,omitempty"`
	Reason    string `json:"reason,omitempty"`
}

// Meta is the job's definition: a resume against another is refused naming the part
// that changed.
type Meta struct {
	Conversations string    `json:"conversations_sha256"`
	Source        string    `json:"source"`
	Lines         int       `json:"lines"`
	Renderer      string    `json:"renderer"`
	Options       string    `json:"options"` // digest of the sampling and validation keys
	OptionsText   []string  `json:"options_text"`
	Lo            int       `json:"lo"`
	Hi            int       `json:"hi"`
	Created       time.Time `json:"created"`
	// Output is the file last assembled from this index (only that name is replaced).
	Output string `json:"output,omitempty"`
}

// index is the bbolt file in state_dir/generate.
type index struct {
	db *bolt.DB
}

func openIndex(path string, readOnly bool) (*index, error) {
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 2 * time.Second, ReadOnly: readOnly})
	if err != nil {
		return nil, fmt.Errorf("open generate index %s: %w", path, err)
	}
	if !readOnly {
		err = db.Update(func(tx *bolt.Tx) error {
			for _, b := range [][]byte{bucketMeta, bucketRecords, bucketDeaths} {
				if _, err := tx.CreateBucketIfNotExists(b); err != nil {
					return err
				}
			}
			return nil
		})
		if err == nil {
			// bbolt fsyncs its file, never its directory: a power cut could lose the name.
			err = atomicfile.SyncDir(parentDir(path))
		}
		if err != nil {
			_ = db.Close() // the init failed: that error is the one to report
			return nil, fmt.Errorf("init generate index %s: %w", path, err)
		}
	}
	return &index{db: db}, nil
}

func (ix *index) Close() error { return ix.db.Close() }

func key(sample int) []byte { return binary.BigEndian.AppendUint64(nil, uint64(sample)) }

func (ix *index) meta() (Meta, bool, error) {
	var m Meta
	var ok bool
	err := ix.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketMeta)
		if b == nil {
			return nil
		}
		v := b.Get(keyMeta)
		if v == nil {
			return nil
		}
		ok = true
		return json.Unmarshal(v, &m)
	})
	return m, ok, err
}

func (ix *index) setMeta(m Meta) error {
	v, err := json.Marshal(m)
	if err != nil {
		return err
	}
	return ix.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bucketMeta).Put(keyMeta, v) })
}

// reset forgets every record (--fresh) under the new definition m.
func (ix *index) reset(m Meta) error {
	v, err := json.Marshal(m)
	if err != nil {
		return err
	}
	return ix.db.Update(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bucketRecords, bucketDeaths} {
			if err := tx.DeleteBucket(b); err != nil && !errors.Is(err, bolterrors.ErrBucketNotFound) {
				return err
			}
			if _, err := tx.CreateBucket(b); err != nil {
				return err
			}
		}
		return tx.Bucket(bucketMeta).Put(keyMeta, v)
	})
}

// commit records finished conversations in one transaction (two fdatasyncs for the
// batch): each counts only once this returns nil.
func (ix *index) commit(recs map[int]*Record) error {
	return ix.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketRecords)
		for s, r := range recs {
			v, err := json.Marshal(r)
			if err != nil {
				return fmt.Errorf("sample %d (line %d): %w", s, r.Line, err)
			}
			if err := b.Put(key(s), v); err != nil {
				return err
			}
		}
		return nil
	})
}

// addDeath counts a server death with sample in flight and returns the new count.
func (ix *index) addDeath(sample int) (int, error) {
	var n uint32
	err := ix.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketDeaths)
		if v := b.Get(key(sample)); len(v) == 4 {
			n = binary.BigEndian.Uint32(v)
		}
		n++
		return b.Put(key(sample), binary.BigEndian.AppendUint32(nil, n))
	})
	return int(n), err
}

// deaths is every sample's count of deaths.
func (ix *index) deaths() (map[int]int, error) {
	out := map[int]int{}
	err := ix.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketDeaths).ForEach(func(k, v []byte) error {
			if len(k) == 8 && len(v) == 4 {
				out[int(binary.BigEndian.Uint64(k))] = int(binary.BigEndian.Uint32(v))
			}
			return nil
		})
	})
	return out, err
}

// finished is the set of samples with a record, by state.
func (ix *index) finished() (map[int]State, error) {
	out := map[int]State{}
	err := ix.each(func(s int, r *Record) error {
		out[s] = r.State
		return nil
	})
	return out, err
}

// each visits the records in sample order.
func (ix *index) each(fn func(sample int, r *Record) error) error {
	return ix.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketRecords)
		if b == nil {
			return nil
		}
		return b.ForEach(func(k, v []byte) error {
			if len(k) != 8 {
				return fmt.Errorf("generate index: a record key of %d bytes", len(k))
			}
			var r Record
			if err := json.Unmarshal(v, &r); err != nil {
				return fmt.Errorf("generate index: record of sample %d: %w", binary.BigEndian.Uint64(k), err)
			}
			return fn(int(binary.BigEndian.Uint64(k)), &r)
		})
	})
}
