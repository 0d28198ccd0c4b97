package checkpoint

import (
	"fmt"
	"math"
	"time"

	bolt "go.etcd.io/bbolt"
)

// BeginAttempts (tests only) starts a new attempt of each sample in one txn and returns the new
// attempt numbers: one above both the sample's last attempt and the attempt base. The
// caller sends requests only after it returns, so a rid is never reused, even across a
// crash or a Reset.
func (ix *Index) BeginAttempts(samples []int) ([]int, error) {
	if len(samples) == 0 {
		return nil, nil
	}
	attempts := make([]int, len(samples))
	err := ix.update(func(tx *bolt.Tx) error {
		total, err := jobTotal(tx)
		if err != nil {
			return err
		}
		base, err := attemptBase(tx)
		if err != nil {
			return err
		}
		seen := make(map[int]bool, len(samples))
		now := time.Now()
		for i, s := range samples {
			if s < 0 || s >= total {
				return fmt.Errorf("sample %d: out of range 0..%d", s, total-1)
			}
			if seen[s] {
				return fmt.Errorf("sample %d: listed twice in one batch", s)
			}
			seen[s] = true
			old, _, err := getRecord(tx, s)
			if err != nil {
				return err
			}
			if old.State == StateDone {
				return fmt.Errorf("sample %d: already done (attempt %d, rid %s); refusing a new attempt", s, old.Attempt, old.RID)
			}
			if max(old.Attempt, base) >= math.MaxUint32 {
				return fmt.Errorf("sample %d: attempt %d is the last a record holds", s, max(old.Attempt, base))
			}
			r := old
			r.State = StateInflight
			r.Attempt = max(old.Attempt, base) + 1
			r.Updated = now
			if err := put(tx, old, r); err != nil {
				return err
			}
			attempts[i] = r.Attempt
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return attempts, nil
}
