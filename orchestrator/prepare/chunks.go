package prepare

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"

	"github.com/extract-dev/extract/internal/atomicfile"
	"github.com/extract-dev/extract/internal/conversation"
)

// lineResult is one source line done: its record in the dataset, or its refusal.
type lineResult struct {
	record    []byte                // a dataset line, newline included; nil when refused
	enc       conversation.Encoding // only when the batch keeps it (Show)
	refusal   *conversation.Refusal
	truncated bool
	tokens    int
	loss      int
	end       int64
	line      int
}

// encode fills b.results: the policy, the tokenizer, then the length policy.
func encode(ctx context.Context, o Options, tok Tokenizer, worker int, b *batch) error {
	b.results = make([]lineResult, len(b.lines))
	var convs []conversation.Conversation
	var at []int
	for i, l := range b.lines {
		r := &b.results[i]
		r.end, r.line = l.End, lineOf(l)
		if l.Refusal != nil {
			r.refusal = l.Refusal
			continue
		}
		c, ref := o.Policy.Apply(l.Conversation)
		if ref != nil {
			r.refusal = ref
			continue
		}
		convs = append(convs, c)
		at = append(at, i)
	}
	if len(convs) == 0 {
		return nil
	}
	res, err := tok.Encode(ctx, worker, convs)
	if err != nil {
		return fmt.Errorf("tokenize lines %d-%d: %w", lineOf(b.lines[0]), lineOf(b.lines[len(b.lines)-1]), err)
	}
	if len(res) != len(convs) {
		return fmt.Errorf("tokenize lines %d-%d: %d results for %d conversations", lineOf(b.lines[0]), lineOf(b.lines[len(b.lines)-1]), len(res), len(convs))
	}
	for k, i := range at {
		r, c := &b.results[i], convs[k]
		ref := res[k].Refusal
		var enc conversation.Encoding
		if ref == nil {
			enc, r.truncated, ref = o.Length.Apply(res[k].Enc)
		}
		if ref == nil {
			ref = checkEncoding(enc)
		}
		if ref != nil {
			ref.Line, ref.ID = c.Line, c.ID
			r.refusal = ref
			continue
		}
		r.tokens, r.loss = len(enc.IDs), enc.LossTokens()
		if b.keep {
			r.enc = enc
		}
		r.record = Record(enc, c.ID, c.Line)
	}
	if o.Strict {
		for _, r := range b.results {
			if r.refusal != nil {
				return fmt.Errorf("%w: %s %v (prepare.strict)", ErrBadInput, o.From, r.refusal)
			}
		}
	}
	return nil
}

// checkEncoding holds what every tokenizer must deliver, whoever wrote it: as many mask
// values as ids, each 0 or 1.
func checkEncoding(e conversation.Encoding) *conversation.Refusal {
	if len(e.IDs) == 0 || len(e.Mask) != len(e.IDs) {
		return &conversation.Refusal{Reason: conversation.TemplateError, Detail: fmt.Sprintf("the tokenizer gave %d ids and %d mask values", len(e.IDs), len(e.Mask))}
	}
	for i, m := range e.Mask {
		if m != 0 && m != 1 {
			return &conversation.Refusal{Reason: conversation.TemplateError, Detail: fmt.Sprintf("mask value %d at token %d", m, i)}
		}
	}
	return nil
}

func lineOf(l conversation.Line) int {
	if l.Refusal != nil {
		return l.Refusal.Line
	}
	return l.Conversation.Line
}

// Record is one line of the prepared dataset: {"input_ids", "loss_mask", "id", "line"}.
func Record(e conversation.Encoding, id string, line int) []byte {
	b := make([]byte, 0, 16+len(e.IDs)*8)
	b = append(b, `{"input_ids":[`...)
	for i, v := range e.IDs {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, v, 10)
	}
	b = append(b, `],"loss_mask":[`...)
	for i, v := range e.Mask {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, byte('0'+v))
	}
	b = append(b, `],"id":`...)
	idJSON, _ := json.Marshal(id) // a string always marshals
	b = append(b, idJSON...)
	b = append(b, `,"line":`...)
	b = strconv.AppendInt(b, int64(line), 10)
	return append(b, "}\n"...)
}

// collect writes chunks in order as their batches come back, each durable before the
// manifest that lists it.
func collect(ctx context.Context, o Options, m *Manifest, done <-chan *batch, sizes <-chan [2]int) error {
	got := map[int][]*batch{}
	want := map[int]int{}
	next := 0
	if n := len(m.Chunks); n > 0 {
		next = m.Chunks[n-1].Index + 1
	}
	flush := func() error {
		for {
			n, ok := want[next]
			if !ok || len(got[next]) != n {
				return nil
			}
			c, err := writeChunk(o.Dir, next, got[next])
			if err != nil {
				return err
			}
			m.Chunks = append(m.Chunks, c)
			if err := writeManifest(o.Dir, *m); err != nil {
				return err
			}
			o.Log.Debug("prepare: chunk written", "chunk", next, "lines", c.Counts.Lines, "accepted", c.Accepted)
			delete(got, next)
			delete(want, next)
			next++
		}
	}
	for done != nil || sizes != nil {
		select {
		case b, ok := <-done:
			if !ok {
				done = nil
				continue
			}
			got[b.chunk] = append(got[b.chunk], b)
		case s, ok := <-sizes:
			if !ok {
				sizes = nil
				continue
			}
			want[s[0]] = s[1]
		case <-ctx.Done():
			return ctx.Err()
		}
		if err := flush(); err != nil {
			return err
		}
	}
	if len(got) > 0 {
		return fmt.Errorf("prepare: chunks %v were not completed", keys(got))
	}
	return nil
}

