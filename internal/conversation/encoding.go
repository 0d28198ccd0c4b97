package conversation

import "fmt"

// The reasons a conversation is refused after parsing: by the policy keys, by the
// tokenizer's template, or by the length policy.
const (
	ReasoningRefused Reason = "reasoning_refused"           // prepare.reasoning: refuse
	ToolsRefused     Reason = "tool_calls_refused"          // prepare.tools: refuse
	TemplateError    Reason = "template_error"              // the chat template raised
	NotPrefix        Reason = "not_a_token_prefix"          // a turn's render is not a token prefix of the next
	NoEndOfTurn      Reason = "no_end_of_turn"              // an assistant turn has no end-of-turn token
	EmptyMask        Reason = "empty_mask"                  // the template's generation tags cover nothing
	CrossesBoundary  Reason = "token_crosses_turn_boundary" // a token is half in a generation block
	TooLong          Reason = "too_long"                    // over prepare.max_tokens, prepare.length_policy: skip
	FewLossTokens    Reason = "too_few_loss_tokens"         // under prepare.min_loss_tokens
)

// Span is a run of tokens [Start, End) of one encoded conversation with the same loss
// value, and the rule that put it there (shown by `extract prepare --show`).
type Span struct {
	Start int    `json:"start"`
	End   int    `json:"end"`
	Loss  bool   `json:"loss"`
	Turn  int    `json:"turn"` // the message index, -1 for none
	Rule  string `json:"rule"`
}

// Encoding is a conversation as tokens and its assistant loss mask (0 or 1 each).
type Encoding struct {
	IDs   []int64
	Mask  []int64
	Spans []Span
}

// Result is one conversation encoded, or why it was refused.
type Result struct {
	Enc     Encoding
	Refusal *Refusal
}

// LossTokens counts the mask's ones.
func (e Encoding) LossTokens() int {
	n := 0
	for _, m := range e.Mask {
		n += int(m)
	}
	return n
}

// Policy is what to do with the parts of a turn that not every template renders.
type Policy struct {
	// Reasoning: keep (give reasoning_content to the template, which renders it, or not,
	// in its own way; what it renders inside an assistant turn is in the loss), drop
	// (remove it before rendering) or refuse (refuse a conversation that has any).
	Reasoning string
	// Tools: keep (tool calls, tool turns and tool definitions go to the template) or
	// refuse.
	Tools string
	// EndOfTurn: include (the end-of-turn token that closes each assistant turn is in the
	// loss, as SpecForge does) or exclude.
	EndOfTurn string
}

// DefaultPolicy keeps what the template renders and counts the end-of-turn token.
func DefaultPolicy() Policy { return Policy{Reasoning: "keep", Tools: "keep", EndOfTurn: "include"} }

// Check validates the policy's values.
func (p Policy) Check() error {
	for _, k := range []struct{ key, v, allowed string }{
		{"prepare.reasoning", p.Reasoning, "keep drop refuse"},
		{"prepare.tools", p.Tools, "keep refuse"},
		{"prepare.end_of_turn", p.EndOfTurn, "include exclude"},
	} {
		if !oneOf(k.v, k.allowed) {
			return fmt.Errorf("%s is %q, want one of: %s", k.key, k.v, k.allowed)
		}
	}
	return nil
}

func oneOf(v, allowed string) bool {
	for i, j := 0, 0; j <= len(allowed); j++ {
		if j == len(allowed) || allowed[j] == ' ' {
			if allowed[i:j] == v {
				return true
			}
			i = j + 1
		}
	}
	return false
}

// Apply returns the conversation as the policy lets it reach the template, or refuses it.
// It never changes c's messages in place.
func (p Policy) Apply(c Conversation) (Conversation, *Refusal) {
	tools := len(c.Tools) > 0
	reasoning := false
	for _, m := range c.Messages {
		tools = tools || len(m.ToolCalls) > 0 || m.Role == Tool
		reasoning = reasoning || m.Reasoning != ""
	}
	if tools && p.Tools == "refuse" {
		return Conversation{}, &Refusal{Line: c.Line, ID: c.ID, Reason: ToolsRefused, Detail: "the conversation has tool calls, tool turns or tool definitions (prepare.tools: refuse)"}
	}
	if reasoning && p.Reasoning == "refuse" {
		return Conversation{}, &Refusal{Line: c.Line, ID: c.ID, Reason: ReasoningRefused, Detail: "the conversation has reasoning_content (prepare.reasoning: refuse)"}
	}
	if reasoning && p.Reasoning == "drop" {
		msgs := make([]Message, len(c.Messages))
		copy(msgs, c.Messages)
		for i := range msgs {
			msgs[i].Reasoning = ""
		}
		c.Messages = msgs
	}
	return c, nil
}
