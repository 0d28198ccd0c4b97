// Package lazyfs is a FUSE filesystem for tests that behaves like a disk behind a volatile
// page cache, as LazyFS does for etcd and Jepsen: what a process wrote but did not fsync
// is lost on a simulated power cut. SIGKILL never drops the kernel's page cache, so
// without this a missing fsync passes every crash test.
//
// The model keeps two views of every inode, in memory (test data is tens of MiB):
//
//   - live: what processes see through the mount;
//   - durable: what survives a power cut.
//
// The rules are conservative ext4 without its journal's side effects:
//
//   - write and truncate change the live data; fsync or fdatasync of a file makes that
//     inode's live data, size and mode durable, and nothing else;
//   - create, mkdir, rename, unlink and rmdir change the live entries of a directory;
//     fsync of a directory makes its live entries (name → inode) durable, and nothing
//     else: an inode so named keeps whatever data it last synced (empty if never);
//   - PowerCut unmounts (forcibly if something still holds the mount), replaces every
//     live view by the durable one, drops inodes no durable entry reaches, and mounts
//     again: processes after the "reboot" see only what was synced.
//
// Because a directory fsync records names for inodes, an inode can end up durable under
// two names (renamed between directories with both fsynced at different moments); a
// real journal would not allow that, and no test here depends on it.
//
// The kernel must never answer from a cache that outlives a cut: entry, attribute and
// negative timeouts are zero, and each boot is a new mount, so a new superblock with an
// empty page cache. Files are not opened with direct_io, so mmap (bbolt reads its
// index through one) works. flock and POSIX locks are left to the kernel's local
// emulation. Mounting uses mount(2) directly (root, /dev/fuse), no fusermount binary.
//
// The process that serves the mount must not mmap files on it (bbolt does): a page
// fault into its own FUSE server blocks a thread the Go runtime cannot stop for GC,
// while the GC has stopped the server. Run such code in a child process.
package lazyfs

import (
	"maps"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// inode is one file or directory, with both its views.
type inode struct {
	id  uint64
	dir bool
	uid uint32
	gid uint32

	// live view
	perm    uint32
	data    []byte
	entries map[string]*inode
	mtime   time.Time
	ctime   time.Time

	// durable view
	dPerm    uint32
	dData    []byte
	dEntries map[string]*inode
	dMtime   time.Time
}

// model holds the inodes; one mutex guards all of it, which is plenty for test loads.
type model struct {
	mu     sync.Mutex
	root   *inode
	nextID uint64
	// gen counts boots: nodes handed to the kernel in an earlier boot answer EIO, so
	// nothing that slipped past an unmount can change the new boot's live view.
	gen uint64

	// counters for test logs
	fileSyncs, dirSyncs uint64

	// syncDelay (nanoseconds) is how long every fsync takes: a slow disk's latency.
	syncDelay atomic.Int64
}

func newModel() *model {
	m := &model{nextID: 1}
	m.root = m.newInode(true, 0o755, 0, 0)
	// The root is the disk itself: it exists whatever was synced.
	m.root.dEntries = map[string]*inode{}
	return m
}

func (m *model) newInode(dir bool, perm, uid, gid uint32) *inode {
	m.nextID++
	now := time.Now()
	in := &inode{id: m.nextID, dir: dir, uid: uid, gid: gid, perm: perm & 0o7777, mtime: now, ctime: now, dMtime: now}
	in.dPerm = in.perm
	if dir {
		in.entries = map[string]*inode{}
		in.dEntries = map[string]*inode{}
	}
	return in
}

// syncInode makes in's live state durable: data and size for a file, entries for a
// directory. Caller holds mu.
func (m *model) syncInode(in *inode) {
	in.dPerm = in.perm
	in.dMtime = in.mtime
	if in.dir {
		in.dEntries = maps.Clone(in.entries)
		m.dirSyncs++
		return
	}
	in.dData = append([]byte(nil), in.data...)
	m.fileSyncs++
}

// cut replaces the live view by the durable one and starts a new generation. Inodes
// that no durable entry reaches are forgotten. Caller holds mu.
func (m *model) cut() {
	m.gen++
	seen := map[*inode]bool{}
	var walk func(in *inode)
	walk = func(in *inode) {
		if seen[in] {
			return
		}
		seen[in] = true
		in.perm = in.dPerm
		in.mtime = in.dMtime
		in.ctime = in.dMtime
		if !in.dir {
			in.data = append([]byte(nil), in.dData...)
			return
		}
		in.entries = maps.Clone(in.dEntries)
		for _, child := range in.dEntries {
			walk(child)
		}
	}
	walk(m.root)
}

// write stores p at off in the live data, growing the file as needed.
func (in *inode) write(p []byte, off int64) {
	end := off + int64(len(p))
	if end > int64(len(in.data)) {
		in.resize(end)
	}
	copy(in.data[off:], p)
	in.mtime = time.Now()
	in.ctime = in.mtime
}

func (in *inode) resize(size int64) {
	if size <= int64(cap(in.data)) {
		old := len(in.data)
		in.data = in.data[:size]
		// Bytes beyond the old end read as zero, as after a real truncate up.
		clear(in.data[min(int64(old), size):])
		return
	}
	grown := make([]byte, size, max(size, 2*int64(cap(in.data))))
	copy(grown, in.data)
	in.data = grown
}

// attr fills a stat for the live view.
func (in *inode) attr(out *syscall.Stat_t) {
	out.Ino = in.id
	out.Uid, out.Gid = in.uid, in.gid
	if in.dir {
		out.Mode = syscall.S_IFDIR | in.perm
		out.Nlink = 2
		for _, c := range in.entries {
			if c.dir {
				out.Nlink++
			}
		}
		out.Size = 4096
	} else {
		out.Mode = syscall.S_IFREG | in.perm
		out.Nlink = 1
		out.Size = int64(len(in.data))
	}
	out.Blksize = 4096
	out.Blocks = (out.Size + 511) / 512
	out.Mtim = syscall.NsecToTimespec(in.mtime.UnixNano())
	out.Ctim = syscall.NsecToTimespec(in.ctime.UnixNano())
	out.Atim = out.Mtim
}

// used is the live bytes held, for statfs.
func (m *model) used() uint64 {
	var n uint64
	seen := map[*inode]bool{}
	var walk func(in *inode)
	walk = func(in *inode) {
		if seen[in] {
			return
		}
		seen[in] = true
		n += uint64(len(in.data))
		for _, c := range in.entries {
			walk(c)
		}
	}
	walk(m.root)
	return n
}
