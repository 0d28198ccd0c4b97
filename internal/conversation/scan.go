package conversation

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
)

// Line is one line of a conversation file as Scanner reads it: either a conversation or
// the reason it was refused, and where it ends in the file (for resuming after it).
type Line struct {
	Conversation Conversation
	Refusal      *Refusal
	End          int64 // byte offset just past the line's newline
}

// Scanner reads a conversation file line by line. A line longer than MaxLine bytes is
// refused (LineTooLong) and skipped without being held in memory.
type Scanner struct {
	r       *bufio.Reader
	format  Format
	maxLine int
	line    int   // lines read so far
	off     int64 // bytes read so far
	buf     []byte
}

// NewScanner reads r, whose first byte is at offset start and is the start of line
// firstLine (1-based), so a resumed scan keeps the file's line numbers.
func NewScanner(r io.Reader, format Format, maxLine int, start int64, firstLine int) *Scanner {
	return &Scanner{r: bufio.NewReaderSize(r, 1<<20), format: format, maxLine: maxLine, line: firstLine - 1, off: start}
}

// Next returns the next line, or io.EOF after the last.
func (s *Scanner) Next() (Line, error) {
	s.buf = s.buf[:0]
	tooLong := false
	total := 0
	for {
		chunk, err := s.r.ReadSlice('\n')
		total += len(chunk)
		if !tooLong {
			if len(s.buf)+len(chunk) > s.maxLine+2 { // +2: the newline, and a \r before it
				tooLong = true
				s.buf = s.buf[:0]
			} else {
				s.buf = append(s.buf, chunk...)
			}
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if err == io.EOF && total == 0 {
			return Line{}, io.EOF
		}
		if err != nil && err != io.EOF {
			return Line{}, fmt.Errorf("read line %d: %w", s.line+1, err)
		}
		break
	}
	s.line++
	s.off += int64(total)
	l := Line{End: s.off}
	body := bytes.TrimRight(s.buf, "\r\n")
	if tooLong || len(body) > s.maxLine {
		l.Refusal = &Refusal{Line: s.line, Reason: LineTooLong, Detail: fmt.Sprintf("the line is longer than %d bytes (prepare.max_line_bytes)", s.maxLine)}
		return l, nil
	}
	c, ref := Parse(body, s.line, s.format)
	l.Conversation, l.Refusal = c, ref
	return l, nil
}

// LineNumber is the number of lines read so far.
func (s *Scanner) LineNumber() int { return s.line }
