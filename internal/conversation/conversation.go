// Package conversation reads the conversation datasets people hold (ShareGPT, OpenAI-style
// messages, UltraChat) into one neutral form, line by line, and refuses a line that is not
// a usable conversation with its line number and a reason code. It does no I/O beyond the
// reader it is given and knows nothing of tokenizers: turning a conversation into tokens
// and a loss mask is the caller's job (orchestrator/prepare).
//
// What it keeps: a refused line never stops the others (the caller decides about
// strictness); every accepted conversation has at least one assistant turn with content
// or tool calls, only known roles, and valid UTF-8 in every string; a conversation's own
// id (`id`, `conversation_id`, `prompt_id`) is kept as written.
package conversation

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"
)

// Format is a conversation file's layout.
type Format string

// The formats read. Auto detects each line's format from its keys.
const (
	Auto      Format = "auto"
	ShareGPT  Format = "sharegpt"  // {"conversations": [{"from": "human", "value": "..."}]}
	OpenAI    Format = "openai"    // {"messages": [{"role": "user", "content": "..."}]}
	UltraChat Format = "ultrachat" // {"id": ..., "data": ["user turn", "assistant turn", ...]}
)

// ParseFormat checks a dataset_format value ("" is auto).
func ParseFormat(s string) (Format, error) {
	switch f := Format(s); f {
	case "":
		return Auto, nil
	case Auto, ShareGPT, OpenAI, UltraChat:
		return f, nil
	}
	return "", fmt.Errorf("unknown conversation format %q (want auto, sharegpt, openai or ultrachat)", s)
}

// Role is a message's speaker, normalised across formats.
type Role string

// The roles a conversation may hold.
const (
	System    Role = "system"
	User      Role = "user"
	Assistant Role = "assistant"
	Tool      Role = "tool"
)

// Message is one turn. Content is the text; Reasoning is an assistant's
// reasoning_content; ToolCalls are an assistant's tool calls as written (OpenAI's objects).
type Message struct {
	Role       Role              `json:"role"`
	Content    string            `json:"content"`
	Reasoning  string            `json:"reasoning_content,omitempty"`
	ToolCalls  []json.RawMessage `json:"tool_calls,omitempty"`
	ToolCallID string            `json:"tool_call_id,omitempty"`
	Name       string            `json:"name,omitempty"`
}

// Conversation is one accepted line.
type Conversation struct {
	Line     int    // 1-based line number in the file
	ID       string // the line's own id, "" when it has none
	Format   Format
	Messages []Message
	// Tools are the OpenAI-style tool definitions given beside the messages, as written.
	Tools []json.RawMessage
}

// Reason is why a line was refused: a stable code that summaries count by.
type Reason string

// The reasons a line is refused at parsing.
const (
	NotConversation Reason = "not_conversation"
	UnknownRole     Reason = "unknown_role"
	EmptyAssistant  Reason = "empty_assistant_turn"
	NoAssistant     Reason = "no_assistant_turn"
	InvalidUTF8     Reason = "invalid_utf8"
	LineTooLong     Reason = "line_too_long"
)

// Refusal is a refused line: where, which conversation (when its id could be read), why.
type Refusal struct {
	Line   int    `json:"line"`
	ID     string `json:"id,omitempty"`
	Reason Reason `json:"reason"`
	Detail string `json:"detail"`
}

func (r *Refusal) Error() string {
	id := ""
	if r.ID != "" {
		id = fmt.Sprintf(" (id %s)", r.ID)
	}
	return fmt.Sprintf("line %d%s: %s: %s", r.Line, id, r.Reason, r.Detail)
}

// shareGPTRoles maps the speaker names ShareGPT-style files use (FastChat, LLaMA-Factory,
// Vicuna's dumps) to roles. Anything else is refused rather than guessed.
var shareGPTRoles = map[string]Role{
	"system": System, "human": User, "user": User,
	"gpt": Assistant, "assistant": Assistant, "chatgpt": Assistant, "bard": Assistant, "bing": Assistant, "model": Assistant,
	"tool": Tool, "function": Tool, "observation": Tool,
}

// openAIRoles: OpenAI's chat roles; "developer" is the newer name of "system".
var openAIRoles = map[string]Role{
	"system": System, "developer": System, "user": User, "assistant": Assistant, "tool": Tool, "function": Tool,
}

