package prepare

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/extract-dev/extract/internal/conversation"
	"github.com/extract-dev/extract/internal/userfile"
)

// Shown is one conversation as prepare makes it, for a person to check the mask.
type Shown struct {
	Line      int
	ID        string
	Enc       conversation.Encoding
	Pieces    []string
	Truncated bool
	Refusal   *conversation.Refusal
}

// Show prepares the conversation on line (1-based) of o.From alone, writing nothing.
func Show(ctx context.Context, o Options, tok Tokenizer, line int) (Shown, error) {
	o.defaults()
	f, err := userfile.OpenRegular(o.From)
	if err != nil {
		return Shown{}, fmt.Errorf("%w: %v", ErrBadInput, err)
	}
	defer f.Close()
	s := conversation.NewScanner(f, o.Format, o.MaxLineBytes, 0, 1)
	for {
		l, err := s.Next()
		if errors.Is(err, io.EOF) {
			return Shown{}, fmt.Errorf("%w: %s has %d lines, no line %d", ErrBadInput, o.From, s.LineNumber(), line)
		}
		if err != nil {
			return Shown{}, err
		}
		if s.LineNumber() < line {
			continue
		}
		b := &batch{lines: []conversation.Line{l}, keep: true}
		o.Strict = false
		if err := encode(ctx, o, tok, 0, b); err != nil {
			return Shown{}, err
		}
		r := b.results[0]
		sh := Shown{Line: line, ID: l.Conversation.ID, Refusal: r.refusal, Truncated: r.truncated}
		if r.refusal != nil {
			sh.ID = r.refusal.ID
			return sh, nil
		}
		sh.Enc = r.enc
		sh.Pieces, err = tok.Pieces(ctx, sh.Enc.IDs)
		return sh, err
	}
}

// ANSI colours for a terminal: the loss in green on a dark background, the rest dim.
const (
	ansiLoss  = "\x1b[1;32m"
	ansiOther = "\x1b[2m"
	ansiReset = "\x1b[0m"
)

// Render writes what Show found: the tokens as they decode with the loss spans marked
// (colour on a terminal, [[ ]] in a pipe), the counts, and each span with its rule.
func (s Shown) Render(w io.Writer, color bool) {
	fmt.Fprintf(w, "line %d", s.Line)
	if s.ID != "" {
		fmt.Fprintf(w, " (id %s)", s.ID)
	}
	if s.Refusal != nil {
		fmt.Fprintf(w, ": refused: %s: %s\n", s.Refusal.Reason, s.Refusal.Detail)
		return
	}
	cut := ""
	if s.Truncated {
		cut = ", truncated (prepare.max_tokens)"
	}
	fmt.Fprintf(w, ": %d tokens, %d in the loss%s\n\n", len(s.Enc.IDs), s.Enc.LossTokens(), cut)
	var b strings.Builder
	for i := 0; i < len(s.Enc.IDs); {
		j := i
		for j < len(s.Enc.IDs) && s.Enc.Mask[j] == s.Enc.Mask[i] {
			j++
		}
		text := strings.Join(s.Pieces[i:j], "")
		loss := s.Enc.Mask[i] == 1
		switch {
		case color && loss:
			b.WriteString(ansiLoss + text + ansiReset)
		case color:
			b.WriteString(ansiOther + text + ansiReset)
		case loss:
			b.WriteString("[[" + text + "]]")
		default:
			b.WriteString(text)
		}
		i = j
	}
	fmt.Fprintln(w, b.String())
	if color {
		fmt.Fprintf(w, "\n%sgreen%s: in the loss; %sdim%s: not\n", ansiLoss, ansiReset, ansiOther, ansiReset)
	} else {
		fmt.Fprintln(w, "\n[[ ]]: in the loss")
	}
	fmt.Fprintln(w, "\nspans (tokens [start, end), loss, turn, rule):")
	for _, sp := range s.Enc.Spans {
		loss := "-"
		if sp.Loss {
			loss = "loss"
		}
		turn := "-"
		if sp.Turn >= 0 {
			turn = fmt.Sprint(sp.Turn)
		}
		fmt.Fprintf(w, "  %6d %6d  %-4s  turn %-3s %s\n", sp.Start, sp.End, loss, turn, sp.Rule)
	}
}
