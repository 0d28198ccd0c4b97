package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/extract-dev/extract/checkpoint"
	"github.com/extract-dev/extract/configs"
	"github.com/extract-dev/extract/dataset"
	"github.com/extract-dev/extract/shm"
)

type moveJob struct {
	dump shm.Dump
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

// movers move dumps to the output disk and commit them (invariant 1): run.movers copy
// at once, commitsBeyondCopies more wait on the disk. The coordinator owns the queue,
// what is being moved and the store retries, and hands the movers one dump at a time
// (next, handed); their results come back on moved for the coordinator to settle.
type movers struct {
	// what a move needs: read-only once the run starts
	mover *checkpoint.Mover
	ds    *dataset.Dataset
	ix    *checkpoint.Index
	cfg   *configs.Config
	log   *slog.Logger

	// the coordinator's
	moving map[string]bool // dump paths handed to a mover, or waiting to be
	queue  []moveJob       // routed dumps waiting for a free mover; the coordinator never blocks on movers
	stores []storeRetry    // dumps whose store failed, tried again when due
	// storeFailing says why storing dumps fails (full disk, I/O error), "" while it works.
	storeFailing string
	storeErrors  int // consecutive failures to store a dump

	jobs      chan moveJob
	moved     chan moveResult
	copySlots chan struct{} // one per run.movers: the copies under way
	running   atomic.Int32  // movers still running
	done      chan struct{} // closed by the last mover to exit
}

func newMovers(cfg *configs.Config, ds *dataset.Dataset, ix *checkpoint.Index, log *slog.Logger) *movers {
	return &movers{
		mover: &checkpoint.Mover{OutputDir: cfg.OutputDir, Layout: outputLayout(cfg)},
		ds:    ds, ix: ix, cfg: cfg, log: log,
		moving:    map[string]bool{},
		jobs:      make(chan moveJob),
		moved:     make(chan moveResult, moverGoroutines(cfg)),
		copySlots: make(chan struct{}, cfg.Run.Movers),
		done:      make(chan struct{}),
	}
}

// start starts the mover goroutines in w.
func (m *movers) start(w *workers) {
	m.running.Store(int32(moverGoroutines(m.cfg)))
	for range moverGoroutines(m.cfg) {
		w.start("mover", m.loop)
	}
}

// add queues dump d for a mover.
func (m *movers) add(d shm.Dump) {
	m.moving[d.Path] = true
	m.queue = append(m.queue, moveJob{dump: d})
}

// next is the channel and dump to offer the movers in the coordinator's select: a nil
// channel when nothing waits. handed takes it off the queue once a mover took it.
func (m *movers) next() (chan<- moveJob, moveJob) {
	if len(m.queue) == 0 {
		return nil, moveJob{}
	}
	return m.jobs, m.queue[0]
}

func (m *movers) handed() { m.queue = m.queue[1:] }

// landed settles a move that stored its dump: storing works.
func (m *movers) landed(path string) {
	delete(m.moving, path)
	m.storeErrors, m.storeFailing = 0, ""
}

// storeFailed keeps a good dump that could not be stored for another try after
// storeRetryDelay, with failing as the reason admission pauses, and says how many
// stores failed in a row.
func (m *movers) storeFailed(mj moveJob, failing string, now time.Time) int {
	m.storeErrors++
	m.storeFailing = failing
	m.moving[mj.dump.Path] = true
	m.stores = append(m.stores, storeRetry{job: mj, due: now.Add(storeRetryDelay)})
	return m.storeErrors
}

// retryStores queues the dumps whose store failed once their wait is over.
func (m *movers) retryStores(now time.Time) {
	kept := m.stores[:0]
	for _, s := range m.stores {
		if s.due.After(now) {
			kept = append(kept, s)
			continue
		}
		m.queue = append(m.queue, s.job)
	}
	m.stores = kept
}

// loop moves dumps and commits them: file durable, then index, then the staging file
// removed (invariant 1).
func (m *movers) loop(ctx context.Context) error {
	defer func() {
		if m.running.Add(-1) == 0 {
			close(m.done)
		}
	}()
	for {
		// A mover takes a dump only with a copy slot in hand: dumps it cannot start stay
		// queued with the coordinator, which leaves them in staging when the run stops.
		select {
		case m.copySlots <- struct{}{}:
		case <-ctx.Done():
			return nil
		}
		var mj moveJob
		select {
		case <-ctx.Done():
			<-m.copySlots
			return nil // an early end of the run: jobs is never closed
		case next, ok := <-m.jobs:
			if !ok {
				<-m.copySlots
				return nil
			}
			mj = next
		}
		start := time.Now()
		moved, err := m.moveOne(ctx, mj.dump)
		select {
		case m.moved <- moveResult{dump: mj.dump, moved: moved, took: time.Since(start), err: err}:
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
func (m *movers) moveOne(ctx context.Context, d shm.Dump) (checkpoint.Moved, error) {
	slot := true
	release := func() {
		if slot {
			slot = false
			<-m.copySlots
		}
	}
	defer release()
	if ctx.Err() != nil {
		return checkpoint.Moved{}, ctx.Err()
	}
	s, err := m.ds.Sample(d.RID.Sample)
	if err != nil {
		return checkpoint.Moved{}, err
	}
	src, err := shm.OpenDump(d.Path)
	if err != nil {
		return checkpoint.Moved{}, err
	}
	defer func() { _ = src.Close() }()
	staged, err := m.mover.Stage(ctx, src, d.Path, checkpoint.Expect{
		Sample: s.Index, RID: d.RID.String(), InputIDs: s.InputIDs, LossMask: s.LossMask,
		DatasetFingerprint: m.ds.Fingerprint, ConfigFingerprint: m.cfg.Fingerprint(),
		HiddenSize: m.cfg.HiddenSize(), Layers: m.cfg.LayersString(), Model: m.cfg.ServedModel(),
		SourceID: s.SourceID,
	})
	release()
	if err != nil {
		return checkpoint.Moved{}, err
	}
	moved, err := staged.CommitTo(m.ix, checkpoint.Record{Attempt: d.RID.Attempt, RID: d.RID.String(), Updated: time.Now().UTC(), SourceID: s.SourceID})
	if ie, ok := errors.AsType[*checkpoint.IndexError](err); ok {
		return moved, &indexError{ie}
	}
	if err != nil {
		return moved, err
	}
	if err := os.Remove(d.Path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		m.log.Warn("remove moved dump", "file", d.Path, "err", err)
	}
	return moved, nil
}

// finish lets the moves under way finish (each saves a resend) and hands their results
// to settle; queued ones stay in staging for the next run to adopt.
func (m *movers) finish(settle func(moveResult)) {
	close(m.jobs)
	for {
		select {
		case r := <-m.moved:
			settle(r)
		case <-m.done:
			for {
				select {
				case r := <-m.moved:
					settle(r)
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
		j.movers.landed(r.dump.Path)
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
			j.sup.replicas[f.replica].status.Done++
			j.metrics.serverDone.WithLabelValues(j.sup.replicas[f.replica].metricLabel()).Inc()
			if rep := j.sup.replicas[f.replica]; r.moved.HookVersion != rep.status.HookVersion {
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
	delete(j.movers.moving, r.dump.Path)
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
	where, dir := "output disk", j.cfg.OutputDir
	if _, ok := errors.AsType[*indexError](r.err); ok {
		where, dir = "state disk", j.cfg.StateDir
	}
	failing := fmt.Sprintf("%s (%s): %v", where, dir, r.err)
	if errors.Is(r.err, syscall.ENOSPC) {
		failing = fmt.Sprintf("%s full (%s)", where, dir)
	}
	n := j.movers.storeFailed(moveJob{dump: r.dump}, failing, time.Now())
	j.log.Warn("could not store dump; keeping it in staging and retrying", "sample", r.dump.RID.Sample, "file", r.dump.Path, "err", r.err, "consecutive", n)
	if !errors.Is(r.err, syscall.ENOSPC) && n > 50 {
		return fmt.Errorf("%w: storing dumps keeps failing (%d in a row), last: %v", ErrTemporary, n, r.err)
	}
	if f != nil {
		f.moving = true
	}
	return nil
}
