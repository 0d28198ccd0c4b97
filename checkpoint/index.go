package checkpoint

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"

	"github.com/extract-dev/extract/internal/atomicfile"
)

// SchemaVersion is the index layout this build reads and writes.
const SchemaVersion = 1

// ErrDamaged means the index file is not a readable bbolt file: truncated, meta pages
// invalid, or pages that fault when read. The error names the file and what is wrong;
// MoveAside puts such a file aside so that the index can be rebuilt from the outputs.
var ErrDamaged = errors.New("index is damaged")

// ErrLocked means another process holds the index; Open waited OpenOptions.Timeout.
var ErrLocked = errors.New("index is locked by another process")

var (
	bucketMeta     = []byte("meta")
	bucketSamples  = []byte("samples")
	bucketCounters = []byte("counters")

	keySchemaVersion      = []byte("schema_version")
	keyDatasetFingerprint = []byte("dataset_fingerprint")
	keyDatasetPath        = []byte("dataset_path")
	keyConfigFingerprint  = []byte("config_fingerprint")
	keyTotal              = []byte("total")
	keyCreated            = []byte("created")
	keyAttemptBase        = []byte("attempt_base")
	keyOutputFormat       = []byte("output_format")
	keyShard              = []byte("shard")

	keyDone   = []byte("done")
	keyFailed = []byte("failed")
	keyBytes  = []byte("bytes")
	keyTokens = []byte("tokens")
	// keyImported counts imported done samples; absent in an index from before import (0).
	keyImported = []byte("imported")
)

// OpenOptions controls Open.
type OpenOptions struct {
	// ReadOnly takes a shared lock, so several readers can open the index at once
	// but none while a writer holds it.
	ReadOnly bool
	// Timeout bounds the wait for the lock; 0 means 1s. Open never waits forever.
	Timeout time.Duration
}

// Index is the resume index of one job.
type Index struct {
	db   *bolt.DB
	path string

	// Group commit of CommitDone: callers queue in pending; one of them, the leader,
	// commits everything queued in one txn, then hands the lead to the first caller that
	// queued meanwhile. No caller waits for a timer, and no caller commits more than one
	// batch.
	commitMu   sync.Mutex
	pending    []*commitReq
	committing bool
}

type commitReq struct {
	// apply writes the caller's change into the shared txn.
	apply func(tx *bolt.Tx) error
	err   error
	lead  bool
	done  chan struct{}
}

// Open opens or, unless read-only, creates the index at path.
func Open(path string, opt OpenOptions) (*Index, error) {
	timeout := opt.Timeout
	if timeout <= 0 {
		timeout = time.Second
	}
	mode := "read-write"
	if opt.ReadOnly {
		mode = "read-only"
	}
	if err := checkFile(path, opt.ReadOnly); err != nil {
		return nil, err
	}
	var db *bolt.DB
	err := guard(path, func() error {
		var err error
		db, err = bolt.Open(path, 0o600, &bolt.Options{Timeout: timeout, ReadOnly: opt.ReadOnly})
		return err
	})
	if errors.Is(err, bolterrors.ErrTimeout) {
		return nil, fmt.Errorf("open index %s %s: waited %s: %w", path, mode, timeout, ErrLocked)
	}
	if errors.Is(err, ErrDamaged) {
		return nil, err
	}
	if errors.Is(err, bolterrors.ErrInvalid) || errors.Is(err, bolterrors.ErrChecksum) || errors.Is(err, bolterrors.ErrVersionMismatch) {
		return nil, fmt.Errorf("open index %s %s: %w: %w", path, mode, ErrDamaged, err)
	}
	if err != nil {
		return nil, fmt.Errorf("open index %s %s: %w", path, mode, err)
	}
	ix := &Index{db: db, path: path}
	if opt.ReadOnly {
		err = ix.view(checkSchema)
	} else {
		err = ix.update(createBuckets)
		// bbolt fsyncs its file but never its directory: without this a power cut can
		// take index.db's name, and every commit with it.
		if err == nil {
			err = atomicfile.SyncDir(filepath.Dir(path))
		}
	}
	if err != nil {
		_ = db.Close()
		if errors.Is(err, ErrDamaged) {
			return nil, err
		}
		return nil, fmt.Errorf("open index %s: %w", path, err)
	}
	return ix, nil
}

