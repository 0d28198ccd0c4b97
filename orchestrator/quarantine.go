package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/extract-dev/extract/internal/atomicfile"
	"github.com/extract-dev/extract/shm"
)

// quarantineMax caps the bytes kept in state_dir/quarantine: enough dumps for a person
// to see what went wrong, never enough to fill the state disk when every dump is bad.
const quarantineMax = 1 << 30

// heldPrefix marks a dump taken out of the staging namespace for quarantine: a rename
// in the same directory is instant, so the coordinator never waits on the copy, and a
// dot name is never reported as a dump again.
const heldPrefix = ".quarantine-"

// quarantine keeps rejected dumps for inspection. The coordinator renames a dump aside
// (hold); the worker copies it into state_dir/quarantine, within quarantineMax, and
// removes the held name, which extract itself wrote.
type quarantine struct {
	stagingDirs []string // every staging dir of the job (one per replica, and older ones)
	dir         string
	log         *slog.Logger
	jobs        chan string
}

func newQuarantine(stagingDirs []string, stateDir string, log *slog.Logger) *quarantine {
	return &quarantine{stagingDirs: stagingDirs, dir: filepath.Join(stateDir, "quarantine"), log: log, jobs: make(chan string, 4096)}
}

// hold renames the dump aside and queues it for the worker. A dump it cannot rename is
// left where it is: it will be rejected again, which loses nothing.
func (q *quarantine) hold(path string) {
	held := filepath.Join(filepath.Dir(path), heldPrefix+filepath.Base(path))
	if err := os.Rename(path, held); err != nil {
		q.log.Warn("could not take dump out of staging for quarantine", "file", path, "err", err)
		return
	}
	select {
	case q.jobs <- held:
	default:
		q.drop(held, "quarantine queue full")
	}
}

// queueHeld picks up dumps held by an earlier run that died before copying them.
func (q *quarantine) queueHeld() {
	for _, dir := range q.stagingDirs {
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			if strings.HasPrefix(e.Name(), heldPrefix) && e.Type().IsRegular() && ownedByUs(e) {
				if _, ok := shm.ParseDumpName(strings.TrimPrefix(e.Name(), heldPrefix)); ok {
					select {
					case q.jobs <- filepath.Join(dir, e.Name()):
					default:
					}
				}
			}
		}
	}
}

// run copies held dumps until ctx ends, then the ones already queued: a run that ends
// leaves its staging dir clean. A crash leaves them held for the next run.
func (q *quarantine) run(ctx context.Context) error {
	used := dirBytes(q.dir)
	for {
		select {
		case <-ctx.Done():
			for {
				select {
				case held := <-q.jobs:
					used += q.process(held, quarantineMax-used)
				default:
					return nil
				}
			}
		case held := <-q.jobs:
			used += q.process(held, quarantineMax-used)
		}
	}
}

// process keeps one held dump if it fits in room, and removes its held name either way.
func (q *quarantine) process(held string, room int64) int64 {
	n, err := q.keep(held, room)
	if err != nil {
		q.drop(held, err.Error())
		return 0
	}
	if err := os.Remove(held); err != nil && !errors.Is(err, fs.ErrNotExist) {
		q.log.Warn("remove quarantined dump from staging", "file", held, "err", err)
	}
	return n
}

// keep copies a held dump into the quarantine dir if it fits in room bytes.
func (q *quarantine) keep(held string, room int64) (int64, error) {
	src, err := shm.OpenDump(held)
	if err != nil {
		return 0, err
	}
	defer func() { _ = src.Close() }()
	st, err := src.Stat()
	if err != nil {
		return 0, err
	}
	if st.Size() > room {
		return 0, fmt.Errorf("quarantine %s is full (%d bytes kept at most)", q.dir, quarantineMax)
	}
	if err := atomicfile.MkdirAll(q.dir, 0o700); err != nil {
		return 0, err
	}
	name := strings.TrimPrefix(filepath.Base(held), heldPrefix)
	dst, err := os.CreateTemp(q.dir, "."+name+".tmp*")
	if err != nil {
		return 0, err
	}
	tmp := dst.Name()
	_, err = io.Copy(dst, io.LimitReader(src, st.Size()))
	if cerr := dst.Close(); err == nil {
		err = cerr
	}
	kept := filepath.Join(q.dir, name)
	if _, serr := os.Lstat(kept); serr == nil {
		// Never replace the evidence of an earlier rejected dump of the same rid.
		kept += "." + time.Now().UTC().Format("20060102T150405.000000000Z")
	}
	if err == nil {
		err = os.Rename(tmp, kept)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return 0, fmt.Errorf("copy %s into quarantine: %w", held, err)
	}
	q.log.Warn("dump quarantined", "file", filepath.Join(filepath.Dir(held), name), "kept_as", kept)
	return st.Size(), nil
}

// drop removes a held dump that cannot be kept; the held name is extract's own.
func (q *quarantine) drop(held, why string) {
	q.log.Warn("rejected dump not kept in quarantine; removing it", "file", held, "why", why)
	if err := os.Remove(held); err != nil && !errors.Is(err, fs.ErrNotExist) {
		q.log.Warn("remove held dump", "file", held, "err", err)
	}
}

func dirBytes(dir string) int64 {
	var n int64
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if fi, err := e.Info(); err == nil && fi.Mode().IsRegular() {
			n += fi.Size()
		}
	}
	return n
}

// ownedByUs says whether a held name in the world-writable staging dir is one this user
// could have made: another user's file under our pattern is not ours to copy or delete
// (invariant 8).
func ownedByUs(e os.DirEntry) bool {
	fi, err := e.Info()
	if err != nil {
		return false
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	return ok && int(st.Uid) == os.Geteuid()
}
