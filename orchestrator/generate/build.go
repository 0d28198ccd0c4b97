package generate

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/extract-dev/extract/internal/conversation"
)

// builder splices one conversation's sample from the template's text, piece by piece,
// and the ids the server generated: before the first turn the prompt's text, encoded;
// after each reply the text the template closes the turn with and the text up to the
// next generation prompt, each encoded on its own (the template's pieces meet at
// special tokens, where encoding apart is encoding together). The ids sent for turn k
// are the sample's ids so far, so the prompt the target saw is the sample's prefix and
// a reply is never re-tokenized. The template must render the history as it rendered
// it before (the previous prompt, then the reply's text, then the close), else the
// conversation is refused: its tokens and its text would disagree.
//
// The mask is 1 on generated tokens, and on an end-of-turn token the template closes a
// reply with that did not end with one (cut at max_new_tokens) when endOfTurn is
// include; a generated end-of-turn token is 0 when it is exclude.
type builder struct {
	r         Renderer
	tools     []json.RawMessage
	endOfTurn bool
	ids, mask []int64
	prompt    string  // the text of the last generation prompt
	content   string  // the last reply's text
	out       []int64 // the last reply's ids
	upTo      int     // the messages up to and with the last reply
}

// errNotPrefix refuses a conversation whose template rewrites history.
type errNotPrefix struct {
	turn int
	what string
}

func (e errNotPrefix) Error() string {
	return fmt.Sprintf("not_a_token_prefix: turn %d: the template's rendering of the regenerated history does not start with %s (it rewrites earlier turns, e.g. trims the reply or drops its reasoning)", e.turn, e.what)
}

func (b *builder) add(ids []int64, loss func(k int, id int64) bool) {
	for k, id := range ids {
		m := int64(0)
		if loss(k, id) {
			m = 1
		}
		b.ids = append(b.ids, id)
		b.mask = append(b.mask, m)
	}
}

func none(int, int64) bool { return false }

// next appends what comes before assistant turn `turn` of hist (hist ends before it):
// the close of the previous reply and the text up to the generation prompt. The ids
// afterwards are the prompt to send.
func (b *builder) next(ctx context.Context, hist []conversation.Message, turn int) error {
	p, err := b.r.Text(ctx, hist, b.tools, true)
	if err != nil {
		return fmt.Errorf("template_error: turn %d: %w", turn, err)
	}
	rest := p
	if len(b.ids) > 0 {
		a, err := b.close(ctx, hist[:b.upTo], turn)
		if err != nil {
			return err
		}
		if !strings.HasPrefix(p, a) {
			return errNotPrefix{turn, "the rendering of the turns before"}
		}
		rest = p[len(a):]
	}
	ids, err := b.r.Encode(ctx, rest)
	if err != nil {
		return fmt.Errorf("encode turn %d's prompt: %w", turn, err)
	}
	b.add(ids, none)
	b.prompt = p
	return nil
}

// reply appends the generated ids, in the loss; upTo counts the messages up to and
// with this reply.
func (b *builder) reply(out []int64, text string, upTo int) {
	eot := b.r.EndOfTurn()
	b.add(out, func(k int, id int64) bool {
		_, isEOT := eot[id]
		return !(k == len(out)-1 && isEOT && !b.endOfTurn)
	})
	b.content, b.out, b.upTo = text, out, upTo
}

// close appends the template's close of the last reply (hist ends with it) and returns
// the rendering of hist without a generation prompt.
func (b *builder) close(ctx context.Context, hist []conversation.Message, turn int) (string, error) {
	a, err := b.r.Text(ctx, hist, b.tools, false)
	if err != nil {
		return "", fmt.Errorf("template_error: turn %d: %w", turn, err)
	}
	pre := b.prompt + b.content
	if !strings.HasPrefix(a, pre) {
		return "", errNotPrefix{turn, "the previous prompt and reply"}
	}
	closing := a[len(pre):]
	eot := b.r.EndOfTurn()
	ended := false
	if n := len(b.out); n > 0 {
		if t, ok := eot[b.out[n-1]]; ok {
			ended = true
			// The reply's own end-of-turn token is the close's first text.
			closing = strings.TrimPrefix(closing, t)
		}
	}
	ids, err := b.r.Encode(ctx, closing)
	if err != nil {
		return "", fmt.Errorf("encode the close of turn %d: %w", turn, err)
	}
	b.add(ids, func(k int, id int64) bool {
		_, isEOT := eot[id]
		return k == 0 && !ended && isEOT && b.endOfTurn
	})
	b.prompt, b.content, b.out = "", "", nil
	return a, nil
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
