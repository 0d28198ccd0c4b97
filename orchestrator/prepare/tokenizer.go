package prepare

import (
	"context"
	"fmt"

	"github.com/extract-dev/extract/internal/conversation"
	"github.com/extract-dev/extract/sglang/simulator"
)

// Tokenizer turns conversations into tokens and exact assistant masks. Encode is called
// from Workers() goroutines at once, goroutine w always passing worker w, so an
// implementation can give each its own process.
type Tokenizer interface {
	Workers() int
	Encode(ctx context.Context, worker int, convs []conversation.Conversation) ([]conversation.Result, error)
	// Pieces is each token's text, for --show.
	Pieces(ctx context.Context, ids []int64) ([]string, error)
	// Identity is what the prepared data depends on besides the conversations and the
	// options: a digest of the tokenizer's files and one of the chat template.
	Identity() (tokenizer, template string)
	// VocabSize is the target's vocabulary size (the model config's, for vocab_mapping).
	VocabSize() int
	Close() error
}

// Simulator is the simulator's own chat tokenizer (server.kind: simulator), in process.
type Simulator struct {
	EndOfTurn bool // prepare.end_of_turn: include
	N         int  // goroutines
}

// Workers is the number of goroutines to encode on.
func (s Simulator) Workers() int { return max(s.N, 1) }

// Encode encodes by the simulator's contract (simulator.ChatEncode).
func (s Simulator) Encode(ctx context.Context, _ int, convs []conversation.Conversation) ([]conversation.Result, error) {
	out := make([]conversation.Result, len(convs))
	for i, c := range convs {
		if len(c.Tools) > 0 {
			// The contract renders messages only: tool definitions would be dropped
			// silently, and the mask would describe another prompt than the one intended.
			out[i].Refusal = &conversation.Refusal{Reason: conversation.TemplateError, Detail: "the simulator's template renders no tool definitions"}
			continue
		}
		out[i].Enc = simulator.ChatEncode(c.Messages, s.EndOfTurn)
	}
	return out, ctx.Err()
}

// Pieces names 1 and 2 and shows each byte token as its byte.
func (Simulator) Pieces(_ context.Context, ids []int64) ([]string, error) {
	out := make([]string, len(ids))
	for i, id := range ids {
		switch {
		case id == simulator.ChatIMStart:
			out[i] = "<|im_start|>"
		case id == simulator.ChatIMEnd:
			out[i] = "<|im_end|>"
		case id >= 3 && id < simulator.ChatVocabSize:
			out[i] = string([]byte{byte(id - 3)})
		default:
			out[i] = fmt.Sprintf("<%d>", id)
		}
	}
	return out, nil
}

// Identity names the contract's version: it has no files.
func (Simulator) Identity() (string, string) { return "simulator-chat-v1", "simulator-chat-v1" }

// VocabSize is the contract's 259.
func (Simulator) VocabSize() int { return simulator.ChatVocabSize }

// Close does nothing.
func (Simulator) Close() error { return nil }