func keys(m map[int][]*batch) []int {
	var out []int
	for k := range m {
		out = append(out, k)
	}
	return out
}

func chunkPath(dir string, i int, refused bool) string {
	if refused {
		return filepath.Join(dir, "chunks", fmt.Sprintf("chunk-%06d.refused.jsonl", i))
	}
	return filepath.Join(dir, "chunks", fmt.Sprintf("chunk-%06d.jsonl", i))
}

// writeChunk writes the chunk's two files (accepted records, refusals), each durable.
func writeChunk(dir string, index int, bs []*batch) (Chunk, error) {
	ordered := make([]*batch, len(bs))
	for _, b := range bs {
		ordered[b.seq] = b
	}
	// Sized once: a chunk is tens of megabytes, and growing a buffer by doubling would
	// spend more time clearing memory than writing it.
	size := 0
	for _, b := range ordered {
		for _, r := range b.results {
			size += len(r.record)
		}
	}
	acc := bytes.NewBuffer(make([]byte, 0, size))
	var ref bytes.Buffer
	c := Chunk{Index: index, FirstLine: -1}
	for _, b := range ordered {
		for _, r := range b.results {
			if c.FirstLine < 0 {
				c.FirstLine = r.line
			}
			c.LastLine, c.End = r.line, r.end
			c.Counts.Lines++
			if r.refusal != nil {
				if c.Counts.Refused == nil {
					c.Counts.Refused = map[string]int{}
				}
				c.Counts.Refused[string(r.refusal.Reason)]++
				line, _ := json.Marshal(r.refusal)
				ref.Write(append(line, '\n'))
				continue
			}
			c.Accepted++
			c.Counts.Accepted++
			c.Counts.Tokens += int64(r.tokens)
			c.Counts.Loss += int64(r.loss)
			if r.truncated {
				c.Counts.Truncated++
			}
			acc.Write(r.record)
		}
	}
	if err := atomicfile.WriteFile(chunkPath(dir, index, true), ref.Bytes(), 0o644); err != nil {
		return Chunk{}, err
	}
	if err := atomicfile.WriteFile(chunkPath(dir, index, false), acc.Bytes(), 0o644); err != nil {
		return Chunk{}, err
	}
	h := sha256.Sum256(acc.Bytes())
	c.SHA256 = hex.EncodeToString(h[:])
	return c, nil
}

// checkChunks drops, from the first damaged or missing chunk on, what the manifest lists:
// those lines are prepared again.
func checkChunks(dir string, m *Manifest) error {
	for i, c := range m.Chunks {
		sum, _, err := hashFile(chunkPath(dir, c.Index, false))
		_, rerr := os.Lstat(chunkPath(dir, c.Index, true))
		if err != nil || rerr != nil || sum != c.SHA256 {
			m.Chunks = m.Chunks[:i]
			m.Complete = false
			return writeManifest(dir, *m)
		}
	}
	return nil
}

// assemble concatenates the chunks into the dataset and the refusal list, each written
// to a temp name, fsynced, renamed and the dir fsynced. It returns the dataset's sha256.
func assemble(dir string, chunks []Chunk) (string, error) {
	if _, err := concat(filepath.Join(dir, RefusedName), chunks, dir, true); err != nil {
		return "", err
	}
	return concat(filepath.Join(dir, DatasetName), chunks, dir, false)
}

func concat(path string, chunks []Chunk, dir string, refused bool) (string, error) {
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return "", fmt.Errorf("write %s: %w", path, err)
	}
	tmp := f.Name()
	h := sha256.New()
	w := io.MultiWriter(f, h)
	err = func() error {
		for _, c := range chunks {
			src, err := openRegular(chunkPath(dir, c.Index, refused))
			if err != nil {
				return err
			}
			_, err = io.Copy(w, src)
			src.Close()
			if err != nil {
				return err
			}
		}
		if err := f.Chmod(0o644); err != nil {
			return err
		}
		if err := atomicfile.Sync(f); err != nil {
			return err
		}
		if err := f.Close(); err != nil {
			return err
		}
		return os.Rename(tmp, path)
	}()
	if err != nil {
		f.Close()
		os.Remove(tmp)
		return "", fmt.Errorf("write %s: %w", path, err)
	}
	if err := atomicfile.SyncDir(dir); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
