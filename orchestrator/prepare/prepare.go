// Package prepare turns a conversation file into the pre-tokenized dataset a run reads:
// input_ids and an exact assistant loss mask per conversation, made by the target's own
// tokenizer and chat template (the simulator's contract for server.kind simulator), with
// the refusals listed and counted.
//
// What it keeps: the output is a pure function of the conversation file, the tokenizer's
// files, the template and the options (Fingerprint), and a resume against any other is
// refused naming the part that changed. Output is written in chunks, each durable (temp,
// fsync, rename, fsync dir) before the manifest lists it, so a SIGKILL loses at most the
// chunks in flight; the final dataset is assembled the same way. A mask is exact or the
// conversation is refused (invariant 10): the tokenizer decides, this package counts,
// applies the length policy, and never keeps a sample with no loss token.
// What it leaves to its caller: holding the state dir's lock while it writes.
package prepare

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"

	"golang.org/x/sync/errgroup"

	"github.com/extract-dev/extract/internal/atomicfile"
	"github.com/extract-dev/extract/internal/conversation"
	"github.com/extract-dev/extract/internal/userfile"
)

const noFollow = syscall.O_NOFOLLOW | syscall.O_NONBLOCK

// ErrBadInput marks a conversation file that cannot be prepared as asked (exit 2): a
// refused line under prepare.strict, no conversation left, an unreadable file.
var ErrBadInput = errors.New("bad conversation dataset")

// ErrChanged marks a prepare dir made from other inputs than these (exit 2).
var ErrChanged = errors.New("prepared data is from other inputs")

// Options are the prepare.* keys and the files involved.
type Options struct {
	From         string // the conversation file
	Dir          string // where chunks, the manifest and the dataset go
	Format       conversation.Format
	Policy       conversation.Policy
	Length       Length
	Strict       bool
	MaxLineBytes int
	Batch        int // conversations per tokenizer call
	ChunkLines   int // source lines per durable chunk
	// Extra is more of what shapes the output (the mask method, end-of-turn tokens, the
	// template kwargs): it goes into the options digest as given.
	Extra []string
	Log   *slog.Logger
}

// Counts are what happened to the lines.
type Counts struct {
	Lines     int            `json:"lines"`
	Accepted  int            `json:"accepted"`
	Truncated int            `json:"truncated"`
	Refused   map[string]int `json:"refused,omitempty"` // by reason
	Tokens    int64          `json:"tokens"`
	Loss      int64          `json:"loss_tokens"`
}

// Add adds o's counts to c.
func (c *Counts) Add(o Counts) {
	c.Lines += o.Lines
	c.Accepted += o.Accepted
	c.Truncated += o.Truncated
	c.Tokens += o.Tokens
	c.Loss += o.Loss
	for k, v := range o.Refused {
		if c.Refused == nil {
			c.Refused = map[string]int{}
		}
		c.Refused[k] += v
	}
}

// RefusedTotal is the number of refused lines.
func (c Counts) RefusedTotal() int {
	n := 0
	for _, v := range c.Refused {
		n += v
	}
	return n
}

// Summary is what Run did.
type Summary struct {
	Dataset     string      `json:"dataset"` // the pre-tokenized JSONL
	Refused     string      `json:"refused"` // refused.jsonl
	Counts      Counts      `json:"counts"`
	Fingerprint Fingerprint `json:"fingerprint"`
	Resumed     int         `json:"resumed_chunks"` // chunks found done
	AlreadyDone bool        `json:"already_prepared"`
}

// DatasetName and RefusedName are the assembled files in the prepare dir.
const (
	DatasetName = "dataset.jsonl"
	RefusedName = "refused.jsonl"
)

