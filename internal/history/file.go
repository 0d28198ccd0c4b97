package history

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/extract-dev/extract/internal/atomicfile"
)

// FileName is the history's name in a state dir.
const FileName = "history.log"

// maxFileBytes bounds what is read: a compacted history is far smaller, so a bigger
// file is not one this package wrote and is refused rather than loaded.
const maxFileBytes = 64 << 20

// Options tune a Writer; the zero value is what a run uses.
type Options struct {
	// Interval spaces routine records (default 5s); a change is recorded sooner.
	Interval time.Duration
	// Tiers is the compaction plan (default DefaultTiers).
	Tiers []Tier
	// CompactEvery is how many appended records a compaction waits for (default 360,
	// half an hour at the default interval).
	CompactEvery int
	Log          *slog.Logger
}

func (o Options) withDefaults() Options {
	if o.Interval <= 0 {
		o.Interval = 5 * time.Second
	}
	if o.Tiers == nil {
		o.Tiers = DefaultTiers
	}
	if o.CompactEvery <= 0 {
		o.CompactEvery = 360
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	return o
}

// Writer appends a run's records to its history file. Append and Final are called from
// one goroutine (the run's coordinator) and never wait on the disk: a goroutine of the
// Writer's own writes, syncs and compacts, and Close waits for it.
type Writer struct {
	path string
	opt  Options
	s    sampler
	ops  chan op
	done chan struct{}
	// dropped counts records lost because the disk was too slow to take them.
	dropped atomic.Int64

	// The writing goroutine's, after Open.
	f    *os.File
	recs []Record
	// frames are the records' encoded frames, which compaction reuses for the records
	// it keeps as they are.
	frames  [][]byte
	size    int64
	since   int // records appended since the last compaction
	failing bool
}

type op struct {
	rec  *Record
	done chan struct{}
}

// Open opens (or creates) the history at path for appending. A torn last record is cut
// off; a file that is not a history, not a regular file, or not ours is refused.
func Open(path string, opt Options) (*Writer, error) {
	opt = opt.withDefaults()
	f, err := os.OpenFile(path, os.O_RDWR|os.O_APPEND|os.O_CREATE|syscall.O_NOFOLLOW|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open history %s: %w", path, err)
	}
	w := &Writer{path: path, opt: opt, s: sampler{interval: opt.Interval}, f: f}
	removeTemps(path, opt.Log)
	if err := w.load(); err != nil {
		f.Close()
		return nil, err
	}
	w.ops = make(chan op, 64)
	w.done = make(chan struct{})
	go w.loop()
	return w, nil
}

// load reads what the file holds and leaves it ready for the next frame.
func (w *Writer) load() error {
	if st, err := w.f.Stat(); err == nil {
		if uid := st.Sys().(*syscall.Stat_t).Uid; int(uid) != os.Geteuid() {
			return fmt.Errorf("history %s belongs to uid %d, not to this process (uid %d): not appending to it", w.path, uid, os.Geteuid())
		}
	}
	b, err := readChecked(w.f, w.path)
	if err != nil {
		return err
	}
	d, err := decode(w.path, b)
	if err != nil {
		return err
	}
	if d.Skipped > 0 || d.Torn > 0 {
		w.opt.Log.Warn("history: damaged records ignored", "file", w.path, "skipped_bytes", d.Skipped, "torn_bytes", d.Torn)
	}
	w.recs, w.size = d.Records, d.End
	for _, r := range w.recs {
		b, err := appendFrame(nil, r)
		if err != nil {
			return err
		}
		w.frames = append(w.frames, b)
	}
	if d.End == 0 {
		// New, or its header was cut short: start it, and make its name durable.
		if err := w.f.Truncate(0); err != nil {
			return fmt.Errorf("reset history %s: %w", w.path, err)
		}
		if _, err := w.f.Write([]byte(magic)); err != nil {
			return fmt.Errorf("start history %s: %w", w.path, err)
		}
		w.size = int64(len(magic))
		if err := atomicfile.Sync(w.f); err != nil {
			return fmt.Errorf("sync history %s: %w", w.path, err)
		}
		return atomicfile.SyncDir(filepath.Dir(w.path))
	}
	if d.Torn > 0 {
		// The next frame must follow the last good one, not the torn bytes.
		if err := w.f.Truncate(d.End); err != nil {
			return fmt.Errorf("cut the torn end off history %s: %w", w.path, err)
		}
		if err := atomicfile.Sync(w.f); err != nil {
			return fmt.Errorf("sync history %s: %w", w.path, err)
		}
	}
	if n := len(w.recs); n > 0 {
		w.compact(w.recs[n-1].Time())
	}
	return nil
}

// removeTemps removes what a compaction killed before its rename left: temp files of
// atomicfile.WriteFile's name for path (".history.log.tmp*"), regular and ours. The
// history beside them is the one before that compaction, whole.
func removeTemps(path string, log *slog.Logger) {
	dir, base := filepath.Split(path)
	temps, _ := filepath.Glob(filepath.Join(dir, "."+base+".tmp*"))
	for _, t := range temps {
		st, err := os.Lstat(t)
		if err != nil || !st.Mode().IsRegular() || int(st.Sys().(*syscall.Stat_t).Uid) != os.Geteuid() {
			continue
		}
		if err := os.Remove(t); err != nil {
			log.Warn("history: remove a compaction's leftover", "file", t, "err", err)
		}
	}
}

// readChecked reads a regular file of at most maxFileBytes through f.
func readChecked(f *os.File, path string) ([]byte, error) {
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("stat history %s: %w", path, err)
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("history %s is not a regular file (%s)", path, st.Mode().Type())
	}
	if st.Size() > maxFileBytes {
		return nil, fmt.Errorf("history %s is %d bytes, more than the %d a compacted history can be: move it aside", path, st.Size(), maxFileBytes)
	}
	b, err := io.ReadAll(io.NewSectionReader(f, 0, maxFileBytes))
	if err != nil {
		return nil, fmt.Errorf("read history %s: %w", path, err)
	}
	return b, nil
}