type rawLine struct {
	ID             json.RawMessage   `json:"id"`
	ConversationID json.RawMessage   `json:"conversation_id"`
	PromptID       json.RawMessage   `json:"prompt_id"`
	Conversations  json.RawMessage   `json:"conversations"`
	Messages       json.RawMessage   `json:"messages"`
	Data           json.RawMessage   `json:"data"`
	Tools          []json.RawMessage `json:"tools"`
}

type shareGPTTurn struct {
	From  *string `json:"from"`
	Value *string `json:"value"`
}

type openAIMessage struct {
	Role             *string           `json:"role"`
	Content          json.RawMessage   `json:"content"`
	ReasoningContent *string           `json:"reasoning_content"`
	Reasoning        *string           `json:"reasoning"`
	ToolCalls        []json.RawMessage `json:"tool_calls"`
	ToolCallID       string            `json:"tool_call_id"`
	Name             string            `json:"name"`
}

// Parse reads one line (without its newline). lineNo is 1-based; f forces a format, or
// Auto detects it from the line's keys.
func Parse(line []byte, lineNo int, f Format) (Conversation, *Refusal) {
	refuse := func(id string, r Reason, format string, a ...any) (Conversation, *Refusal) {
		return Conversation{}, &Refusal{Line: lineNo, ID: id, Reason: r, Detail: fmt.Sprintf(format, a...)}
	}
	// encoding/json turns invalid UTF-8 into U+FFFD without a word: the text the model
	// would see is not the text in the file.
	if !utf8.Valid(line) {
		return refuse("", InvalidUTF8, "the line is not valid UTF-8 (at byte %d)", firstInvalid(line))
	}
	if len(bytes.TrimSpace(line)) == 0 {
		return refuse("", NotConversation, "empty line")
	}
	var raw rawLine
	dec := json.NewDecoder(bytes.NewReader(line))
	if err := dec.Decode(&raw); err != nil {
		return refuse("", NotConversation, "not a JSON object: %v", err)
	}
	if dec.More() {
		return refuse("", NotConversation, "more than one JSON value on the line")
	}
	c := Conversation{Line: lineNo, ID: firstID(raw.ID, raw.ConversationID, raw.PromptID), Tools: raw.Tools}
	format := f
	if format == Auto {
		switch {
		case present(raw.Conversations):
			format = ShareGPT
		case present(raw.Messages):
			format = OpenAI
		case present(raw.Data):
			format = UltraChat
		default:
			return refuse(c.ID, NotConversation, `no "conversations", "messages" or "data" list`)
		}
	}
	c.Format = format
	var err *Refusal
	switch format {
	case ShareGPT:
		c.Messages, err = parseShareGPT(raw.Conversations)
	case OpenAI:
		c.Messages, err = parseOpenAI(raw.Messages)
	case UltraChat:
		c.Messages, err = parseUltraChat(raw.Data)
	}
	if err != nil {
		err.Line, err.ID = lineNo, c.ID
		return Conversation{}, err
	}
	if err := check(c.Messages); err != nil {
		err.Line, err.ID = lineNo, c.ID
		return Conversation{}, err
	}
	// A lone surrogate escape (\udc80) decodes to U+FFFD as silently as a bad byte does.
	if !bytes.Contains(line, []byte(`\u`)) || bytes.ContainsRune(line, utf8.RuneError) || bytes.Contains(bytes.ToLower(line), []byte(`\ufffd`)) {
		return c, nil // no escape, or a real U+FFFD in the text: nothing was replaced
	}
	for i, m := range c.Messages {
		if strings.ContainsRune(m.Content, utf8.RuneError) || strings.ContainsRune(m.Reasoning, utf8.RuneError) {
			return refuse(c.ID, InvalidUTF8, "message %d holds a lone UTF-16 surrogate escape", i)
		}
	}
	return c, nil
}

func present(r json.RawMessage) bool { return len(r) > 0 && string(r) != "null" }

func bad(r Reason, format string, a ...any) *Refusal {
	return &Refusal{Reason: r, Detail: fmt.Sprintf(format, a...)}
}

func parseShareGPT(r json.RawMessage) ([]Message, *Refusal) {
	var turns []shareGPTTurn
	if err := json.Unmarshal(r, &turns); err != nil {
		return nil, bad(NotConversation, `"conversations" is not a list of {"from", "value"}: %v`, err)
	}
	out := make([]Message, 0, len(turns))
	for i, t := range turns {
		if t.From == nil || t.Value == nil {
			return nil, bad(NotConversation, `"conversations"[%d] lacks "from" or "value"`, i)
		}
		role, ok := shareGPTRoles[strings.ToLower(*t.From)]
		if !ok {
			return nil, bad(UnknownRole, `"conversations"[%d] is from %q (known: human, user, gpt, assistant, system, tool, ...)`, i, *t.From)
		}
		out = append(out, Message{Role: role, Content: *t.Value})
	}
	return out, nil
}

