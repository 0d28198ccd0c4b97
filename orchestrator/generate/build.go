package generate

import (
	"fmt"
	"slices"

	"github.com/extract-dev/extract/internal/conversation"
)

// builder assembles one conversation's sample from the rendered prompts and the ids the
// server generated, never from a re-tokenization of the text. Before each assistant
// turn the template renders the regenerated history with the generation prompt; that
// rendering must extend the ids so far token for token (the prompt of turn k holds turn
// k−1's generated ids as they were generated), else the conversation is refused: its
// tokens and its text would disagree. The loss mask is 1 on generated tokens, and on an
// end-of-turn token the template adds after a reply that did not end with one (cut at
// max_new_tokens) when endOfTurn is include; an end-of-turn token the server generated
// is 0 when it is exclude.
type builder struct {
	eot       map[int64]bool
	endOfTurn bool // prepare.end_of_turn: include
	ids, mask []int64
	replied   bool // a reply was added and it did not end with an end-of-turn token
}

// errNotPrefix refuses a conversation whose template rewrites history.
type errNotPrefix struct{ turn int }

func (e errNotPrefix) Error() string {
	return fmt.Sprintf("turn %d: the template's rendering of the regenerated history is not the previous prompt and reply token for token (it rewrites earlier turns, e.g. drops their reasoning)", e.turn)
}

// extend appends the template's rendering r (of everything so far and more) past the
// ids already held; turn names the message for the refusal.
func (b *builder) extend(r []int64, turn int) error {
	if len(r) < len(b.ids) || !slices.Equal(r[:len(b.ids)], b.ids) {
		return errNotPrefix{turn}
	}
	for i, id := range r[len(b.ids):] {
		m := int64(0)
		if i == 0 && b.replied && b.eot[id] && b.endOfTurn {
			m = 1 // the end of a reply cut short, as the template closes it
		}
		b.ids = append(b.ids, id)
		b.mask = append(b.mask, m)
	}
	b.replied = false
	return nil
}

// reply appends generated ids, in the loss.
func (b *builder) reply(out []int64) {
	for i, id := range out {
		m := int64(1)
		if i == len(out)-1 && b.eot[id] && !b.endOfTurn {
			m = 0
		}
		b.ids = append(b.ids, id)
		b.mask = append(b.mask, m)
	}
	b.replied = len(out) == 0 || !b.eot[out[len(out)-1]]
}

// trimToLastAssistant drops the messages after the last assistant turn: a user turn
// left unanswered teaches the draft nothing and has no reply to regenerate.
func trimToLastAssistant(msgs []conversation.Message) []conversation.Message {
	for i := len(msgs) - 1; i >= 0; i-- {
		if msgs[i].Role == conversation.Assistant {
			return msgs[:i+1]
		}
	}
	return nil
}
