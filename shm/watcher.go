package shm

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"

	"github.com/fsnotify/fsnotify"
)

// Dump is a complete dump under its final name.
type Dump struct {
	Path string
	RID  RID
}

// Watcher reports every complete dump that appears in the staging directory, including
// those already there when it starts. A dump may be reported more than once (scan and
// event can both see it); consumers de-duplicate by path.
type Watcher struct {
	dir        string
	fsw        *fsnotify.Watcher
	log        *slog.Logger
	ignored    atomic.Int64
	notRegular atomic.Int64
	seen       map[string]bool // names already reported, so a noisy entry logs once
}

// NewWatcher creates dir if needed (0700; a run prepares it first, see PrepareDir) and
// starts watching it. The watch is added here, before
// any scan, so a dump renamed in between is seen by one or the other.
func NewWatcher(dir string, log *slog.Logger) (*Watcher, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create staging dir %s: %w", dir, err)
	}
	fsw, err := fsnotify.NewBufferedWatcher(4096)
	if err != nil {
		return nil, fmt.Errorf("fsnotify: %w", err)
	}
	if err := fsw.Add(dir); err != nil {
		fsw.Close()
		return nil, fmt.Errorf("watch staging dir %s: %w", dir, err)
	}
	return &Watcher{dir: dir, fsw: fsw, log: log, seen: map[string]bool{}}, nil
}

// Ignored counts names in the staging dir that are neither dumps nor partials.
func (w *Watcher) Ignored() int64 { return w.ignored.Load() }

// NotRegular counts entries with a dump's name that are not regular files (FIFOs,
// symlinks, directories): reported, never opened (invariant 8).
func (w *Watcher) NotRegular() int64 { return w.notRegular.Load() }

// Close releases the inotify watch.
func (w *Watcher) Close() error { return w.fsw.Close() }

// Run reports each new dump on out until ctx is done. The caller scans the leftovers
// first (Scan), after NewWatcher added the watch, so nothing renamed in between is
// missed; a dump may then be reported twice. Run never stops draining fsnotify's
// channels, even while out is full: reports queue up instead, and an overflow of the
// kernel queue triggers a rescan. An error means dumps would stop arriving: the caller
// must end the run.
func (w *Watcher) Run(ctx context.Context, out chan<- Dump) error {
	var queue []Dump
	queued := map[string]bool{}
	push := func(d Dump) {
		if !queued[d.Path] {
			queued[d.Path] = true
			queue = append(queue, d)
		}
	}
	scan := func() error {
		dumps, err := w.Scan()
		for _, d := range dumps {
			push(d)
		}
		return err
	}
	for {
		var send chan<- Dump
		var next Dump
		if len(queue) > 0 {
			send, next = out, queue[0]
		}
		select {
		case <-ctx.Done():
			return nil
		case send <- next:
			delete(queued, next.Path)
			queue = queue[1:]
		case ev, ok := <-w.fsw.Events:
			if !ok {
				return nil
			}
			if filepath.Clean(ev.Name) == filepath.Clean(w.dir) && (ev.Has(fsnotify.Remove) || ev.Has(fsnotify.Rename)) {
				// The watch is on the old inode: dumps written into a recreated dir would
				// never be seen, and every sample would time out. End the run instead.
				return fmt.Errorf("staging dir %s was removed or renamed under the run; dumps written there now would go unseen: %w", w.dir, ErrStagingGone)
			}
			if !ev.Has(fsnotify.Create) && !ev.Has(fsnotify.Write) {
				continue
			}
			fi, err := os.Lstat(ev.Name)
			if err != nil {
				continue // renamed or removed meanwhile
			}
			if d, ok := w.classify(ev.Name, fi.Mode().Type()); ok {
				push(d)
			}
		case err, ok := <-w.fsw.Errors:
			if !ok {
				return nil
			}
			if errors.Is(err, fsnotify.ErrEventOverflow) {
				w.log.Warn("staging dir event queue overflowed; rescanning", "dir", w.dir)
				if err := scan(); err != nil {
					return err
				}
				continue
			}
			w.log.Error("staging dir watch error", "dir", w.dir, "err", err)
		}
	}
}

// Scan lists the complete dumps now in the staging dir.
func (w *Watcher) Scan() ([]Dump, error) {
	entries, err := os.ReadDir(w.dir)
	if err != nil {
		return nil, fmt.Errorf("scan staging dir %s: %w", w.dir, err)
	}
	var dumps []Dump
	for _, e := range entries {
		if d, ok := w.classify(filepath.Join(w.dir, e.Name()), e.Type()); ok {
			dumps = append(dumps, d)
		}
	}
	return dumps, nil
}

// classify accepts regular files under final dump names only (typ is the entry's type
// from lstat, never from a followed link); any other name that is not the hook's own is
// reported once, and none is ever opened.
func (w *Watcher) classify(path string, typ os.FileMode) (Dump, bool) {
	name := filepath.Base(path)
	if rid, ok := ParseDumpName(name); ok {
		if typ.IsRegular() {
			return Dump{Path: path, RID: rid}, true
		}
		if !w.seen[name] {
			w.seen[name] = true
			w.notRegular.Add(1)
			w.log.Warn("ignoring staging entry with a dump's name: not a regular file; never opened", "file", path, "type", describeMode(typ))
		}
		return Dump{}, false
	}
	if typ.IsDir() {
		return Dump{}, false
	}
	// Partials are work in progress; dot files are the hook's (its .hook-<pid>.json marker).
	if strings.HasSuffix(name, PartialSuffix) || strings.HasPrefix(name, ".") || w.seen[name] {
		return Dump{}, false
	}
	w.seen[name] = true
	w.ignored.Add(1)
	w.log.Warn("ignoring file in staging dir: not a dump name (s<9 digits>-a<n>.safetensors)", "file", path)
	return Dump{}, false
}

// Usage is what the staging dir holds and what its filesystem has left.
type Usage struct {
	Bytes    int64 // sum of file sizes in the dir, partials included
	Files    int
	Partials int
	Free     int64 // bytes available to us on the filesystem
	Total    int64
	Tmpfs    bool
}

// Measure reads the staging dir's usage.
func Measure(dir string) (Usage, error) {
	var u Usage
	entries, err := os.ReadDir(dir)
	if err != nil {
		return u, fmt.Errorf("read staging dir %s: %w", dir, err)
	}
	for _, e := range entries {
		info, err := e.Info()
		if err != nil || !info.Mode().IsRegular() {
			continue
		}
		u.Bytes += info.Size()
		u.Files++
		if strings.HasSuffix(e.Name(), PartialSuffix) {
			u.Partials++
		}
	}
	fs, err := StatFS(dir)
	if err != nil {
		return u, err
	}
	u.Free, u.Total, u.Tmpfs = fs.Free, fs.Total, fs.Tmpfs
	return u, nil
}