func (o *Options) defaults() {
	if o.Batch <= 0 {
		o.Batch = 64
	}
	if o.ChunkLines <= 0 {
		o.ChunkLines = 4096
	}
	if o.MaxLineBytes <= 0 {
		o.MaxLineBytes = 4 << 20
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
}

// FingerprintOf is what the output of o with tok would be a function of.
func FingerprintOf(o Options, tok Tokenizer) (Fingerprint, error) {
	o.defaults()
	sum, _, err := hashFile(o.From)
	if err != nil {
		return Fingerprint{}, fmt.Errorf("%w: %v", ErrBadInput, err)
	}
	t, tmpl := tok.Identity()
	opts := append([]string{
		"format=" + string(o.Format),
		"reasoning=" + o.Policy.Reasoning, "tools=" + o.Policy.Tools, "end_of_turn=" + o.Policy.EndOfTurn,
		"max_tokens=" + strconv.Itoa(o.Length.MaxTokens), "length_policy=" + o.Length.OnLong,
		"min_loss_tokens=" + strconv.Itoa(o.Length.MinLossTokens), "max_line_bytes=" + strconv.Itoa(o.MaxLineBytes),
	}, o.Extra...)
	return Fingerprint{Conversations: sum, Tokenizer: t, Template: tmpl, Options: digest(opts...)}, nil
}

// Run prepares o.From into o.Dir with tok, resuming what a killed run left.
func Run(ctx context.Context, o Options, tok Tokenizer) (Summary, error) {
	o.defaults()
	if err := o.Policy.Check(); err != nil {
		return Summary{}, err
	}
	if err := o.Length.Check(); err != nil {
		return Summary{}, err
	}
	fp, err := FingerprintOf(o, tok)
	if err != nil {
		return Summary{}, err
	}
	if err := atomicfile.MkdirAll(filepath.Join(o.Dir, "chunks"), 0o755); err != nil {
		return Summary{}, err
	}
	m, ok, err := ReadManifest(o.Dir)
	if err != nil {
		return Summary{}, err
	}
	if ok && m.Fingerprint != fp {
		return Summary{}, fmt.Errorf("%w: %s was prepared from other inputs: %v changed since; restore them, or start over with --fresh (prepare: remove the dir)",
			ErrChanged, o.Dir, fp.Diff(m.Fingerprint))
	}
	if !ok {
		m = Manifest{Version: manifestVersion, Source: o.From, Fingerprint: fp, ChunkLines: o.ChunkLines, VocabSize: tok.VocabSize()}
	}
	sum := Summary{Dataset: filepath.Join(o.Dir, DatasetName), Refused: filepath.Join(o.Dir, RefusedName), Fingerprint: fp, Resumed: len(m.Chunks)}
	if m.Complete {
		if _, err := os.Lstat(sum.Dataset); err == nil {
			sum.Counts, sum.AlreadyDone = m.Counts, true
			return sum, nil
		}
		m.Complete = false // the assembled file is gone: assemble it again from the chunks
	}
	if err := checkChunks(o.Dir, &m); err != nil {
		return Summary{}, err
	}
	o.ChunkLines = m.ChunkLines
	if err := run(ctx, o, tok, &m); err != nil {
		return Summary{}, err
	}
	m.Counts = Counts{} // a lost dataset's manifest still holds the old totals
	for _, c := range m.Chunks {
		m.Counts.Add(c.Counts)
	}
	if m.Counts.Accepted == 0 {
		return Summary{}, fmt.Errorf("%w: %s: no conversation was accepted (%d lines, %d refused: %v); see %s",
			ErrBadInput, o.From, m.Counts.Lines, m.Counts.RefusedTotal(), m.Counts.Refused, sum.Refused)
	}
	dsSum, err := assemble(o.Dir, m.Chunks)
	if err != nil {
		return Summary{}, err
	}
	m.Complete, m.Samples, m.DatasetSHA = true, m.Counts.Accepted, dsSum
	if err := writeManifest(o.Dir, m); err != nil {
		return Summary{}, err
	}
	// The chunks are in the dataset now, and durable there: they would only double the
	// disk a million conversations take. Without the dataset, a later run prepares again.
	for _, c := range m.Chunks {
		os.Remove(chunkPath(o.Dir, c.Index, false))
		os.Remove(chunkPath(o.Dir, c.Index, true))
	}
	sum.Counts = m.Counts
	return sum, nil
}

// batch is a run of lines of one chunk, in file order.
type batch struct {
	chunk, seq int // seq: the batch's place within its chunk
	lines      []conversation.Line
	results    []lineResult
	keep       bool // keep each encoding beside its record
}

// run reads from the end of the last durable chunk, encodes on tok's workers and writes
// each chunk once all its batches are back.
func run(ctx context.Context, o Options, tok Tokenizer, m *Manifest) error {
	var start int64
	firstLine, nextChunk := 1, 0
	if n := len(m.Chunks); n > 0 {
		last := m.Chunks[n-1]
		start, firstLine, nextChunk = last.End, last.LastLine+1, last.Index+1
	}
	f, err := userfile.OpenRegular(o.From)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrBadInput, err)
	}
	defer f.Close()
	if _, err := f.Seek(start, io.SeekStart); err != nil {
		return fmt.Errorf("%w: seek %s to %d: %v", ErrBadInput, o.From, start, err)
	}
	g, ctx := errgroup.WithContext(ctx)
	todo := make(chan *batch, tok.Workers()*2)
	done := make(chan *batch, tok.Workers()*2)
	// Batches per chunk, sent by the reader once it knows (the last chunk is short).
	sizes := make(chan [2]int, 1<<10)
	g.Go(func() error {
		defer close(todo)
		defer close(sizes)
		return read(ctx, o, f, start, firstLine, nextChunk, todo, sizes)
	})
	var workers sync.WaitGroup
	for w := range tok.Workers() {
		workers.Add(1)
		g.Go(func() error {
			defer workers.Done()
			for b := range todo {
				if err := encode(ctx, o, tok, w, b); err != nil {
					return err
				}
				select {
				case done <- b:
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			return nil
		})
	}
	g.Go(func() error {
		workers.Wait()
		close(done)
		return nil
	})
	g.Go(func() error { return collect(ctx, o, m, done, sizes) })
	return g.Wait()
}

// read scans lines into batches that never cross a chunk.
func read(ctx context.Context, o Options, r io.Reader, start int64, firstLine, chunk int, todo chan<- *batch, sizes chan<- [2]int) error {
	s := conversation.NewScanner(r, o.Format, o.MaxLineBytes, start, firstLine)
	var cur *batch
	inChunk, seq := 0, 0
	flush := func() error {
		if cur == nil {
			return nil
		}
		select {
		case todo <- cur:
		case <-ctx.Done():
			return ctx.Err()
		}
		cur = nil
		seq++
		return nil
	}
	endChunk := func() error {
		if err := flush(); err != nil {
			return err
		}
		if seq > 0 {
			select {
			case sizes <- [2]int{chunk, seq}:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		chunk, seq, inChunk = chunk+1, 0, 0
		return nil
	}
	for {
		l, err := s.Next()
		if errors.Is(err, io.EOF) {
			return endChunk()
		}
		if err != nil {
			return fmt.Errorf("%w: %s: %v", ErrBadInput, o.From, err)
		}
		if o.Strict && l.Refusal != nil {
			return fmt.Errorf("%w: %s %v (prepare.strict)", ErrBadInput, o.From, l.Refusal)
		}
		if cur == nil {
			cur = &batch{chunk: chunk, seq: seq}
		}
		cur.lines = append(cur.lines, l)
		inChunk++
		if len(cur.lines) == o.Batch {
			if err := flush(); err != nil {
				return err
			}
		}
		if inChunk == o.ChunkLines {
			if err := endChunk(); err != nil {
				return err
			}
		}
	}
}
