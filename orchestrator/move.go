package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"syscall"
	"time"

	"github.com/extract-dev/extract/checkpoint"
	"github.com/extract-dev/extract/configs"
	"github.com/extract-dev/extract/dataset"
	"github.com/extract-dev/extract/shm"
)

type moveJob struct {
	dump     shm.Dump
	expected int64
}

type moveResult struct {
	dump  shm.Dump
	moved checkpoint.Moved
	took  time.Duration
	err   error
}

type storeRetry struct {
	job moveJob
	due time.Time
}

// storeRetryDelay is how long a dump that could not be stored waits before the next try.
const storeRetryDelay = 2 * time.Second

// commitsBeyondCopies is how many moved samples may wait on their fsyncs and index
// commit while run.movers others copy. Those waits are disk latency, not work: with
// more of them in flight one journal commit and one index transaction carry many
// samples (docs/performance.md, figure 2).
const commitsBeyondCopies = 32

// moverGoroutines is how many goroutines move dumps: run.movers copying at once, and
// the rest waiting on the disk.
func moverGoroutines(cfg *configs.Config) int { return cfg.Run.Movers + commitsBeyondCopies }

// moverLoop moves dumps and commits them: file durable, then index, then the staging
// file removed (invariant 1).
func (j *job) moverLoop(ctx context.Context) error {
	defer func() {
		if j.movers.Add(-1) == 0 {
			close(j.moversDone)
		}
	}()
	for {
		// A mover takes a dump only with a copy slot in hand: dumps it cannot start stay
		// queued with the coordinator, which leaves them in staging when the run stops.
		select {
		case j.copySlots <- struct{}{}:
		case <-ctx.Done():
			return nil
		}
		var mj moveJob
		select {
		case <-ctx.Done():
			<-j.copySlots
			return nil // an early end of the run: moveJobs is never closed
		case next, ok := <-j.moveJobs:
			if !ok {
				<-j.copySlots
				return nil
			}
			mj = next
		}
		start := time.Now()
		moved, err := j.moveOne(ctx, mj.dump)
		select {
		case j.moved <- moveResult{dump: mj.dump, moved: moved, took: time.Since(start), err: err}:
		case <-ctx.Done():
		}
	}
}

// indexError is a failure to commit to the index (state_dir), not to write the output.
type indexError struct{ err error }

func (e *indexError) Error() string { return e.err.Error() }

func (e *indexError) Unwrap() error { return e.err }

// moveOne moves d holding a copy slot, which it gives back once the copy is written:
// the fsyncs and the index commit that follow wait on the disk, not the CPU, and overlap
// with the next copies.
func (j *job) moveOne(ctx context.Context, d shm.Dump) (checkpoint.Moved, error) {
	slot := true
	release := func() {
		if slot {
			slot = false
			<-j.copySlots
		}
	}
	defer release()
	if ctx.Err() != nil {
		return checkpoint.Moved{}, ctx.Err()
	}
	s, err := j.ds.Sample(d.RID.Sample)
	if err != nil {
		return checkpoint.Moved{}, err
	}
	src, err := shm.OpenDump(d.Path)
	if err != nil {
		return checkpoint.Moved{}, err
	}
	defer func() { _ = src.Close() }()
	staged, err := j.mover.Stage(ctx, src, d.Path, checkpoint.Expect{
		Sample: s.Index, RID: d.RID.String(), InputIDs: s.InputIDs, LossMask: s.LossMask,
		DatasetFingerprint: j.ds.Fingerprint, ConfigFingerprint: j.cfg.Fingerprint(),
		HiddenSize: j.cfg.HiddenSize(), Layers: j.cfg.LayersString(), Model: j.cfg.ServedModel(),
		SourceID: s.SourceID,
	})
	release()
	if err != nil {
		return checkpoint.Moved{}, err
	}
	moved, err := staged.Commit()
	if err != nil {
		return moved, err
	}
	err = j.ix.CommitDone(checkpoint.Record{
		Sample: s.Index, State: checkpoint.StateDone, Attempt: d.RID.Attempt, RID: d.RID.String(),
		Bytes: moved.Bytes, CRC32C: moved.CRC32C, Tokens: moved.Tokens, Updated: time.Now().UTC(),
	})
	if err != nil {
		return moved, &indexError{fmt.Errorf("index sample %d: %w", s.Index, err)}
	}
	if err := os.Remove(d.Path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		j.log.Warn("remove moved dump", "file", d.Path, "err", err)
	}
	return moved, nil
}

// finishMoves lets the moves under way finish (each saves a resend) and settles their
// results; queued ones stay in staging for the next run to adopt.
func (j *job) finishMoves() {
	close(j.moveJobs)
	for {
		select {
		case r := <-j.moved:
			j.settleMoved(r)
		case <-j.moversDone:
			for {
				select {
				case r := <-j.moved:
					j.settleMoved(r)
				default:
					return
				}
			}
		}
	}
}

// settleMoved is onMoved once the loop has ended: an error it returns (a bad dataset)
// has no loop left to end, so it is logged; the dump stays in staging for the next run.
func (j *job) settleMoved(r moveResult) {
	if err := j.onMoved(r); err != nil {
		j.log.Warn("move settled after the loop", "file", r.dump.Path, "err", err)
	}
}

