package generate

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/extract-dev/extract/internal/conversation"
	"github.com/extract-dev/extract/sglang"
)

// conversation regenerates one conversation's assistant turns; nil means ctx ended
// before it finished (nothing is recorded, a resume sends it again).
func (j *job) conversation(ctx context.Context, w work) *Record {
	l := w.line
	rec := &Record{Line: l.Conversation.Line, ID: l.Conversation.ID}
	if l.Refusal != nil {
		rec.Line, rec.ID = l.Refusal.Line, l.Refusal.ID
		rec.State, rec.Reason = Failed, fmt.Sprintf("%s: %s", l.Refusal.Reason, l.Refusal.Detail)
		return rec
	}
	c := l.Conversation
	fail := func(format string, a ...any) *Record {
		rec.State, rec.Reason = Failed, fmt.Sprintf(format, a...)
		return rec
	}
	b := builder{r: j.o.Renderer, tools: c.Tools, endOfTurn: j.o.EndOfTurn}
	msgs := trimToLastAssistant(c.Messages)
	var out []conversation.Message
	for i, m := range msgs {
		if m.Role != conversation.Assistant {
			out = append(out, m)
			continue
		}
		if err := b.next(ctx, out, i); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fail("%v", err)
		}
		resp, act, err := j.turn(ctx, w.sample, i, b.ids, rec)
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			return fail("%v", err)
		}
		if act == Drop {
			rec.State, rec.Reason = Dropped, fmt.Sprintf("turn %d: %s", i, joinFlags(rec.Flags))
			return rec
		}
		out = append(out, conversation.Message{Role: conversation.Assistant, Content: resp.Text})
		b.reply(resp.OutputIDs, resp.Text, len(out))
	}
	if _, err := b.close(ctx, out, len(msgs)); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fail("%v", err)
	}
	rec.State, rec.Messages, rec.Tools, rec.InputIDs, rec.LossMask = Done, out, c.Tools, b.ids, b.mask
	return rec
}

func joinFlags(fs []Flag) string {
	s := make([]string, len(fs))
	for i, f := range fs {
		s[i] = string(f)
	}
	return strings.Join(s, ",")
}

// turn sends one turn until it has a reply the rules keep or drop, or fails it: a
// server error max_attempts times, or the server dying with it alone once it was in
// flight at isolate_after_deaths deaths (poison).
func (j *job) turn(ctx context.Context, sample, turn int, prompt []int64, rec *Record) (sglang.SampleResponse, Action, error) {
	var lastErr error
	serverFails, retries, sends := 0, 0, 0
	for {
		alone := j.deathsOf(sample) >= j.o.IsolateAfterDeaths
		s, err := j.pool.acquire(ctx, alone)
		if err != nil {
			return sglang.SampleResponse{}, Keep, err
		}
		params := j.o.Params
		if params.Seed != nil {
			seed := *params.Seed + int64(retries)
			params.Seed = &seed
		}
		sends++
		rec.Requests++
		j.prog.request()
		resp, err := s.rep.Client.Sample(s.ctx, sglang.SampleRequest{RID: fmt.Sprintf("g%09d-t%d-a%d", sample, turn, sends), InputIDs: prompt, Params: params})
		died := j.pool.release(s)
		if ctx.Err() != nil {
			return sglang.SampleResponse{}, Keep, ctx.Err()
		}
		if died {
			n, derr := j.addDeath(sample)
			if derr != nil {
				return sglang.SampleResponse{}, Keep, derr
			}
			j.o.Log.Warn("generate: server died with the conversation in flight", "sample", sample, "line", rec.Line, "deaths", n, "alone", s.alone)
			if s.alone {
				return sglang.SampleResponse{}, Keep, fmt.Errorf("poison: the server died %d times with turn %d in flight, the last time alone (server.isolate_after_deaths %d)", n, turn, j.o.IsolateAfterDeaths)
			}
			continue
		}
		if err != nil {
			serverFails++
			lastErr = err
			j.o.Log.Warn("generate: request failed", "sample", sample, "line", rec.Line, "turn", turn, "failures", serverFails, "err", err)
			if serverFails >= j.o.MaxAttempts {
				return sglang.SampleResponse{}, Keep, fmt.Errorf("server_error: turn %d failed %d times (generate.max_attempts): %w", turn, serverFails, lastErr)
			}
			if !sleep(ctx, time.Duration(serverFails)*200*time.Millisecond) {
				return sglang.SampleResponse{}, Keep, ctx.Err()
			}
			continue
		}
		rec.Generated += len(resp.OutputIDs)
		j.prog.addTokens(len(resp.OutputIDs))
		flags := j.o.Rules.Check(resp.Text, resp.OutputIDs, resp.Finish)
		act := j.o.Rules.Decide(flags, j.o.MaxAttempts-1-retries)
		j.prog.flagged(flags)
		if act == Retry {
			retries++
			continue
		}
		rec.Flags = append(rec.Flags, flags...)
		return resp, act, nil
	}
}

func (j *job) deathsOf(sample int) int {
	j.dmu.Lock()
	defer j.dmu.Unlock()
	return j.deaths[sample]
}

// addDeath records a death durably first: a kill of extract after it still counts it.
func (j *job) addDeath(sample int) (int, error) {
	j.dmu.Lock()
	defer j.dmu.Unlock()
	n, err := j.ix.addDeath(sample)
	if err != nil {
		return 0, fmt.Errorf("generate: record a server death for sample %d: %w", sample, err)
	}
	j.deaths[sample] = n
	return n, nil
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
