package prepare

import (
	"fmt"

	"github.com/extract-dev/extract/internal/conversation"
)

// Length is the length policy: at most MaxTokens tokens (0: no bound), a longer
// conversation cut there (OnLong "truncate") or refused ("skip"); and at least
// MinLossTokens tokens in the loss after that, or refused. A conversation is never kept
// with an all-zeros mask: MinLossTokens is at least 1.
type Length struct {
	MaxTokens     int
	OnLong        string // truncate | skip
	MinLossTokens int
}

// Check validates the policy's values.
func (l Length) Check() error {
	switch {
	case l.MaxTokens < 0:
		return fmt.Errorf("prepare.max_tokens is %d, want 0 (no bound) or more", l.MaxTokens)
	case l.OnLong != "truncate" && l.OnLong != "skip":
		return fmt.Errorf("prepare.length_policy is %q, want truncate or skip", l.OnLong)
	case l.MinLossTokens < 1:
		return fmt.Errorf("prepare.min_loss_tokens is %d, want at least 1 (a sample with no loss token teaches nothing)", l.MinLossTokens)
	}
	return nil
}

// Apply returns e as the policy keeps it, whether it was cut, or the refusal.
func (l Length) Apply(e conversation.Encoding) (out conversation.Encoding, truncated bool, why *conversation.Refusal) {
	if l.MaxTokens > 0 && len(e.IDs) > l.MaxTokens {
		if l.OnLong == "skip" {
			return e, false, &conversation.Refusal{Reason: conversation.TooLong, Detail: fmt.Sprintf("%d tokens, over prepare.max_tokens %d (prepare.length_policy: skip)", len(e.IDs), l.MaxTokens)}
		}
		e = cut(e, l.MaxTokens)
		truncated = true
	}
	if n := e.LossTokens(); n < l.MinLossTokens {
		cutNote := ""
		if truncated {
			cutNote = fmt.Sprintf(" after truncation to %d tokens", l.MaxTokens)
		}
		return e, truncated, &conversation.Refusal{Reason: conversation.FewLossTokens, Detail: fmt.Sprintf("%d loss tokens%s, under prepare.min_loss_tokens %d", n, cutNote, l.MinLossTokens)}
	}
	return e, truncated, nil
}

// cut keeps the first n tokens, their mask and the spans over them.
func cut(e conversation.Encoding, n int) conversation.Encoding {
	out := conversation.Encoding{IDs: e.IDs[:n:n], Mask: e.Mask[:n:n]}
	for _, s := range e.Spans {
		if s.Start >= n {
			break
		}
		s.End = min(s.End, n)
		out.Spans = append(out.Spans, s)
	}
	return out
}