// createBuckets makes a new file a schema-1 index and checks an existing one.
func createBuckets(tx *bolt.Tx) error {
	if tx.Bucket(bucketMeta) == nil {
		meta, err := tx.CreateBucket(bucketMeta)
		if err != nil {
			return fmt.Errorf("create bucket meta: %w", err)
		}
		if err := meta.Put(keySchemaVersion, u64(SchemaVersion)); err != nil {
			return fmt.Errorf("write schema_version: %w", err)
		}
	}
	if err := checkSchema(tx); err != nil {
		return err
	}
	for _, name := range [][]byte{bucketSamples, bucketCounters} {
		if _, err := tx.CreateBucketIfNotExists(name); err != nil {
			return fmt.Errorf("create bucket %s: %w", name, err)
		}
	}
	return nil
}

func checkSchema(tx *bolt.Tx) error {
	meta := tx.Bucket(bucketMeta)
	if meta == nil {
		// Only a read-only open of a file no writer has initialised gets here; it reads as empty.
		return nil
	}
	v := meta.Get(keySchemaVersion)
	if len(v) != 8 {
		return errors.New("meta has no valid schema_version; not an extract index?")
	}
	if got := binary.BigEndian.Uint64(v); got != SchemaVersion {
		return fmt.Errorf("schema_version %d is not supported by this build (it reads %d); use the extract release that wrote it", got, SchemaVersion)
	}
	return nil
}

// Close releases the index and its lock.
func (ix *Index) Close() error {
	if err := ix.db.Close(); err != nil {
		return fmt.Errorf("close index %s: %w", ix.path, err)
	}
	return nil
}

// Path is the index file's path.
func (ix *Index) Path() string { return ix.path }

// Meta describes the job an index belongs to.
type Meta struct {
	SchemaVersion      int
	DatasetFingerprint string
	DatasetPath        string
	ConfigFingerprint  string
	Total              int
	Created            time.Time
	// AttemptBase is the highest attempt any sample reached before the last Reset:
	// every attempt begun since is above it, so no rid repeats for the life of the
	// output dir. Init writes it (a rebuilt index may carry one over); Reset raises it;
	// a v1 index without the key reads as 0.
	AttemptBase int
	// OutputFormat is the layout's name ("specforge+gzip"): where verify looks for
	// files. Optional; an index without it is safetensors.
	OutputFormat string
	// ShardIndex of ShardCount is the part of the dataset this index covers when the
	// job is split across nodes; ShardCount 0 (the key absent) is the whole dataset.
	// Total stays the dataset's size.
	ShardIndex, ShardCount int
}

// Meta returns the job's metadata, and false when no job has been initialised.
func (ix *Index) Meta() (Meta, bool, error) {
	var m Meta
	var ok bool
	err := ix.view(func(tx *bolt.Tx) error {
		var err error
		m, ok, err = readMeta(tx)
		return err
	})
	return m, ok, err
}

func readMeta(tx *bolt.Tx) (Meta, bool, error) {
	b := tx.Bucket(bucketMeta)
	if b == nil || b.Get(keyCreated) == nil {
		return Meta{}, false, nil
	}
	created, err := time.Parse(time.RFC3339Nano, string(b.Get(keyCreated)))
	if err != nil {
		return Meta{}, false, fmt.Errorf("meta created: %w", err)
	}
	total := b.Get(keyTotal)
	if len(total) != 8 {
		return Meta{}, false, fmt.Errorf("meta total is %d bytes, want 8", len(total))
	}
	base, err := attemptBase(tx)
	if err != nil {
		return Meta{}, false, err
	}
	si, sn, err := shardPlan(tx)
	if err != nil {
		return Meta{}, false, err
	}
	return Meta{
		ShardIndex:         si,
		ShardCount:         sn,
		AttemptBase:        base,
		SchemaVersion:      int(binary.BigEndian.Uint64(b.Get(keySchemaVersion))),
		DatasetFingerprint: string(b.Get(keyDatasetFingerprint)),
		DatasetPath:        string(b.Get(keyDatasetPath)),
		ConfigFingerprint:  string(b.Get(keyConfigFingerprint)),
		Total:              int(binary.BigEndian.Uint64(total)),
		Created:            created,
		OutputFormat:       string(b.Get(keyOutputFormat)),
	}, true, nil
}

