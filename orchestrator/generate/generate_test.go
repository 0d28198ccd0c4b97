package generate

import (
	"context"
	"encoding/json"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/extract-dev/extract/internal/conversation"
	"github.com/extract-dev/extract/sglang/simulator"
)

var rules = Rules{
	On:          map[Flag]Action{FlagEmpty: Retry, FlagLength: Keep, FlagThink: Drop, FlagOnlyStop: Retry},
	ThinkingOff: true, ThinkMarkers: []string{"<think>", "</think>"}, Stop: map[int64]bool{2: true},
}

func TestEachValidationRuleFlagsWhatItNames(t *testing.T) {
	for _, c := range []struct {
		text   string
		out    []int64
		finish string
		want   []Flag
	}{
		{"hello", []int64{10, 2}, "stop", nil},
		{"  \n", []int64{35, 2}, "stop", []Flag{FlagEmpty}},
		{"", []int64{2}, "stop", []Flag{FlagEmpty, FlagOnlyStop}},
		{"cut", []int64{10, 11}, "length", []Flag{FlagLength}},
		{"<think>\nhm", []int64{10, 2}, "stop", []Flag{FlagThink}},
	} {
		if got := rules.Check(c.text, c.out, c.finish); !slices.Equal(got, c.want) {
			t.Errorf("Check(%q, %v, %s) = %v, want %v", c.text, c.out, c.finish, got, c.want)
		}
	}
	on := rules
	on.ThinkingOff = false
	if got := on.Check("<think>x", []int64{10}, "stop"); len(got) != 0 {
		t.Errorf("a think marker with thinking on was flagged: %v", got)
	}
}

func TestARetryIsTakenWhileAttemptsLastThenItIsADrop(t *testing.T) {
	if a := rules.Decide([]Flag{FlagEmpty}, 1); a != Retry {
		t.Errorf("empty with an attempt left: %s", a)
	}
	if a := rules.Decide([]Flag{FlagEmpty}, 0); a != Drop {
		t.Errorf("empty with no attempt left: %s", a)
	}
	if a := rules.Decide([]Flag{FlagLength}, 0); a != Keep {
		t.Errorf("length (keep): %s", a)
	}
	if a := rules.Decide([]Flag{FlagLength, FlagThink}, 3); a != Drop {
		t.Errorf("length and think (drop): %s", a)
	}
}

// The splice gives the contract's encoding of the regenerated conversation, whatever
// the replies: ended by <|im_end|>, cut short, with the end of turn in or out of the loss.
func TestTheSpliceIsTheTemplatesEncodingOfTheRegeneratedConversation(t *testing.T) {
	ctx := context.Background()
	tok := simulator.Tokenize
	for _, endOfTurn := range []bool{true, false} {
		for _, cut := range []bool{false, true} {
			b := builder{r: SimRenderer{}, endOfTurn: endOfTurn}
			hist := []conversation.Message{{Role: conversation.System, Content: "sys"}, {Role: conversation.User, Content: "q1"}}
			for turn, reply := range []string{"first answer", "second"} {
				if err := b.next(ctx, hist, 2*turn+1); err != nil {
					t.Fatal(err)
				}
				prompt := append(simulator.ChatEncode(hist, endOfTurn).IDs, append([]int64{1}, tok("assistant\n")...)...)
				if !slices.Equal(b.ids, prompt) {
					t.Fatalf("turn %d: the prompt sent is not the template's: %v, want %v", turn, b.ids, prompt)
				}
				out := tok(reply)
				if !cut {
					out = append(out, simulator.ChatIMEnd)
				}
				hist = append(hist, conversation.Message{Role: conversation.Assistant, Content: reply})
				b.reply(out, reply, len(hist))
				if turn == 0 {
					hist = append(hist, conversation.Message{Role: conversation.User, Content: "q2"})
				}
			}
			if _, err := b.close(ctx, hist, len(hist)); err != nil {
				t.Fatal(err)
			}
			want := simulator.ChatEncode(hist, endOfTurn)
			if !slices.Equal(b.ids, want.IDs) || !slices.Equal(b.mask, want.Mask) {
				t.Errorf("end_of_turn include %v, cut %v:\n ids %v\nwant %v\nmask %v\nwant %v", endOfTurn, cut, b.ids, want.IDs, b.mask, want.Mask)
			}
		}
	}
}

func TestATemplateThatRewritesAReplyIsRefusedNotSpliced(t *testing.T) {
	ctx := context.Background()
	b := builder{r: rewriting{}, endOfTurn: true}
	hist := []conversation.Message{{Role: conversation.User, Content: "q"}}
	if err := b.next(ctx, hist, 1); err != nil {
		t.Fatal(err)
	}
	hist = append(hist, conversation.Message{Role: conversation.Assistant, Content: " padded "})
	b.reply(append(simulator.Tokenize(" padded "), 2), " padded ", len(hist))
	_, err := b.close(ctx, hist, 2)
	if err == nil || !strings.HasPrefix(err.Error(), "not_a_token_prefix") {
		t.Fatalf("a trimmed reply was spliced: %v", err)
	}
}

// rewriting is the contract with each message's content trimmed, as Llama 3's template does.
type rewriting struct{ SimRenderer }

func (r rewriting) Text(ctx context.Context, msgs []conversation.Message, tools []json.RawMessage, gen bool) (string, error) {
	trimmed := make([]conversation.Message, len(msgs))
	for i, m := range msgs {
		m.Content = strings.TrimSpace(m.Content)
		trimmed[i] = m
	}
	return r.SimRenderer.Text(ctx, trimmed, tools, gen)
}

// A conversation sent alone onto an idle pool must not wait for a wake-up that no one
// sends (a resumed generate whose first conversation is already isolated).
func TestAConversationSentAloneOnAnIdlePoolIsSentAtOnce(t *testing.T) {
	p := newPool([]Replica{{}, {}}, 3, time.Minute, Health{}, slog.Default())
	for _, r := range p.reps {
		r.ready, r.ctx = true, context.Background()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := p.acquire(ctx, true)
	if err != nil {
		t.Fatalf("acquire alone on an idle pool: %v", err)
	}
	if !s.alone {
		t.Fatal("the slot is not alone")
	}
	if o, err := p.acquire(ctx, false); err != nil || o.rep == s.rep {
		t.Fatalf("another conversation went to the isolated replica or waited: %v", err)
	}
}
