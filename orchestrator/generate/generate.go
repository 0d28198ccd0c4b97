// Package generate regenerates a conversation file's assistant turns with the target
// (extract generate): each turn in order, conditioned on the regenerated history, through
// the job's supervised servers, into a file that is at once a conversation file (id,
// messages) and a pre-tokenized dataset (input_ids, loss_mask) extract run takes as is.
//
// What it keeps (invariant 11): a conversation counts once its record is committed to
// the index (state_dir/generate/index.db); a kill loses at most the conversations in
// flight, and a resume sends only the ones without a record. The output is assembled
// from the index alone, in input order (temp, fsync, rename, fsync dir), so it never
// holds a partial or duplicate line. The sample's ids are the template's prompt ids and
// the ids the server generated (output_ids), never a re-tokenization of the text.
// What it leaves to its caller: holding the state dir's lock, building the replicas.
package generate

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/extract-dev/extract/internal/conversation"
	"github.com/extract-dev/extract/sglang"
)

// Errors a caller maps to exit codes.
var (
	// ErrBadInput: the conversation file cannot be read as asked (exit 2).
	ErrBadInput = errors.New("bad conversation file")
	// ErrChanged: the index was made from other inputs or keys (exit 2).
	ErrChanged = errors.New("generate index is from other inputs")
	// ErrStopped: ctx ended before every conversation finished (exit 75).
	ErrStopped = errors.New("generate stopped before it finished")
)

// Options are one generate job.
type Options struct {
	From, To string
	Dir      string // state_dir/generate: the index and the status snapshot
	Format   conversation.Format
	MaxLine  int
	Renderer Renderer
	Replicas []Replica
	// Params are the sampling keys; the seed of a validation retry is Params.Seed + n.
	Params      sglang.SampleParams
	Rules       Rules
	EndOfTurn   bool // prepare.end_of_turn: include
	MaxInflight int
	MaxAttempts int
	// IsolateAfterDeaths: a conversation in flight at that many server deaths is sent
	// alone; if its server dies with it alone, it fails (poison).
	IsolateAfterDeaths int
	MaxRestarts        int
	RestartWindow      time.Duration
	Health             Health
	// Shard is the span of 0-based lines this run owns: Span(lines) gives [lo, hi).
	Span func(lines int) (int, int)
	// OptionsText is the keys that shape the output, for the fingerprint.
	OptionsText []string
	Fresh       bool
	Resume      bool
	Log         *slog.Logger
	OnStatus    func(Status)
	// Listen is status.listen: /status and /metrics while generating ("" none).
	Listen string
}

// Summary is what Run did.
type Summary struct {
	Output      string         `json:"output"`
	Lines       int            `json:"lines"`
	Total       int            `json:"total"` // this shard's lines
	Done        int            `json:"done"`
	Dropped     int            `json:"dropped"`
	Failed      int            `json:"failed"`
	Generated   int64          `json:"generated_tokens"`
	Flags       map[string]int `json:"flags,omitempty"`
	AlreadyDone bool           `json:"already_done"`
	Elapsed     time.Duration  `json:"elapsed_ns"`
}

// IndexPath is the index in dir.
func IndexPath(dir string) string { return filepath.Join(dir, "index.db") }

// Run generates what the index lacks, then assembles the output.
func Run(ctx context.Context, o Options) (Summary, error) {
	began := time.Now()
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if o.MaxLine <= 0 {
		o.MaxLine = 4 << 20
	}
	src, err := scanSource(o.From)
	if err != nil {
		return Summary{}, err
	}
	lo, hi := 0, src.lines
	if o.Span != nil {
		lo, hi = o.Span(src.lines)
	}
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return Summary{}, fmt.Errorf("generate dir %s: %w", o.Dir, err)
	}
	ix, err := openIndex(IndexPath(o.Dir), false)
	if err != nil {
		return Summary{}, err
	}
	defer func() { _ = ix.Close() }() // every record was committed (synced) when it counted
	want := Meta{Conversations: src.sha256, Source: o.From, Lines: src.lines, Renderer: o.Renderer.Identity(),
		Options: digest(o.OptionsText), OptionsText: o.OptionsText, Lo: lo, Hi: hi, Created: time.Now().UTC()}
	if err := checkMeta(ix, want, o); err != nil {
		return Summary{}, err
	}
	fin, err := ix.finished()
	if err != nil {
		return Summary{}, err
	}
	sum := Summary{Output: o.To, Lines: src.lines, Total: hi - lo}
	missing := 0
	for s := lo; s < hi; s++ {
		if _, ok := fin[s]; !ok {
			missing++
		}
	}
	if missing > 0 {
		if err := generateMissing(ctx, o, ix, fin, lo, hi, missing); err != nil {
			return sum, err
		}
	} else {
		sum.AlreadyDone = true
	}
	if err := assemble(ix, o.To, lo, hi, &sum); err != nil {
		return sum, err
	}
	sum.Elapsed = time.Since(began)
	return sum, nil
}