// attemptBase reads meta's attempt_base; an index written before the key existed has
// had no Reset that kept one, so its base is 0.
func attemptBase(tx *bolt.Tx) (int, error) {
	b := tx.Bucket(bucketMeta)
	if b == nil {
		return 0, nil
	}
	v := b.Get(keyAttemptBase)
	switch {
	case v == nil:
		return 0, nil
	case len(v) != 8:
		return 0, fmt.Errorf("meta attempt_base is %d bytes, want 8", len(v))
	}
	n := binary.BigEndian.Uint64(v)
	if n > math.MaxUint32 {
		return 0, fmt.Errorf("meta attempt_base %d exceeds a record's attempt range", n)
	}
	return int(n), nil
}

// shardPlan reads meta's shard: 16 bytes, index then count, big-endian; absent in an
// index of an unsharded job, and in one written before the key existed, which reads as
// unsharded, what it was.
func shardPlan(tx *bolt.Tx) (index, count int, err error) {
	v := tx.Bucket(bucketMeta).Get(keyShard)
	switch {
	case v == nil:
		return 0, 0, nil
	case len(v) != 16:
		return 0, 0, fmt.Errorf("meta shard is %d bytes, want 16", len(v))
	}
	i, n := binary.BigEndian.Uint64(v), binary.BigEndian.Uint64(v[8:])
	if n == 0 || i >= n || n > math.MaxInt32 {
		return 0, 0, fmt.Errorf("meta shard %d of %d is not a shard", i, n)
	}
	return int(i), int(n), nil
}

func writeMeta(tx *bolt.Tx, m Meta) error {
	if m.Total < 0 {
		return fmt.Errorf("total %d is negative", m.Total)
	}
	if m.AttemptBase < 0 || m.AttemptBase > math.MaxUint32 {
		return fmt.Errorf("attempt base %d out of range", m.AttemptBase)
	}
	if m.Created.IsZero() {
		m.Created = time.Now()
	}
	if m.ShardCount < 0 || m.ShardIndex < 0 || m.ShardCount > math.MaxInt32 || (m.ShardCount > 0 && m.ShardIndex >= m.ShardCount) || (m.ShardCount == 0 && m.ShardIndex != 0) {
		return fmt.Errorf("shard %d of %d is not a shard", m.ShardIndex, m.ShardCount)
	}
	b := tx.Bucket(bucketMeta)
	if m.ShardCount == 0 {
		// Unsharded writes no key, so the file is byte-for-byte what older builds write.
		if err := b.Delete(keyShard); err != nil {
			return fmt.Errorf("write meta %s: %w", keyShard, err)
		}
	} else if err := b.Put(keyShard, append(u64(uint64(m.ShardIndex)), u64(uint64(m.ShardCount))...)); err != nil {
		return fmt.Errorf("write meta %s: %w", keyShard, err)
	}
	for _, kv := range []struct{ k, v []byte }{
		{keySchemaVersion, u64(SchemaVersion)},
		{keyDatasetFingerprint, []byte(m.DatasetFingerprint)},
		{keyDatasetPath, []byte(m.DatasetPath)},
		{keyConfigFingerprint, []byte(m.ConfigFingerprint)},
		{keyTotal, u64(uint64(m.Total))},
		{keyCreated, []byte(m.Created.UTC().Format(time.RFC3339Nano))},
		{keyAttemptBase, u64(uint64(m.AttemptBase))},
		{keyOutputFormat, []byte(m.OutputFormat)},
	} {
		if err := b.Put(kv.k, kv.v); err != nil {
			return fmt.Errorf("write meta %s: %w", kv.k, err)
		}
	}
	return nil
}

// Init writes the metadata of a new job. It refuses an index that already has one:
// starting over is Reset's job, so that progress is never dropped by accident.
func (ix *Index) Init(m Meta) error {
	return ix.update(func(tx *bolt.Tx) error {
		old, ok, err := readMeta(tx)
		if err != nil {
			return err
		}
		if ok {
			return fmt.Errorf("already initialised for dataset %s (%s) on %s; use Reset to start over",
				old.DatasetPath, old.DatasetFingerprint, old.Created.Format(time.RFC3339))
		}
		return writeMeta(tx, m)
	})
}

