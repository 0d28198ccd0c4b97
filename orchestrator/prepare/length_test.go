package prepare

import (
	"testing"

	"github.com/extract-dev/extract/internal/conversation"
)

func enc(mask ...int64) conversation.Encoding {
	e := conversation.Encoding{Mask: mask, Spans: []conversation.Span{{Start: 0, End: len(mask)}}}
	for i := range mask {
		e.IDs = append(e.IDs, int64(10+i))
	}
	return e
}

func TestLengthPolicyTruncatesSkipsAndRefusesMasksWithTooFewOnes(t *testing.T) {
	for _, tc := range []struct {
		name      string
		l         Length
		e         conversation.Encoding
		len       int
		truncated bool
		refused   conversation.Reason
	}{
		{"fits", Length{MaxTokens: 4, OnLong: "truncate", MinLossTokens: 1}, enc(0, 1, 1, 0), 4, false, ""},
		{"truncated", Length{MaxTokens: 3, OnLong: "truncate", MinLossTokens: 1}, enc(0, 1, 1, 1, 1), 3, true, ""},
		{"skipped", Length{MaxTokens: 3, OnLong: "skip", MinLossTokens: 1}, enc(0, 1, 1, 1), 0, false, conversation.TooLong},
		{"truncation leaves no loss", Length{MaxTokens: 2, OnLong: "truncate", MinLossTokens: 1}, enc(0, 0, 1, 1), 0, true, conversation.FewLossTokens},
		{"all zeros", Length{OnLong: "truncate", MinLossTokens: 1}, enc(0, 0, 0), 0, false, conversation.FewLossTokens},
		{"under min_loss_tokens", Length{OnLong: "skip", MinLossTokens: 3}, enc(1, 1, 0), 0, false, conversation.FewLossTokens},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, truncated, ref := tc.l.Apply(tc.e)
			if tc.refused != "" {
				if ref == nil || ref.Reason != tc.refused {
					t.Fatalf("refusal %v, want %s", ref, tc.refused)
				}
				return
			}
			if ref != nil || truncated != tc.truncated || len(out.IDs) != tc.len || len(out.Mask) != tc.len || out.Spans[len(out.Spans)-1].End != tc.len {
				t.Fatalf("got %d tokens truncated %v refusal %v spans %+v", len(out.IDs), truncated, ref, out.Spans)
			}
		})
	}
}

func TestLengthPolicyRefusesNonsense(t *testing.T) {
	for _, l := range []Length{{MaxTokens: -1, OnLong: "skip", MinLossTokens: 1}, {OnLong: "drop", MinLossTokens: 1}, {OnLong: "skip"}} {
		if l.Check() == nil {
			t.Errorf("%+v accepted", l)
		}
	}
}
