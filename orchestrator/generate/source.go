package generate

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/extract-dev/extract/internal/conversation"
	"github.com/extract-dev/extract/internal/userfile"
)

// source is what the fingerprint and the shard span need of the conversation file.
type source struct {
	sha256 string
	lines  int
}

// openRegular opens the conversation file as every file a user names is opened
// (userfile.OpenRegular: never blocking on a FIFO, only a regular file).
func openRegular(path string) (*os.File, error) {
	f, err := userfile.OpenRegular(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadInput, err)
	}
	return f, nil
}

// scanSource hashes the file and counts its lines (a last line without a newline counts).
func scanSource(path string) (source, error) {
	f, err := openRegular(path)
	if err != nil {
		return source{}, err
	}
	defer func() { _ = f.Close() }() // read only
	h := sha256.New()
	r := bufio.NewReaderSize(f, 1<<20)
	var s source
	last := byte('\n')
	buf := make([]byte, 1<<20)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			h.Write(buf[:n])
			for _, c := range buf[:n] {
				if c == '\n' {
					s.lines++
				}
			}
			last = buf[n-1]
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return source{}, fmt.Errorf("%w: read %s: %v", ErrBadInput, path, err)
		}
	}
	if last != '\n' {
		s.lines++
	}
	s.sha256 = hex.EncodeToString(h.Sum(nil))
	return s, nil
}

// readMissing sends the lines in [lo, hi) without a record, in file order.
func readMissing(ctx context.Context, o Options, fin map[int]State, lo, hi int, todo chan<- work) error {
	f, err := openRegular(o.From)
	if err != nil {
		return err
	}
	defer func() { _ = f.Close() }() // read only
	sc := conversation.NewScanner(f, o.Format, o.MaxLine, 0, 1)
	for s := 0; s < hi; s++ {
		l, err := sc.Next()
		if errors.Is(err, io.EOF) {
			return fmt.Errorf("%w: %s ends at line %d; it had %d lines when hashed", ErrBadInput, o.From, s, hi)
		}
		if err != nil {
			return fmt.Errorf("%w: %s: %v", ErrBadInput, o.From, err)
		}
		if _, done := fin[s]; done || s < lo {
			continue
		}
		select {
		case todo <- work{sample: s, line: l}:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// digest is a short hash of the option lines.
func digest(lines []string) string {
	h := sha256.Sum256([]byte(strings.Join(lines, "\n")))
	return hex.EncodeToString(h[:8])
}

// diff names what differs between two definitions, "" when none does.
func (m Meta) diff(o Meta) string {
	var d []string
	if m.Conversations != o.Conversations || m.Lines != o.Lines {
		d = append(d, fmt.Sprintf("the conversation file (%s, %d lines, sha256 %.12s…; now %s, %d lines, sha256 %.12s…)", m.Source, m.Lines, m.Conversations, o.Source, o.Lines, o.Conversations))
	}
	if m.Renderer != o.Renderer {
		d = append(d, fmt.Sprintf("the tokenizer or chat template (%s; now %s)", m.Renderer, o.Renderer))
	}
	if m.Options != o.Options {
		d = append(d, "the sampling or validation keys ("+changedOptions(m.OptionsText, o.OptionsText)+")")
	}
	if m.Lo != o.Lo || m.Hi != o.Hi {
		d = append(d, fmt.Sprintf("the shard's lines (%d..%d; now %d..%d)", m.Lo, m.Hi, o.Lo, o.Hi))
	}
	return strings.Join(d, "; ")
}

func changedOptions(a, b []string) string {
	in := map[string]bool{}
	for _, x := range a {
		in[x] = true
	}
	var out []string
	for _, x := range b {
		if !in[x] {
			out = append(out, "now "+x)
		}
	}
	return strings.Join(out, ", ")
}

func parentDir(p string) string { return filepath.Dir(p) }
