package checkpoint

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"sync"
	"time"

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
	keyConfigFields       = []byte("config_fields")

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
	// ConfigFields are the settings the config fingerprint hashes, one "name=value" a
	// line, so that a mismatch can say which one changed. Optional: an index written
	// before the key existed has none. (A string keeps Meta comparable.)
	ConfigFields string
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
		ConfigFields:       string(b.Get(keyConfigFields)),
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
	if err := putFields(b, m.ConfigFields); err != nil {
		return err
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

// putFields writes meta's config_fields; none deletes the key, so an index without
// them is byte for byte what older builds write.
func putFields(b *bolt.Bucket, fields string) error {
	if fields == "" {
		if err := b.Delete(keyConfigFields); err != nil {
			return fmt.Errorf("write meta %s: %w", keyConfigFields, err)
		}
		return nil
	}
	if err := b.Put(keyConfigFields, []byte(fields)); err != nil {
		return fmt.Errorf("write meta %s: %w", keyConfigFields, err)
	}
	return nil
}

// SetConfigFields records the config fields of an index that predates them, once its
// fingerprint has been checked equal to the config's: later mismatches can then name
// what changed.
func (ix *Index) SetConfigFields(fields string) error {
	return ix.update(func(tx *bolt.Tx) error {
		return putFields(tx.Bucket(bucketMeta), fields)
	})
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
		for _, k := range [][]byte{keyDone, keyFailed, keyBytes, keyTokens, keyImported} {
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
