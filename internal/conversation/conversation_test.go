package conversation

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
)

func TestParseReadsEveryFormatIntoTheSameMessages(t *testing.T) {
	want := []Message{{Role: System, Content: "be brief"}, {Role: User, Content: "hi"}, {Role: Assistant, Content: "hello"}}
	for _, tc := range []struct {
		name, line string
		format     Format
		id         string
	}{
		{"sharegpt", `{"id":"a1","conversations":[{"from":"system","value":"be brief"},{"from":"human","value":"hi"},{"from":"gpt","value":"hello"}]}`, ShareGPT, "a1"},
		{"openai", `{"conversation_id":7,"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi"},{"role":"assistant","content":[{"type":"text","text":"hel"},{"type":"text","text":"lo"}]}]}`, OpenAI, "7"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, ref := Parse([]byte(tc.line), 3, Auto)
			if ref != nil {
				t.Fatalf("refused: %v", ref)
			}
			if c.Format != tc.format || c.ID != tc.id || c.Line != 3 {
				t.Fatalf("format %s id %q line %d, want %s %q 3", c.Format, c.ID, c.Line, tc.format, tc.id)
			}
			if len(c.Messages) != len(want) {
				t.Fatalf("messages %+v", c.Messages)
			}
			for i := range want {
				if c.Messages[i].Role != want[i].Role || c.Messages[i].Content != want[i].Content {
					t.Fatalf("message %d = %+v, want %+v", i, c.Messages[i], want[i])
				}
			}
		})
	}
}

func TestParseReadsUltraChatAsAlternatingTurns(t *testing.T) {
	c, ref := Parse([]byte(`{"id":"u","data":["q1","a1","q2","a2"]}`), 1, Auto)
	if ref != nil {
		t.Fatal(ref)
	}
	roles := ""
	for _, m := range c.Messages {
		roles += string(m.Role)[:1]
	}
	if c.Format != UltraChat || roles != "uaua" {
		t.Fatalf("format %s roles %s", c.Format, roles)
	}
}

func TestParseKeepsReasoningAndToolCalls(t *testing.T) {
	line := `{"messages":[{"role":"user","content":"weather?"},{"role":"assistant","content":null,"reasoning_content":"look it up","tool_calls":[{"type":"function","function":{"name":"w","arguments":"{}"}}]},{"role":"tool","tool_call_id":"c1","content":"sunny"},{"role":"assistant","content":"sunny"}],"tools":[{"type":"function"}]}`
	c, ref := Parse([]byte(line), 1, OpenAI)
	if ref != nil {
		t.Fatal(ref)
	}
	if m := c.Messages[1]; m.Reasoning != "look it up" || len(m.ToolCalls) != 1 || m.Content != "" {
		t.Fatalf("assistant turn %+v", m)
	}
	if c.Messages[2].Role != Tool || c.Messages[2].ToolCallID != "c1" || len(c.Tools) != 1 {
		t.Fatalf("tool turn %+v tools %d", c.Messages[2], len(c.Tools))
	}
}

func TestParseRefusesBadLinesWithTheirReason(t *testing.T) {
	for _, tc := range []struct {
		name, line string
		format     Format
		want       Reason
	}{
		{"not json", `{"messages": [`, Auto, NotConversation},
		{"pre-tokenized", `{"input_ids":[1,2]}`, Auto, NotConversation},
		{"empty", `   `, Auto, NotConversation},
		{"two values", `{"data":["a","b"]} {}`, Auto, NotConversation},
		{"unknown sharegpt speaker", `{"conversations":[{"from":"narrator","value":"x"},{"from":"gpt","value":"y"}]}`, Auto, UnknownRole},
		{"unknown openai role", `{"messages":[{"role":"critic","content":"x"},{"role":"assistant","content":"y"}]}`, Auto, UnknownRole},
		{"empty assistant", `{"messages":[{"role":"user","content":"x"},{"role":"assistant","content":"  "}]}`, Auto, EmptyAssistant},
		{"no assistant", `{"conversations":[{"from":"human","value":"x"}]}`, Auto, NoAssistant},
		{"no turns", `{"messages":[]}`, Auto, NotConversation},
		{"image part", `{"messages":[{"role":"user","content":[{"type":"image_url"}]},{"role":"assistant","content":"y"}]}`, Auto, NotConversation},
		{"invalid utf-8", "{\"data\":[\"a\xff\",\"b\"]}", Auto, InvalidUTF8},
		{"lone surrogate", `{"data":["a\udc80","b"]}`, Auto, InvalidUTF8},
		{"forced format", `{"messages":[{"role":"user","content":"x"},{"role":"assistant","content":"y"}]}`, ShareGPT, NotConversation},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, ref := Parse([]byte(tc.line), 9, tc.format)
			if ref == nil {
				t.Fatal("accepted")
			}
			if ref.Reason != tc.want || ref.Line != 9 {
				t.Fatalf("refused as %s at line %d (%v), want %s at 9", ref.Reason, ref.Line, ref, tc.want)
			}
		})
	}
}

func TestParseAcceptsALiteralReplacementCharacter(t *testing.T) {
	if _, ref := Parse([]byte(`{"data":["a\ufffd","b`+"\uFFFD"+`"]}`), 1, Auto); ref != nil {
		t.Fatalf("refused a real U+FFFD: %v", ref)
	}
}

func TestScannerRefusesALongLineAndGoesOn(t *testing.T) {
	long := `{"data":["` + strings.Repeat("x", 3<<20) + `","y"]}`
	in := `{"data":["a","b"]}` + "\n" + long + "\n" + `{"data":["c","d"]}` // no final newline
	s := NewScanner(strings.NewReader(in), Auto, 1<<20, 0, 1)
	var got []string
	var ends []int64
	for {
		l, err := s.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		ends = append(ends, l.End)
		if l.Refusal != nil {
			got = append(got, string(l.Refusal.Reason))
			if l.Refusal.Line != 2 {
				t.Fatalf("refusal at line %d", l.Refusal.Line)
			}
			continue
		}
		got = append(got, l.Conversation.Messages[0].Content)
	}
	if strings.Join(got, ",") != "a,line_too_long,c" {
		t.Fatalf("lines %v", got)
	}
	if ends[2] != int64(len(in)) || ends[0] != int64(len(`{"data":["a","b"]}`)+1) {
		t.Fatalf("ends %v, file %d bytes", ends, len(in))
	}
}

func TestScannerResumesWithTheFilesLineNumbers(t *testing.T) {
	in := []byte("{\"data\":[\"a\",\"b\"]}\n{\"data\":[\"c\",\"d\"]}\nnot json\n")
	at := int64(bytes.IndexByte(in, '\n') + 1)
	s := NewScanner(bytes.NewReader(in[at:]), Auto, 1<<20, at, 2)
	l, _ := s.Next()
	if l.Conversation.Line != 2 || l.End != int64(len(in))-int64(len("not json\n")) {
		t.Fatalf("line %d end %d", l.Conversation.Line, l.End)
	}
	l, _ = s.Next()
	if l.Refusal == nil || l.Refusal.Line != 3 {
		t.Fatalf("third line %+v", l)
	}
}
