package generate

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/extract-dev/extract/internal/conversation"
	"github.com/extract-dev/extract/sglang/simulator"
	"github.com/extract-dev/extract/sglang/tokenizer"
)

// Renderer is the target's chat template and tokenizer, as text and ids apart: the
// sample is spliced from the template's text pieces, each encoded, and the ids the
// server generated, so a reply's text never has to round-trip through the tokenizer.
type Renderer interface {
	// Text renders msgs, with the generation prompt or without.
	Text(ctx context.Context, msgs []conversation.Message, tools []json.RawMessage, generationPrompt bool) (string, error)
	// Encode encodes one piece of rendered text (special tokens in it are the tokens).
	Encode(ctx context.Context, text string) ([]int64, error)
	// EndOfTurn are the tokens that end an assistant turn, each with its text.
	EndOfTurn() map[int64]string
	// Identity is what the rendering depends on (tokenizer files, template), for the
	// index's fingerprint.
	Identity() string
}

// SimRenderer is the simulator's chat contract (simulator.ChatEncode) as text:
// <|im_start|> and <|im_end|> are its two special tokens, every other byte b is b+3.
type SimRenderer struct{}

const (
	simStart = "<|im_start|>"
	simEnd   = "<|im_end|>"
)

// Text renders by the contract.
func (SimRenderer) Text(_ context.Context, msgs []conversation.Message, tools []json.RawMessage, gen bool) (string, error) {
	if len(tools) > 0 {
		return "", fmt.Errorf("the simulator's template renders no tool definitions")
	}
	var b strings.Builder
	for _, m := range msgs {
		body := m.Content
		if m.Role == conversation.Assistant && m.Reasoning != "" {
			body = "<think>\n" + m.Reasoning + "\n</think>\n" + body
		}
		b.WriteString(simStart + string(m.Role) + "\n" + body + simEnd + "\n")
	}
	if gen {
		b.WriteString(simStart + "assistant\n")
	}
	return b.String(), nil
}

// Encode maps the two markers to 1 and 2 and each other byte b to b+3.
func (SimRenderer) Encode(_ context.Context, text string) ([]int64, error) {
	var ids []int64
	for len(text) > 0 {
		switch {
		case strings.HasPrefix(text, simStart):
			ids, text = append(ids, simulator.ChatIMStart), text[len(simStart):]
		case strings.HasPrefix(text, simEnd):
			ids, text = append(ids, simulator.ChatIMEnd), text[len(simEnd):]
		default:
			ids, text = append(ids, int64(text[0])+3), text[1:]
		}
	}
	return ids, nil
}

// EndOfTurn is <|im_end|>.
func (SimRenderer) EndOfTurn() map[int64]string { return map[int64]string{simulator.ChatIMEnd: simEnd} }

// Identity names the contract's version.
func (SimRenderer) Identity() string { return "simulator-chat-v1" }

// PoolRenderer is the target's own tokenizer and chat template in server.python
// (sglang/tokenizer), the ones prepare uses.
type PoolRenderer struct {
	Pool *tokenizer.Pool
	EOT  map[int64]string
	// ID names the tokenizer files and the template (Pool.Identity).
	ID string
}

// Text renders msgs with the target's template.
func (r PoolRenderer) Text(ctx context.Context, msgs []conversation.Message, tools []json.RawMessage, gen bool) (string, error) {
	return r.Pool.RenderText(ctx, len(msgs), msgs, tools, gen)
}

// Encode encodes text with the target's tokenizer.
func (r PoolRenderer) Encode(ctx context.Context, text string) ([]int64, error) {
	return r.Pool.EncodeText(ctx, len(text), text)
}

// EndOfTurn are the tokenizer's end-of-turn ids.
func (r PoolRenderer) EndOfTurn() map[int64]string { return r.EOT }

// Identity is the tokenizer's and the template's digests.
func (r PoolRenderer) Identity() string { return r.ID }