// checkMeta makes the index describe this job: a new one is initialised; one with
// records is continued only for the same inputs and keys (resume) or reset (fresh).
func checkMeta(ix *index, want Meta, o Options) error {
	have, ok, err := ix.meta()
	if err != nil {
		return err
	}
	if !ok || o.Fresh {
		want.Output = have.Output // the file it wrote is still ours to replace
		return ix.reset(want)
	}
	fin, err := ix.finished()
	if err != nil {
		return err
	}
	want.Output, want.Created = have.Output, have.Created
	if diff := have.diff(want); diff != "" {
		if len(fin) == 0 {
			return ix.reset(want)
		}
		return fmt.Errorf("%w: %s holds %d conversations generated from other inputs: %s changed since; restore them, or start over with --fresh",
			ErrChanged, IndexPath(o.Dir), len(fin), diff)
	}
	if len(fin) > 0 && !o.Resume {
		done := 0
		for s := want.Lo; s < want.Hi; s++ {
			if _, ok := fin[s]; ok {
				done++
			}
		}
		if done < want.Hi-want.Lo {
			return fmt.Errorf("%w: %s already has progress (%d of %d conversations finished); continue with --resume, or start over with --fresh",
				ErrChanged, IndexPath(o.Dir), done, want.Hi-want.Lo)
		}
	}
	return nil
}

// job is one generate run's shared state.
type job struct {
	o      Options
	ix     *index
	pool   *pool
	eot    map[int64]bool
	deaths map[int]int
	dmu    sync.Mutex
	prog   *progress
}

// work is one conversation to generate.
type work struct {
	sample int
	line   conversation.Line
}

func generateMissing(ctx context.Context, o Options, ix *index, fin map[int]State, lo, hi, missing int) error {
	deaths, err := ix.deaths()
	if err != nil {
		return err
	}
	j := &job{o: o, ix: ix, pool: newPool(o.Replicas, o.MaxRestarts, o.RestartWindow, o.Health, o.Log), eot: map[int64]bool{}, deaths: deaths}
	for id := range o.Renderer.EndOfTurn() {
		j.eot[id] = true
	}
	j.prog = newProgress(hi-lo, hi-lo-missing, o)
	o.Log.Info("generate: starting", "from", o.From, "lines", hi-lo, "missing", missing, "replicas", len(o.Replicas), "max_inflight", o.MaxInflight)

	// Servers live until the work ends; their supervisors end with them.
	srvCtx, stopSrv := context.WithCancel(context.WithoutCancel(ctx))
	defer stopSrv()
	srvErr := make(chan error, len(j.pool.reps))
	for _, r := range j.pool.reps {
		go func() { srvErr <- j.pool.supervise(srvCtx, r) }()
	}
	g, gctx := errgroup.WithContext(ctx)
	workDone := make(chan struct{})
	g.Go(func() error {
		select {
		case err := <-srvErr:
			return err
		case <-workDone:
			return nil
		}
	})
	todo := make(chan work)
	recs := make(chan committed, o.MaxInflight)
	g.Go(func() error {
		defer close(todo)
		return readMissing(gctx, o, fin, lo, hi, todo)
	})
	var workers sync.WaitGroup
	for range o.MaxInflight {
		workers.Add(1)
		g.Go(func() error {
			defer workers.Done()
			for w := range todo {
				rec := j.conversation(gctx, w)
				if rec == nil {
					return gctx.Err()
				}
				select {
				case recs <- committed{w.sample, rec}:
				case <-gctx.Done():
					return gctx.Err()
				}
			}
			return nil
		})
	}
	go func() { workers.Wait(); close(recs); close(workDone) }()
	commitErr := make(chan error, 1)
	go func() { commitErr <- j.commitLoop(recs) }()
	var ep *endpoint
	if o.Listen != "" {
		if ep, err = startEndpoint(o.Listen); err != nil {
			o.Log.Warn("generate: no live endpoint", "err", err)
			ep = nil
		} else {
			defer ep.close()
			o.Log.Info("generate: live status and metrics", "addr", ep.addr)
		}
	}
	stopTick := j.prog.tick(ctx, j.pool, ep)
	err = g.Wait()
	cerr := <-commitErr // every record sent is committed before Run returns
	stopTick()
	stopSrv()
	if cerr != nil {
		return cerr
	}
	if err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	if ctx.Err() != nil {
		return fmt.Errorf("%w: %d of %d conversations finished", ErrStopped, j.prog.finished(), hi-lo)
	}
	return err
}

type committed struct {
	sample int
	rec    *Record
}

// commitLoop commits the records as they come, grouping those that arrive together
// into one transaction; a record counts only once committed.
func (j *job) commitLoop(recs <-chan committed) error {
	for first := range recs {
		batch := map[int]*Record{first.sample: first.rec}
	more:
		for len(batch) < 256 {
			select {
			case c, ok := <-recs:
				if !ok {
					break more
				}
				batch[c.sample] = c.rec
			default:
				break more
			}
		}
		if err := j.ix.commit(batch); err != nil {
			for range recs { // let the workers end; nothing more counts
			}
			return fmt.Errorf("generate: commit %d conversations: %w", len(batch), err)
		}
		for _, r := range batch {
			j.prog.add(r)
		}
	}
	return nil
}
