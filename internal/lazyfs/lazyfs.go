package lazyfs

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// ErrUnavailable means this machine cannot mount FUSE (no /dev/fuse, or no privilege):
// tests skip on it rather than fail.
var ErrUnavailable = errors.New("lazyfs: FUSE mounts are not available here")

// FS is one simulated disk. It outlives its mounts: PowerCut unmounts it, drops what
// was not synced and mounts it again at the same place.
type FS struct {
	m *model

	mu     sync.Mutex // guards dir and server
	dir    string
	server *fuse.Server
	boots  int
}

// New returns an empty disk.
func New() *FS {
	return &FS{m: newModel()}
}

// Stats are counters for test logs.
type Stats struct {
	// Boots counts mounts; FileSyncs and DirSyncs count fsync/fdatasync calls served.
	Boots, FileSyncs, DirSyncs int
}

// SetSyncDelay makes every later fsync take d, like a slow disk: what waits on the
// disk shows in a test's timing.
func (f *FS) SetSyncDelay(d time.Duration) { f.m.syncDelay.Store(int64(d)) }

// Stats returns the counters so far.
func (f *FS) Stats() Stats {
	f.m.mu.Lock()
	defer f.m.mu.Unlock()
	f.mu.Lock()
	defer f.mu.Unlock()
	return Stats{Boots: f.boots, FileSyncs: int(f.m.fileSyncs), DirSyncs: int(f.m.dirSyncs)}
}

// Mount makes the disk visible at dir, an existing empty directory.
func (f *FS) Mount(dir string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.server != nil {
		return fmt.Errorf("lazyfs: already mounted at %s", f.dir)
	}
	return f.mountLocked(dir)
}

func (f *FS) mountLocked(dir string) error {
	if dev, err := os.OpenFile("/dev/fuse", os.O_RDWR, 0); err != nil {
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	} else if err := dev.Close(); err != nil {
		return fmt.Errorf("%w: close /dev/fuse: %w", ErrUnavailable, err)
	}
	f.m.mu.Lock()
	gen := f.m.gen
	root := f.m.root
	f.m.mu.Unlock()

	zero := time.Duration(0)
	opts := &fs.Options{
		EntryTimeout:    &zero,
		AttrTimeout:     &zero,
		NegativeTimeout: &zero,
		RootStableAttr:  &fs.StableAttr{Ino: root.id, Mode: syscall.S_IFDIR},
		MountOptions: fuse.MountOptions{
			FsName: "lazyfs",
			Name:   "lazyfs",
			// The kernel would otherwise ask for security.capability before every write.
			DisableXAttrs: true,
			// As root, mount(2) itself: no fusermount binary needed, and its error is the
			// real one. Others fall back to fusermount.
			DirectMountStrict: os.Geteuid() == 0,
			DirectMount:       true,
		},
	}
	server, err := fs.Mount(dir, &node{m: f.m, in: root, gen: gen}, opts)
	if err != nil {
		if os.Geteuid() != 0 || errors.Is(err, syscall.EPERM) || errors.Is(err, syscall.EACCES) {
			return fmt.Errorf("%w: mount %s: %w", ErrUnavailable, dir, err)
		}
		return fmt.Errorf("lazyfs: mount %s: %w", dir, err)
	}
	f.dir, f.server = dir, server
	f.boots++
	return nil
}

// Unmount takes the disk away; its live view stays as it was (a clean unmount would
// sync, but nothing here needs that: call PowerCut to lose what was not synced).
func (f *FS) Unmount() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.unmountLocked()
}

func (f *FS) unmountLocked() error {
	if f.server == nil {
		return nil
	}
	var err error
	for try := 0; try < 20; try++ {
		if err = syscall.Unmount(f.dir, 0); err != syscall.EBUSY {
			break
		}
		// A killed process may need a moment to release its files.
		time.Sleep(10 * time.Millisecond)
	}
	if err != nil {
		// Still busy: abort the connection (every pending and later request fails) and
		// detach, as pulling the plug would.
		err = syscall.Unmount(f.dir, syscall.MNT_FORCE|syscall.MNT_DETACH)
	}
	if err != nil {
		return fmt.Errorf("lazyfs: unmount %s: %w", f.dir, err)
	}
	served := make(chan struct{})
	go func() {
		f.server.Wait()
		close(served)
	}()
	select {
	case <-served:
	case <-time.After(10 * time.Second):
		return fmt.Errorf("lazyfs: unmount %s: the FUSE server did not stop", f.dir)
	}
	f.server = nil
	return nil
}

// PowerCut simulates losing power and booting again: the mount goes away, everything
// not synced is lost, and the disk is mounted again at the same place. Callers kill the
// processes using the mount first, as the power cut would have.
func (f *FS) PowerCut() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	dir := f.dir
	if err := f.unmountLocked(); err != nil {
		return err
	}
	f.m.mu.Lock()
	f.m.cut()
	f.m.mu.Unlock()
	if dir == "" {
		return nil
	}
	return f.mountLocked(dir)
}