// Append offers the run's current state; it becomes a record when one is due. It never
// blocks: a record the writer cannot take (the disk stalls) is dropped and counted.
func (w *Writer) Append(r Record) {
	rec, ok := w.s.offer(r)
	if !ok {
		return
	}
	select {
	case w.ops <- op{rec: &rec}:
	default:
		w.dropped.Add(1)
	}
}

// Flush waits until every record appended so far is written and synced.
func (w *Writer) Flush() {
	done := make(chan struct{})
	w.ops <- op{done: done}
	<-done
}

// Close records r as the run's last word (whether or not one is due), waits for it to
// be written, and closes the file.
func (w *Writer) Close(r Record) error {
	w.s.have = false
	rec, _ := w.s.offer(r)
	w.ops <- op{rec: &rec}
	close(w.ops)
	<-w.done
	if n := w.dropped.Load(); n > 0 {
		w.opt.Log.Warn("history: records dropped while the disk was slow", "file", w.path, "dropped", n)
	}
	return w.f.Close()
}

func (w *Writer) loop() {
	defer close(w.done)
	for o := range w.ops {
		if o.rec != nil {
			w.write(*o.rec)
		}
		if o.done != nil {
			close(o.done)
		}
	}
}

// write appends one frame and syncs it; on failure the file is cut back to its last
// good frame, so that nothing follows a partial one.
func (w *Writer) write(r Record) {
	b, err := appendFrame(nil, r)
	if err == nil {
		_, err = w.f.Write(b)
		if err == nil {
			err = atomicfile.Sync(w.f)
		}
		if err != nil {
			w.f.Truncate(w.size)
		}
	}
	if err != nil {
		w.fail(fmt.Errorf("append to history %s: %w", w.path, err))
		return
	}
	w.ok()
	w.size += int64(len(b))
	w.recs, w.frames = append(w.recs, r), append(w.frames, b)
	if w.since++; w.since >= w.opt.CompactEvery {
		w.compact(r.Time())
	}
}

// compact rewrites the file with the records Compact keeps as of now, if it drops any.
func (w *Writer) compact(now time.Time) {
	w.since = 0
	kept, from := compact(w.recs, now, w.opt.Tiers)
	if len(kept) == len(w.recs) {
		return
	}
	frames := make([][]byte, len(kept))
	data := append(make([]byte, 0, w.size), magic...)
	for i, r := range kept {
		if from[i] >= 0 {
			frames[i] = w.frames[from[i]]
		} else {
			b, err := appendFrame(nil, r)
			if err != nil {
				w.fail(fmt.Errorf("compact history %s: %w", w.path, err))
				return
			}
			frames[i] = b
		}
		data = append(data, frames[i]...)
	}
	if err := w.rewrite(data); err != nil {
		w.fail(fmt.Errorf("compact history %s: %w", w.path, err))
		return
	}
	w.recs, w.frames = kept, frames
}

// rewrite replaces the file by data the crash-safe way and appends to the new one.
func (w *Writer) rewrite(data []byte) error {
	if err := atomicfile.WriteFile(w.path, data, 0o644); err != nil {
		return err
	}
	f, err := os.OpenFile(w.path, os.O_WRONLY|os.O_APPEND|syscall.O_NOFOLLOW|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("reopen: %w", err)
	}
	w.f.Close()
	w.f, w.size = f, int64(len(data))
	return nil
}

// fail logs the first of a row of failures: a full disk must not flood the log.
func (w *Writer) fail(err error) {
	if !w.failing {
		w.opt.Log.Warn("history: not recorded", "err", err)
	}
	w.failing = true
}

func (w *Writer) ok() {
	if w.failing {
		w.opt.Log.Info("history: recording again", "file", w.path)
	}
	w.failing = false
}

// ReadFile reads a history for a report. A missing file is an error that wraps
// fs.ErrNotExist (no run has recorded one yet); torn and damaged records are skipped.
// It opens nothing but a regular file and never follows a symlink.
func ReadFile(path string) (Decoded, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, syscall.ELOOP) {
			return Decoded{}, fmt.Errorf("history %s is a symlink: not following it", path)
		}
		return Decoded{}, fmt.Errorf("open history %s: %w", path, err)
	}
	defer f.Close()
	b, err := readChecked(f, path)
	if err != nil {
		return Decoded{}, err
	}
	return decode(path, b)
}
