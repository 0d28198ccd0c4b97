package simulator

import (
	"github.com/extract-dev/extract/internal/conversation"
)

// The simulator's chat tokenizer, a contract that outside checks compute on their own:
// each UTF-8 byte b is token b+3 (as Tokenize), <|im_start|> is 1, <|im_end|> is 2, and
// the vocabulary is 259 tokens. Each message renders as
//
//	<|im_start|>{role}\n{content}<|im_end|>\n
//
// and the generation prompt is <|im_start|>assistant\n. The loss mask covers the content
// bytes of each assistant turn and its <|im_end|> (with prepare.end_of_turn: include, the
// default); the header and the newline after <|im_end|> are 0.
//
// Beyond the contract's plain messages: an assistant's kept reasoning renders as
// "<think>\n{reasoning}\n</think>\n" before its content, and each kept tool call as
// "\n<tool_call>\n{call as written}\n</tool_call>" after it, both inside the content
// (in the loss); a tool turn's role is "tool".
const (
	ChatIMStart   = 1
	ChatIMEnd     = 2
	ChatVocabSize = 259
)

// ChatEncode renders msgs by the contract above; endOfTurn says whether each assistant
// turn's <|im_end|> is in the loss.
func ChatEncode(msgs []conversation.Message, endOfTurn bool) conversation.Encoding {
	var e conversation.Encoding
	add := func(turn int, loss bool, rule string, ids ...int64) {
		if len(ids) == 0 {
			return
		}
		start := len(e.IDs)
		e.IDs = append(e.IDs, ids...)
		m := int64(0)
		if loss {
			m = 1
		}
		for range ids {
			e.Mask = append(e.Mask, m)
		}
		if n := len(e.Spans); n > 0 && e.Spans[n-1].Loss == loss && e.Spans[n-1].Turn == turn && e.Spans[n-1].Rule == rule {
			e.Spans[n-1].End = len(e.IDs)
			return
		}
		e.Spans = append(e.Spans, conversation.Span{Start: start, End: len(e.IDs), Loss: loss, Turn: turn, Rule: rule})
	}
	for i, m := range msgs {
		assistant := m.Role == conversation.Assistant
		add(i, false, "header", append(append([]int64{ChatIMStart}, Tokenize(string(m.Role))...), '\n'+3)...)
		body := m.Content
		if assistant {
			if m.Reasoning != "" {
				body = "<think>\n" + m.Reasoning + "\n</think>\n" + body
			}
			for _, call := range m.ToolCalls {
				body += "\n<tool_call>\n" + string(call) + "\n</tool_call>"
			}
		}
		rule := "not an assistant turn"
		if assistant {
			rule = "assistant content"
		}
		add(i, assistant, rule, Tokenize(body)...)
		eotRule := "end of turn"
		if assistant && !endOfTurn {
			eotRule = "end of turn (prepare.end_of_turn: exclude)"
		}
		add(i, assistant && endOfTurn, eotRule, ChatIMEnd)
		add(i, false, "separator", '\n'+3)
	}
	return e
}