func (j *job) onMoved(r moveResult) error {
	s := r.dump.RID.Sample
	f := j.inflight[s]
	var dumpErr *checkpoint.DumpError
	switch {
	case r.err == nil:
		delete(j.moving, r.dump.Path)
		j.storeErrors, j.storeFailing = 0, ""
		if !j.ledger.done(s) {
			j.ledger.set(s, checkpoint.StateDone, r.moved.Bytes, r.moved.Tokens)
			// Charge what was reserved (block rounding included) until the next measurement.
			used := r.moved.Bytes
			if f != nil {
				used = max(used, f.expected)
			}
			j.budgets.diskFree -= used
		}
		delete(j.inflight, s)
		j.metrics.moveSeconds.Observe(r.took.Seconds())
		if f != nil && f.replica >= 0 {
			j.replicas[f.replica].status.Done++
			j.metrics.serverDone.WithLabelValues(j.replicas[f.replica].metricLabel()).Inc()
			if rep := j.replicas[f.replica]; r.moved.HookVersion != rep.status.HookVersion {
				j.log.Info("server dump hook", "replica", rep.n, "hook_version", r.moved.HookVersion, "protocol", r.moved.Protocol, "layers", r.moved.Layers)
				rep.status.HookVersion = r.moved.HookVersion
			}
		}
		return nil
	case errors.Is(r.err, dataset.ErrBad):
		return r.err
	case errors.Is(r.err, context.Canceled):
		return nil // stopping; the dump stays in staging for the next run
	}
	delete(j.moving, r.dump.Path)
	if f != nil {
		f.moving = false
	}
	switch {
	case errors.Is(r.err, shm.ErrNotRegular):
		// Swapped for a FIFO or a symlink after it was seen: not ours to read or delete.
		j.reject("not_regular")
		j.log.Warn("dump rejected", "file", r.dump.Path, "reason", "not_regular", "err", r.err)
	case errors.Is(r.err, fs.ErrNotExist):
		j.log.Warn("dump vanished from staging before it was moved", "file", r.dump.Path)
	case errors.As(r.err, &dumpErr):
		j.reject("malformed")
		j.log.Error("dump rejected", "sample", s, "rid", r.dump.RID.String(), "err", r.err)
		j.quarantine.hold(r.dump.Path)
	case errors.As(r.err, new(*checkpoint.BlockedError)):
		j.failBlocked(r, f)
		return nil
	default:
		return j.storeFailed(r, f)
	}
	if f != nil && !j.draining {
		j.requeue(s, r.err.Error())
	}
	return nil
}

// failBlocked fails a sample whose output path holds something extract may not replace
// (a directory, an immutable file): a retry, or a resend that recomputes the dump, meets
// the same thing, so the sample fails at once with the path in its reason, and the run
// goes on with the others. Its dump is removed: it would hold staging until the
// operator clears the path, and the next run recomputes the sample.
func (j *job) failBlocked(r moveResult, f *flight) {
	s := r.dump.RID.Sample
	if f == nil || f.rid != r.dump.RID.String() {
		return // a stale attempt's dump: the current one settles the sample
	}
	delete(j.inflight, s)
	j.admission.fail(s, 1, time.Now()) // a limit of 1: final, nothing scheduled
	if err := os.Remove(r.dump.Path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		j.log.Warn("remove dump of a blocked sample", "file", r.dump.Path, "err", err)
	}
	if err := j.ix.MarkFailed(s, int(j.ledger.attempt[s]), r.err.Error()); err != nil {
		j.log.Error("mark failed", "sample", s, "err", err)
		return
	}
	j.ledger.set(s, checkpoint.StateFailed, 0, 0)
	j.log.Error("sample failed: its output path is blocked", "sample", s, "err", r.err)
}

// storeFailed handles a good dump that could not be stored (disk full, I/O error): it
// stays in staging and is tried again, while admission pauses (invariant 5).
func (j *job) storeFailed(r moveResult, f *flight) error {
	j.storeErrors++
	where, dir := "output disk", j.cfg.OutputDir
	if _, ok := errors.AsType[*indexError](r.err); ok {
		where, dir = "state disk", j.cfg.StateDir
	}
	j.storeFailing = fmt.Sprintf("%s (%s): %v", where, dir, r.err)
	if errors.Is(r.err, syscall.ENOSPC) {
		j.storeFailing = fmt.Sprintf("%s full (%s)", where, dir)
	}
	j.log.Warn("could not store dump; keeping it in staging and retrying", "sample", r.dump.RID.Sample, "file", r.dump.Path, "err", r.err, "consecutive", j.storeErrors)
	if !errors.Is(r.err, syscall.ENOSPC) && j.storeErrors > 50 {
		return fmt.Errorf("%w: storing dumps keeps failing (%d in a row), last: %v", ErrTemporary, j.storeErrors, r.err)
	}
	if f != nil {
		f.moving = true
	}
	j.moving[r.dump.Path] = true
	expected := j.expectedBytes(r.dump.RID.Sample)
	j.stores = append(j.stores, storeRetry{job: moveJob{dump: r.dump, expected: expected}, due: time.Now().Add(storeRetryDelay)})
	return nil
}

// retryStores queues the dumps whose store failed once their wait is over.
func (j *job) retryStores() {
	now := time.Now()
	kept := j.stores[:0]
	for _, s := range j.stores {
		if s.due.After(now) {
			kept = append(kept, s)
			continue
		}
		j.moveQueue = append(j.moveQueue, s.job)
	}
	j.stores = kept
}