// Reset drops every sample record, zeroes the counters and writes m, in one txn:
// a crash leaves either the old job or the new one, never a mix. It raises the attempt
// base to the highest attempt ever recorded (m.AttemptBase is ignored), so the new job's
// rids never repeat the old one's: a late dump of the old job can never be taken for
// the new one (invariant 7).
func (ix *Index) Reset(m Meta) error {
	return ix.update(func(tx *bolt.Tx) error {
		base, err := attemptBase(tx)
		if err != nil {
			return err
		}
		err = eachRecord(tx, func(s uint64, v []byte) error {
			if len(v) < recordFixed {
				return fmt.Errorf("sample %d: corrupt record (%d bytes)", s, len(v))
			}
			base = max(base, int(binary.BigEndian.Uint32(v[2:])))
			return nil
		})
		if err != nil {
			return err
		}
		m.AttemptBase = base
		if err := tx.DeleteBucket(bucketSamples); err != nil && !errors.Is(err, bolterrors.ErrBucketNotFound) {
			return fmt.Errorf("drop samples: %w", err)
		}
		if _, err := tx.CreateBucket(bucketSamples); err != nil {
			return fmt.Errorf("create samples: %w", err)
		}
		c := tx.Bucket(bucketCounters)
		for _, k := range [][]byte{keyDone, keyFailed, keyBytes, keyTokens} {
			if err := c.Put(k, u64(0)); err != nil {
				return fmt.Errorf("zero counter %s: %w", k, err)
			}
		}
		return writeMeta(tx, m)
	})
}

// jobTotal is the job's sample count; write paths check sample indexes against it so
// that Load never meets a record beyond the dataset.
func jobTotal(tx *bolt.Tx) (int, error) {
	m, ok, err := readMeta(tx)
	if err != nil {
		return 0, err
	}
	if !ok {
		return 0, errors.New("no job initialised")
	}
	return m.Total, nil
}

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
const (
	recordVersion = 1
	recordFixed   = 34
	// maxErrorLen keeps a server's multi-kilobyte traceback out of every record.
	maxErrorLen = 1024
)

