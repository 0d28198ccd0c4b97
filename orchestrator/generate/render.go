package generate

import (
	"context"
	"encoding/json"

	"github.com/extract-dev/extract/internal/conversation"
	"github.com/extract-dev/extract/sglang/simulator"
)

// Renderer is the target's chat template: the ids of a conversation so far, with the
// generation prompt (Prompt) or without (Full).
type Renderer interface {
	Prompt(ctx context.Context, msgs []conversation.Message, tools []json.RawMessage) ([]int64, error)
	Full(ctx context.Context, msgs []conversation.Message, tools []json.RawMessage) ([]int64, error)
	// EndOfTurn are the tokens that end an assistant turn (the tokenizer's eos and the
	// convention's end-of-turn tokens).
	EndOfTurn() []int64
	// Identity is what the rendering depends on (tokenizer files, template), for the
	// index's fingerprint.
	Identity() string
}

// SimRenderer is the simulator's chat contract (simulator.ChatEncode).
type SimRenderer struct{}

var simPrompt = append([]int64{simulator.ChatIMStart}, simulator.Tokenize("assistant\n")...)

// Prompt is the contract's rendering plus <|im_start|>assistant\n.
func (SimRenderer) Prompt(_ context.Context, msgs []conversation.Message, _ []json.RawMessage) ([]int64, error) {
	return append(simulator.ChatEncode(msgs, true).IDs, simPrompt...), nil
}

// Full is the contract's rendering.
func (SimRenderer) Full(_ context.Context, msgs []conversation.Message, _ []json.RawMessage) ([]int64, error) {
	return simulator.ChatEncode(msgs, true).IDs, nil
}

// EndOfTurn is <|im_end|>.
func (SimRenderer) EndOfTurn() []int64 { return []int64{simulator.ChatIMEnd} }

// Identity names the contract's version.
func (SimRenderer) Identity() string { return "simulator-chat-v1" }
