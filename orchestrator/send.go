package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/extract-dev/extract/checkpoint"
	"github.com/extract-dev/extract/configs"
	"github.com/extract-dev/extract/dataset"
	"github.com/extract-dev/extract/sglang"
	"github.com/extract-dev/extract/shm"
)

type sendResult struct {
	sample, attempt int
	err             error
}

// expectedBytes is what a sample will take, in staging and then on the output disk.
func (j *job) expectedBytes(sample int) int64 { return sampleBytes(j.cfg, j.ds.Tokens(sample)) }

// sampleBytes is what admission reserves for a sample of tokens: the output file's size
// (a dump plus the loss mask), plus room for header, page rounding and directory blocks.
func sampleBytes(cfg *configs.Config, tokens int) int64 {
	return int64(tokens)*cfg.OutputBytesPerToken() + 16<<10
}

// pauseReasons are the metric labels of admission's pauses, by the prefix of the reason.
var pauseReasons = []string{"output disk reserve", "staging full", "staging budget", "cannot store dumps", "no server ready", "output disk behind", "isolating a sample"}

// admit sends the samples that admission's window lets through (invariant 5): it
// counts the window, and acts on the decision.
func (j *job) admit() {
	batch, paused := j.admission.decide(j.window(), time.Now(), func(s int) bool {
		_, busy := j.inflight[s]
		return busy || j.ledger.done(s)
	})
	j.admission.paused = paused
	j.setPausedMetrics()
	if len(batch) == 0 {
		return
	}
	if !j.sentAny {
		j.sentAny = true
		j.log.Info("first request sent", "sample", batch[0].sample, "since_start", time.Since(j.started).Round(time.Millisecond))
	}
	for _, b := range batch {
		// The number is picked here; the sender records it durably before the request
		// leaves (send), sharing fsyncs with the other senders and the movers. A run
		// killed in between never sent that rid, so the next run may pick it again.
		s := b.sample
		attempt := checkpoint.NextAttempt(int(j.ledger.attempt[s]), j.attemptBase)
		rid := shm.RID{Sample: s, Attempt: attempt}
		j.ledger.attempt[s] = uint32(attempt)
		j.ledger.set(s, checkpoint.StateInflight, 0, 0)
		rep := j.sup.replicas[b.replica]
		request, abandon := context.WithCancel(j.workers.ctx)
		j.inflight[s] = &flight{sample: s, attempt: attempt, rid: rid.String(), replica: rep.n, tokens: int64(j.ds.Tokens(s)), expected: j.expectedBytes(s), abandon: abandon, alone: b.alone}
		j.requestsOpen++
		j.workers.start("sender", func(ctx context.Context) error {
			defer abandon()
			j.send(ctx, request, rep.client, s, rid)
			return nil
		})
	}
}

// window counts what admission decides from. Every flight's bytes count until its move
// lands, and a landed move is taken off diskFree at once (onMoved): between two
// measurements the estimate never runs behind the disk.
func (j *job) window() window {
	w := window{
		maxInflight: j.cfg.Run.MaxInflight, requestsOpen: j.requestsOpen, flights: len(j.inflight),
		storeFailing: j.movers.storeFailing, budgets: j.budgets, replicas: j.sup.views(), poison: &j.sup.poison,
		cost: func(s int) (int64, int64) { return int64(j.ds.Tokens(s)), j.expectedBytes(s) },
	}
	for _, f := range j.inflight {
		w.reserved += f.expected
		switch {
		case f.moving:
			w.moving++
		case f.responded:
			w.answered++
		}
		if f.replica < 0 {
			continue
		}
		v := &w.replicas[f.replica]
		if !f.moving {
			v.load += f.tokens
		}
		if !f.responded {
			v.busy = true
			v.exclusive = v.exclusive || f.alone
		}
	}
	return w
}

func (j *job) setPausedMetrics() {
	for _, r := range pauseReasons {
		v := 0.0
		for _, p := range j.admission.paused {
			if len(p) >= len(r) && p[:len(r)] == r {
				v = 1
			}
		}
		j.metrics.paused.WithLabelValues(r).Set(v)
	}
}

// send records the attempt and sends the request under request, which ends with ctx or
// when the flight is abandoned; the result goes to the coordinator until ctx ends, so
// that it settles every request it counted.
func (j *job) send(ctx, request context.Context, client *sglang.Client, sample int, rid shm.RID) {
	// The attempt is durable before the request leaves, so a dump can always be matched
	// to the attempt the index knows, whatever crashes when.
	s, err := j.ds.Sample(sample)
	if err == nil {
		if err = j.ix.RecordAttempt(sample, rid.Attempt, s.SourceID); err != nil {
			err = &indexError{fmt.Errorf("record attempt %s: %w", rid, err)}
		}
	}
	if err == nil {
		_, err = client.Generate(request, sglang.GenerateRequest{RID: rid.String(), InputIDs: s.InputIDs, Text: s.Text, MaxNewTokens: j.cfg.Server.MaxNewTokens})
	}
	select {
	case j.sent <- sendResult{sample: sample, attempt: rid.Attempt, err: err}:
	case <-ctx.Done():
	}
}

func (j *job) onSent(r sendResult) error {
	j.requestsOpen--
	if errors.Is(r.err, dataset.ErrBad) {
		return r.err // the dataset changed under the run: nothing more it says can be trusted
	}
	f := j.inflight[r.sample]
	if f != nil && f.attempt == r.attempt {
		f.responded = true
	}
	if f == nil || f.attempt != r.attempt || f.moving {
		return nil // already done, or superseded, or its dump is being moved
	}
	if _, ok := errors.AsType[*indexError](r.err); ok {
		// The index cannot record attempts (a full or failing state disk): nothing can be
		// sent safely; cron should try again once the disk is fixed.
		return fmt.Errorf("%w: %v", ErrTemporary, r.err)
	}
	if r.err != nil {
		if j.draining {
			delete(j.inflight, r.sample)
			return nil
		}
		j.log.Warn("request failed", "sample", r.sample, "rid", f.rid, "err", r.err)
		j.requeue(r.sample, "request failed: "+r.err.Error())
		return nil
	}
	f.answered = time.Now()
	return nil
}

// requeue gives up on a sample's current attempt: it is sent again with a new rid after a
// backoff, or marked failed once it has failed max_attempts times in this run.
func (j *job) requeue(sample int, reason string) {
	delete(j.inflight, sample)
	final, n := j.admission.fail(sample, j.cfg.Run.MaxAttempts, time.Now())
	if final {
		j.markFailed(sample, reason, n)
	}
}

// markFailed records sample failed in the index and the ledger, for the next run to retry.
func (j *job) markFailed(sample int, reason string, attempts int) {
	if err := j.ix.MarkFailed(sample, int(j.ledger.attempt[sample]), reason); err != nil {
		j.log.Error("mark failed", "sample", sample, "err", err)
		return
	}
	j.ledger.set(sample, checkpoint.StateFailed, 0, 0)
	j.log.Error("sample failed", "sample", sample, "attempts", attempts, "reason", reason)
}

// checkTimeouts re-sends samples whose request was answered but whose dump never came.
func (j *job) checkTimeouts() {
	now := time.Now()
	for s, f := range j.inflight {
		if f.moving || f.answered.IsZero() || now.Sub(f.answered) < j.cfg.Run.DumpTimeout {
			continue
		}
		j.reject("dump_timeout")
		j.log.Warn("no dump arrived; sending again", "sample", s, "rid", f.rid, "waited", now.Sub(f.answered).Round(time.Second))
		j.requeue(s, "dump never arrived")
	}
}
