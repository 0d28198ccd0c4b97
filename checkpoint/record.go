package checkpoint

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	bolt "go.etcd.io/bbolt"
)

// State is where a sample stands.
type State uint8

// The states of a sample. A sample with no record is pending.
const (
	StatePending State = iota
	StateInflight
	StateDone
	StateFailed
)

func (s State) String() string {
	switch s {
	case StatePending:
		return "pending"
	case StateInflight:
		return "inflight"
	case StateDone:
		return "done"
	case StateFailed:
		return "failed"
	}
	return fmt.Sprintf("state(%d)", uint8(s))
}

// Record is one sample's entry in the index.
type Record struct {
	Sample  int
	State   State
	Attempt int
	RID     string
	Bytes   int64
	CRC32C  uint32
	Tokens  int
	Error   string
	Updated time.Time
	// SourceID is the sample's own id in the data it came from (a conversation's id),
	// "" without one. A record keeps it once it is known (put).
	SourceID string
	// Imported marks a done sample whose file another tool wrote and extract import
	// brought in. It is stored as the rid prefix importPrefix (no layout change: an
	// older build reads the record as done with an odd rid).
	Imported bool
}

// importPrefix marks an imported record's rid in the stored record.
const importPrefix = "import:"

// Records are a fixed binary layout so that Load decodes a million of them by reading
// two fields at known offsets:
//
//	0   version (recordVersion)
//	1   state
//	2   attempt   uint32
//	6   bytes     uint64
//	14  crc32c    uint32
//	18  tokens    uint64
//	26  updated   int64 unix nanoseconds, 0 for none
//	34  rid len   uint16, then the rid
//	    error len uint16, then the error
//	    source len uint16, then the source id; absent when it is "" (so a record
//	    without one is as before, and an older build, which stops after the error,
//	    reads one with it)
const (
	recordVersion = 1
	recordFixed   = 34
	// maxErrorLen keeps a server's multi-kilobyte traceback out of every record.
	maxErrorLen = 1024
	// maxSourceIDLen bounds an id the dataset hands over: ids are short, a line is not.
	maxSourceIDLen = 512
)

func encodeRecord(r Record) []byte {
	msg := truncateUTF8(r.Error, maxErrorLen)
	rid := r.RID
	if r.Imported {
		rid = importPrefix + rid
	}
	rid = truncateUTF8(rid, 1<<16-1)
	src := truncateUTF8(r.SourceID, maxSourceIDLen)
	b := make([]byte, recordFixed, recordFixed+6+len(rid)+len(msg)+len(src))
	b[0] = recordVersion
	b[1] = byte(r.State)
	binary.BigEndian.PutUint32(b[2:], uint32(r.Attempt))
	binary.BigEndian.PutUint64(b[6:], uint64(r.Bytes))
	binary.BigEndian.PutUint32(b[14:], r.CRC32C)
	binary.BigEndian.PutUint64(b[18:], uint64(r.Tokens))
	if !r.Updated.IsZero() {
		binary.BigEndian.PutUint64(b[26:], uint64(r.Updated.UnixNano()))
	}
	b = binary.BigEndian.AppendUint16(b, uint16(len(rid)))
	b = append(b, rid...)
	b = binary.BigEndian.AppendUint16(b, uint16(len(msg)))
	b = append(b, msg...)
	if src != "" {
		b = binary.BigEndian.AppendUint16(b, uint16(len(src)))
		b = append(b, src...)
	}
	return b
}

