package checkpoint

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"time"

	bolt "go.etcd.io/bbolt"
)

type commitReq struct {
	// apply writes the caller's change into the shared txn.
	apply func(tx *bolt.Tx) error
	err   error
	lead  bool
	done  chan struct{}
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
// sourceID is the sample's own id in its data ("" for none), kept in the record from
// then on.
func (ix *Index) RecordAttempt(sample, attempt int, sourceID string) error {
	return ix.groupCommit(func(tx *bolt.Tx) error { return recordAttempt(tx, sample, attempt, sourceID, time.Now()) })
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

func recordAttempt(tx *bolt.Tx, s, attempt int, sourceID string, now time.Time) error {
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
	r.State, r.Attempt, r.Updated, r.SourceID = StateInflight, attempt, now, sourceID // put keeps the old id for ""
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
	if r.SourceID == "" {
		r.SourceID = old.SourceID // a sample's id does not change with its state
	}
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