func encodeRecord(r Record) []byte {
	msg := truncateUTF8(r.Error, maxErrorLen)
	rid := r.RID
	if r.Imported {
		rid = importPrefix + rid
	}
	rid = truncateUTF8(rid, 1<<16-1)
	b := make([]byte, recordFixed, recordFixed+4+len(rid)+len(msg))
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
	return append(b, msg...)
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
	for _, dst := range []*string{&r.RID, &r.Error} {
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

// CommitDone marks r.Sample done and returns once that is durable. Concurrent callers
// share one txn and its fsyncs (group commit: whoever arrives while a txn commits goes
// into the next one, with no added delay). A replay of a sample already done replaces
// its record without counting it again. The attempt never goes backwards, so a later
// retry after verify --repair still gets a fresh rid.
func (ix *Index) CommitDone(r Record) error {
	return ix.groupCommit(func(tx *bolt.Tx) error { return commitDone(tx, r) })
}

// RecordAttempt makes attempt the current attempt of sample, durably, before its request
// leaves: the caller (a sender, not the coordinator) waits for the fsync while others
// share it, as CommitDone's callers do. An attempt number not above every attempt the
// sample had (or the index's attempt base) is refused, so a rid is never reused; the
// caller picks the number (NextAttempt) without a transaction of its own.
func (ix *Index) RecordAttempt(sample, attempt int) error {
	return ix.groupCommit(func(tx *bolt.Tx) error { return recordAttempt(tx, sample, attempt, time.Now()) })
}

// AttemptBase is the attempt every new attempt must exceed (the highest attempt before
// the last Reset); with a sample's recorded attempt it gives NextAttempt.
func (ix *Index) AttemptBase() (int, error) {
	var base int
	err := ix.view(func(tx *bolt.Tx) error {
		var err error
		base, err = attemptBase(tx)
		return err
	})
	return base, err
}

// NextAttempt is the attempt number after recorded, given the index's attempt base.
func NextAttempt(recorded, base int) int { return max(recorded, base) + 1 }

func recordAttempt(tx *bolt.Tx, s, attempt int, now time.Time) error {
	total, err := jobTotal(tx)
	if err != nil {
		return err
	}
	if s < 0 || s >= total {
		return fmt.Errorf("sample %d: out of range 0..%d", s, total-1)
	}
	base, err := attemptBase(tx)
	if err != nil {
		return err
	}
	old, _, err := getRecord(tx, s)
	if err != nil {
		return err
	}
	switch {
	case old.State == StateDone:
		return fmt.Errorf("sample %d: already done (attempt %d, rid %s); refusing a new attempt", s, old.Attempt, old.RID)
	case attempt <= max(old.Attempt, base) || attempt > math.MaxUint32:
		return fmt.Errorf("sample %d: attempt %d would reuse a rid (attempt %d recorded, base %d)", s, attempt, old.Attempt, base)
	}
	r := old
	r.State, r.Attempt, r.Updated = StateInflight, attempt, now
	return put(tx, old, r)
}

// groupCommit runs apply in a shared txn and returns once that is durable. Whoever
// arrives while a txn commits goes into the next one, with no added delay.
func (ix *Index) groupCommit(apply func(tx *bolt.Tx) error) error {
	req := &commitReq{apply: apply, done: make(chan struct{})}
	ix.commitMu.Lock()
	ix.pending = append(ix.pending, req)
	if ix.committing {
		ix.commitMu.Unlock()
		<-req.done
		if !req.lead {
			return req.wrapErr(ix.path)
		}
		ix.commitMu.Lock()
	}
	// We lead: commit everything queued, our record included.
	ix.committing = true
	batch := ix.pending
	ix.pending = nil
	ix.commitMu.Unlock()

	ix.commitBatch(batch, req)

	ix.commitMu.Lock()
	if len(ix.pending) > 0 {
		next := ix.pending[0]
		next.lead = true
		close(next.done)
	} else {
		ix.committing = false
	}
	ix.commitMu.Unlock()
	return req.wrapErr(ix.path)
}

func (c *commitReq) wrapErr(path string) error {
	if c.err != nil && !errors.Is(c.err, ErrDamaged) {
		return fmt.Errorf("index %s: %w", path, c.err)
	}
	return c.err
}

// commitBatch commits the batch in one txn and releases every caller in it but self,
// the leader. If the txn fails, each record is committed alone, so that one bad record
// fails only its own caller.
func (ix *Index) commitBatch(batch []*commitReq, self *commitReq) {
	err := guard(ix.path, func() error {
		return ix.db.Update(func(tx *bolt.Tx) error {
			for _, c := range batch {
				if err := c.apply(tx); err != nil {
					return err
				}
			}
			return nil
		})
	})
	for _, c := range batch {
		c.err = err
		if err != nil && len(batch) > 1 {
			c.err = guard(ix.path, func() error {
				return ix.db.Update(c.apply)
			})
		}
		if c != self {
			close(c.done)
		}
	}
}

func commitDone(tx *bolt.Tx, r Record) error {
	total, err := jobTotal(tx)
	if err != nil {
		return err
	}
	if r.Sample < 0 || r.Sample >= total {
		return fmt.Errorf("sample %d: out of range 0..%d", r.Sample, total-1)
	}
	old, _, err := getRecord(tx, r.Sample)
	if err != nil {
		return err
	}
	r.State = StateDone
	r.Attempt = max(r.Attempt, old.Attempt)
	r.Error = ""
	if r.Updated.IsZero() {
		r.Updated = time.Now()
	}
	return put(tx, old, r)
}

// commitDoneMany commits several records in one txn: verify --repair adopting a whole
// output directory must not pay a batch delay and two fsyncs per file.
func (ix *Index) commitDoneMany(rs []Record) error {
	return ix.update(func(tx *bolt.Tx) error {
		for _, r := range rs {
			if err := commitDone(tx, r); err != nil {
				return err
			}
		}
		return nil
	})
}

// MarkFailed records that sample's attempt failed for good, with the reason.
// Marking it twice counts it once; a done sample is an error.
func (ix *Index) MarkFailed(sample, attempt int, reason string) error {
	return ix.update(func(tx *bolt.Tx) error {
		total, err := jobTotal(tx)
		if err != nil {
			return err
		}
		if sample < 0 || sample >= total {
			return fmt.Errorf("sample %d: out of range 0..%d", sample, total-1)
		}
		old, _, err := getRecord(tx, sample)
		if err != nil {
			return err
		}
		if old.State == StateDone {
			return fmt.Errorf("sample %d: already done (rid %s); refusing to mark attempt %d failed", sample, old.RID, attempt)
		}
		r := old
		r.State = StateFailed
		r.Attempt = max(attempt, old.Attempt)
		r.Error = reason
		r.Updated = time.Now()
		return put(tx, old, r)
	})
}

// MarkPending sends a sample back to pending, keeping its attempt number so the next
// attempt's rid is new. verify --repair uses it for a done sample whose file is
// missing or corrupt. A sample with no record is already pending.
func (ix *Index) MarkPending(sample int, reason string) error {
	return ix.update(func(tx *bolt.Tx) error {
		old, ok, err := getRecord(tx, sample)
		if err != nil || !ok {
			return err
		}
		r := Record{Sample: sample, State: StatePending, Attempt: old.Attempt, RID: old.RID, Error: reason, Updated: time.Now()}
		return put(tx, old, r)
	})
}

// Counters are the sums over all records, kept up to date in the records' txns.
type Counters struct {
	Done, Failed         int
	BytesWritten, Tokens int64
	// Imported counts the done samples extract import brought in (part of Done).
	Imported int
}

// Counters reads the counters without visiting any record.
func (ix *Index) Counters() (Counters, error) {
	var c Counters
	err := ix.view(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketCounters)
		if b == nil {
			return nil
		}
		get := func(k []byte) int64 {
			v := b.Get(k)
			if len(v) != 8 {
				return 0
			}
			return int64(binary.BigEndian.Uint64(v))
		}
		c = Counters{Done: int(get(keyDone)), Failed: int(get(keyFailed)), BytesWritten: get(keyBytes), Tokens: get(keyTokens), Imported: int(get(keyImported))}
		return nil
	})
	if err != nil {
		return Counters{}, err
	}
	return c, nil
}