func decodeRecord(sample int, b []byte) (Record, error) {
	if len(b) < recordFixed+4 || b[0] != recordVersion || State(b[1]) > StateFailed {
		return Record{}, fmt.Errorf("sample %d: corrupt or unknown record (%d bytes)", sample, len(b))
	}
	r := Record{
		Sample:  sample,
		State:   State(b[1]),
		Attempt: int(binary.BigEndian.Uint32(b[2:])),
		Bytes:   int64(binary.BigEndian.Uint64(b[6:])),
		CRC32C:  binary.BigEndian.Uint32(b[14:]),
		Tokens:  int(binary.BigEndian.Uint64(b[18:])),
	}
	if ns := int64(binary.BigEndian.Uint64(b[26:])); ns != 0 {
		r.Updated = time.Unix(0, ns)
	}
	rest := b[recordFixed:]
	fields := []*string{&r.RID, &r.Error, &r.SourceID}
	for i, dst := range fields {
		if i == 2 && len(rest) == 0 {
			break // no source id
		}
		if len(rest) < 2 || len(rest) < 2+int(binary.BigEndian.Uint16(rest)) {
			return Record{}, fmt.Errorf("sample %d: corrupt record: string field overruns %d bytes", sample, len(b))
		}
		n := int(binary.BigEndian.Uint16(rest))
		*dst = string(rest[2 : 2+n])
		rest = rest[2+n:]
	}
	r.RID, r.Imported = strings.CutPrefix(r.RID, importPrefix)
	return r, nil
}

func truncateUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

func sampleKey(sample int) []byte { return u64(uint64(sample)) }

func u64(v uint64) []byte {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], v)
	return b[:]
}

// Get returns sample's record, and false when it has none (it is pending).
func (ix *Index) Get(sample int) (Record, bool, error) {
	var r Record
	var ok bool
	err := ix.view(func(tx *bolt.Tx) error {
		var err error
		r, ok, err = getRecord(tx, sample)
		return err
	})
	if err != nil {
		return Record{}, false, err
	}
	return r, ok, nil
}

func getRecord(tx *bolt.Tx, sample int) (Record, bool, error) {
	b := tx.Bucket(bucketSamples)
	if b == nil || sample < 0 {
		return Record{Sample: sample}, false, nil
	}
	v := b.Get(sampleKey(sample))
	if v == nil {
		return Record{Sample: sample}, false, nil
	}
	r, err := decodeRecord(sample, v)
	return r, err == nil, err
}

// Progress is every sample's state and attempt, indexed by sample.
type Progress struct {
	State   []State
	Attempt []uint32
}

// Load reads the state and attempt of all total samples in one cursor pass.
func (ix *Index) Load(total int) (*Progress, error) {
	if total < 0 {
		return nil, fmt.Errorf("index %s: load: total %d is negative", ix.path, total)
	}
	p := &Progress{State: make([]State, total), Attempt: make([]uint32, total)}
	err := ix.view(func(tx *bolt.Tx) error {
		return eachRecord(tx, func(s uint64, v []byte) error {
			if s >= uint64(total) {
				return fmt.Errorf("sample %d: record beyond the dataset's %d samples", s, total)
			}
			if len(v) < recordFixed || v[0] != recordVersion || State(v[1]) > StateFailed {
				return fmt.Errorf("sample %d: corrupt or unknown record (%d bytes)", s, len(v))
			}
			p.State[s] = State(v[1])
			p.Attempt[s] = binary.BigEndian.Uint32(v[2:])
			return nil
		})
	})
	if err != nil {
		return nil, err
	}
	return p, nil
}

// eachRecord calls fn with every sample record, in sample order, undecoded.
func eachRecord(tx *bolt.Tx, fn func(sample uint64, v []byte) error) error {
	b := tx.Bucket(bucketSamples)
	if b == nil {
		return nil
	}
	c := b.Cursor()
	for k, v := c.First(); k != nil; k, v = c.Next() {
		if len(k) != 8 {
			return fmt.Errorf("sample key %x is not 8 bytes", k)
		}
		if err := fn(binary.BigEndian.Uint64(k), v); err != nil {
			return err
		}
	}
	return nil
}

// WithSourceID is every record whose source id is id, in sample order: a dataset may hold
// one conversation more than once. One pass over the records.
func (ix *Index) WithSourceID(id string) ([]Record, error) {
	var out []Record
	id = truncateUTF8(id, maxSourceIDLen) // as the record keeps it
	err := ix.view(func(tx *bolt.Tx) error {
		return eachRecord(tx, func(s uint64, v []byte) error {
			// The source id is the record's last field: a cheap test before decoding.
			if id == "" || !bytes.HasSuffix(v, []byte(id)) {
				return nil
			}
			r, err := decodeRecord(int(s), v)
			if err != nil {
				return err
			}
			if r.SourceID == id {
				out = append(out, r)
			}
			return nil
		})
	})
	return out, err
}