func parseOpenAI(r json.RawMessage) ([]Message, *Refusal) {
	var msgs []openAIMessage
	if err := json.Unmarshal(r, &msgs); err != nil {
		return nil, bad(NotConversation, `"messages" is not a list of {"role", "content"}: %v`, err)
	}
	out := make([]Message, 0, len(msgs))
	for i, m := range msgs {
		if m.Role == nil {
			return nil, bad(NotConversation, `"messages"[%d] has no "role"`, i)
		}
		role, ok := openAIRoles[*m.Role]
		if !ok {
			return nil, bad(UnknownRole, `"messages"[%d] has role %q (known: system, developer, user, assistant, tool)`, i, *m.Role)
		}
		content, err := openAIContent(m.Content)
		if err != nil {
			return nil, bad(NotConversation, `"messages"[%d].content: %v`, i, err)
		}
		msg := Message{Role: role, Content: content, ToolCalls: m.ToolCalls, ToolCallID: m.ToolCallID, Name: m.Name}
		switch {
		case m.ReasoningContent != nil:
			msg.Reasoning = *m.ReasoningContent
		case m.Reasoning != nil:
			msg.Reasoning = *m.Reasoning
		}
		if role != Assistant && (msg.Reasoning != "" || len(msg.ToolCalls) > 0) {
			return nil, bad(NotConversation, `"messages"[%d] is a %s turn with reasoning or tool calls (only assistant turns have them)`, i, role)
		}
		out = append(out, msg)
	}
	return out, nil
}

// openAIContent is a message's text: a string, null (an assistant turn of tool calls
// only), or a list of {"type": "text", "text": ...} parts joined. Other parts (images,
// audio) are refused: a text tokenizer cannot render them.
func openAIContent(r json.RawMessage) (string, error) {
	if !present(r) {
		return "", nil
	}
	var s string
	if json.Unmarshal(r, &s) == nil {
		return s, nil
	}
	var parts []struct {
		Type string  `json:"type"`
		Text *string `json:"text"`
	}
	if err := json.Unmarshal(r, &parts); err != nil {
		return "", fmt.Errorf("neither a string nor a list of parts")
	}
	var b strings.Builder
	for i, p := range parts {
		if p.Type != "text" || p.Text == nil {
			return "", fmt.Errorf("part %d is of type %q; only text parts can be tokenized", i, p.Type)
		}
		b.WriteString(*p.Text)
	}
	return b.String(), nil
}

// parseUltraChat reads UltraChat's original layout: turns alternate, the user first.
func parseUltraChat(r json.RawMessage) ([]Message, *Refusal) {
	var turns []string
	if err := json.Unmarshal(r, &turns); err != nil {
		return nil, bad(NotConversation, `"data" is not a list of strings: %v`, err)
	}
	out := make([]Message, len(turns))
	for i, t := range turns {
		role := User
		if i%2 == 1 {
			role = Assistant
		}
		out[i] = Message{Role: role, Content: t}
	}
	return out, nil
}

// check holds what every accepted conversation has: turns, an assistant turn, and no
// assistant turn with nothing to learn from.
func check(msgs []Message) *Refusal {
	if len(msgs) == 0 {
		return bad(NotConversation, "no turns")
	}
	assistants := 0
	for i, m := range msgs {
		if m.Role != Assistant {
			continue
		}
		assistants++
		if strings.TrimSpace(m.Content) == "" && len(m.ToolCalls) == 0 {
			return bad(EmptyAssistant, "turn %d is an assistant turn with no content and no tool calls", i)
		}
	}
	if assistants == 0 {
		return bad(NoAssistant, "no assistant turn: nothing to learn from")
	}
	return nil
}

// firstID is the first of the id keys present, as written: a string's value, a number's
// digits.
func firstID(rs ...json.RawMessage) string {
	for _, r := range rs {
		if !present(r) {
			continue
		}
		var s string
		if json.Unmarshal(r, &s) == nil {
			return s
		}
		var n json.Number
		if json.Unmarshal(r, &n) == nil {
			return n.String()
		}
	}
	return ""
}

func firstInvalid(b []byte) int {
	for i := 0; i < len(b); {
		r, n := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && n <= 1 {
			return i
		}
		i += n
	}
	return len(b)
}