// contribution is what one record adds to the counters. Every write goes through put,
// which applies new's contribution minus old's, so the counters equal the sums over
// the records whatever the transition, replays included.
func contribution(r Record) [5]int64 {
	switch {
	case r.State == StateDone && r.Imported:
		return [5]int64{1, 0, r.Bytes, int64(r.Tokens), 1}
	case r.State == StateDone:
		return [5]int64{1, 0, r.Bytes, int64(r.Tokens), 0}
	case r.State == StateFailed:
		return [5]int64{0, 1, 0, 0, 0}
	}
	return [5]int64{}
}

func put(tx *bolt.Tx, old, r Record) error {
	if err := tx.Bucket(bucketSamples).Put(sampleKey(r.Sample), encodeRecord(r)); err != nil {
		return fmt.Errorf("sample %d: write record: %w", r.Sample, err)
	}
	before, after := contribution(old), contribution(r)
	c := tx.Bucket(bucketCounters)
	for i, k := range [][]byte{keyDone, keyFailed, keyBytes, keyTokens, keyImported} {
		d := after[i] - before[i]
		if d == 0 {
			continue
		}
		var cur int64
		if v := c.Get(k); len(v) == 8 {
			cur = int64(binary.BigEndian.Uint64(v))
		}
		if err := c.Put(k, u64(uint64(cur+d))); err != nil {
			return fmt.Errorf("sample %d: update counter %s: %w", r.Sample, k, err)
		}
	}
	return nil
}

// update and view name the index file in every error; the functions they run do not.
// Both run under guard, so a file damaged under an open index is an ErrDamaged error,
// not a crash.
func (ix *Index) update(fn func(*bolt.Tx) error) error {
	return ix.wrap(guard(ix.path, func() error { return ix.db.Update(fn) }))
}

func (ix *Index) view(fn func(*bolt.Tx) error) error {
	return ix.wrap(guard(ix.path, func() error { return ix.db.View(fn) }))
}

// wrap names the file in err, once.
func (ix *Index) wrap(err error) error {
	if err == nil || errors.Is(err, ErrDamaged) {
		return err
	}
	return fmt.Errorf("index %s: %w", ix.path, err)
}
