// Package atomicfile writes files the crash-safe way: a temp name in the same directory,
// fsync, rename, then fsync of the directory. Unlike containerd's and tailscale's
// atomicfile, which promise readers a whole file, this one also promises that the rename
// survives a power cut once WriteFile returns: extract's index is committed only after.
//
// It is a leaf (stdlib only) so that every package that writes state can use it.
package atomicfile

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
)

// WriteFile replaces path with data: a reader sees the old file or the new one, never a
// torn one, and a crash leaves at most a temp file named after path (base + ".tmp*").
func WriteFile(path string, data []byte, perm os.FileMode) error {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	f, err := os.CreateTemp(dir, "."+base+".tmp*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	tmp := f.Name()
	_, err = f.Write(data)
	if err == nil {
		err = f.Chmod(perm)
	}
	if err == nil {
		err = Sync(f)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		// The temp is ours (CreateTemp's name); a failure to remove it leaves a *.tmp*
		// beside path and does not change what the caller must hear: the write failed.
		_ = os.Remove(tmp)
		return fmt.Errorf("write %s: %w", path, err)
	}
	return SyncDir(dir)
}

// SyncDir fsyncs a directory so that entries created, renamed or removed in it before
// the call survive a crash. Concurrent callers on one directory share fsyncs: a caller
// waits for an fsync that started after it arrived (one already running may have missed
// its entry), and every caller waiting then is covered by it. Movers renaming into one
// rows_ folder thus pay one directory fsync per group, not one each. Filesystems that
// cannot sync a directory (EINVAL, ENOTSUP) are taken at their word.
func SyncDir(dir string) error {
	g, _ := dirGroups.LoadOrStore(filepath.Clean(dir), &dirGroup{})
	return g.(*dirGroup).sync(dir)
}

var dirGroups sync.Map // cleaned dir → *dirGroup

// dirGroup numbers the fsyncs of one directory: started counts those begun, done the
// number of the last finished (they finish in order, one at a time).
type dirGroup struct {
	mu      sync.Mutex
	cond    *sync.Cond
	running bool
	started uint64
	done    uint64
	// errSeq is the number of the last fsync that failed, err its error: a caller whose
	// fsync window includes it gets the error, even if a later fsync succeeded (a
	// writeback error is reported once, to the descriptors open when it happened).
	errSeq uint64
	err    error
}

func (g *dirGroup) sync(dir string) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.cond == nil {
		g.cond = sync.NewCond(&g.mu)
	}
	need := g.started + 1 // the first fsync that can start from now on
	for g.done < need {
		if g.running {
			g.cond.Wait()
			continue
		}
		g.running = true
		g.started++
		n := g.started
		g.mu.Unlock()
		err := syncDirOnce(dir)
		g.mu.Lock()
		g.running, g.done = false, n
		if err != nil {
			g.errSeq, g.err = n, err
		}
		g.cond.Broadcast()
	}
	return g.errFor(need)
}

// errFor is the error of a failed fsync numbered need or later, if any (mu held).
func (g *dirGroup) errFor(need uint64) error {
	if g.errSeq >= need {
		return g.err
	}
	return nil
}

func syncDirOnce(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("open directory %s: %w", dir, err)
	}
	err = syncDir(d)
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	if errors.Is(err, syscall.EINVAL) || errors.Is(err, syscall.ENOTSUP) {
		err = nil
	}
	if err != nil {
		return fmt.Errorf("fsync directory %s: %w", dir, err)
	}
	return nil
}

// MkdirAll creates dir and any missing parents, and returns only once the whole path is
// durable: each directory's entry in its parent has been fsynced after it appeared.
//
// A directory that exists is not yet durable: another goroutine may have just created
// it and not yet fsynced its parent, and a mover that renamed a file into it and
// committed the sample would lose the file to a power cut. So MkdirAll trusts only
// directories it has seen made durable in this process (durableDirs); for any other
// one on the path, existing or new, it fsyncs the parent itself (such fsyncs are
// shared by concurrent callers, see SyncDir). Each path costs this once per process.
func MkdirAll(dir string, perm os.FileMode) error {
	dir = filepath.Clean(dir)
	if _, known := durableDirs.Load(dir); known {
		if st, err := os.Lstat(dir); err == nil && st.IsDir() {
			return nil
		}
		// Removed (or replaced) since: it is made again below, and synced again.
	}
	// The path's directories not known durable, dir first, up to one that is.
	var unknown []string
	for d := dir; ; d = filepath.Dir(d) {
		if _, known := durableDirs.Load(d); known {
			if _, err := os.Lstat(d); err == nil {
				break
			}
		}
		unknown = append(unknown, d)
		if filepath.Dir(d) == d {
			break
		}
	}
	var existed []bool
	for _, d := range unknown {
		_, err := os.Lstat(d)
		existed = append(existed, err == nil)
	}
	if err := os.MkdirAll(dir, perm); err != nil {
		return fmt.Errorf("create directory %s: %w", dir, err)
	}
	afterMkdir(dir)
	for i := len(unknown) - 1; i >= 0; i-- {
		d := unknown[i]
		parent := filepath.Dir(d)
		if parent != d {
			err := SyncDir(parent)
			// An ancestor that was there before this call and whose parent this user may
			// not open (a 0711 home) is as durable as we can know; one we created is not.
			if err != nil && !(existed[i] && errors.Is(err, os.ErrPermission)) {
				return err
			}
		}
		durableDirs.Store(d, struct{}{})
	}
	return nil
}

// durableDirs holds the cleaned paths of directories whose entry in their parent this
// process has fsynced (or that are the root): MkdirAll needs no fsync for them.
var durableDirs sync.Map

// afterMkdir runs between MkdirAll's mkdir and its fsyncs: a test holds one caller
// there to show that another caller, finding the directory already made, does not
// return before the directory is durable.
var afterMkdir = func(string) {}
