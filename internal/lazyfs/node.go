package lazyfs

import (
	"context"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// node is the kernel's handle on one model inode during one boot.
type node struct {
	fs.Inode
	m   *model
	in  *inode
	gen uint64
}

var (
	_ fs.NodeLookuper   = (*node)(nil)
	_ fs.NodeGetattrer  = (*node)(nil)
	_ fs.NodeSetattrer  = (*node)(nil)
	_ fs.NodeOpener     = (*node)(nil)
	_ fs.NodeCreater    = (*node)(nil)
	_ fs.NodeReader     = (*node)(nil)
	_ fs.NodeWriter     = (*node)(nil)
	_ fs.NodeFsyncer    = (*node)(nil)
	_ fs.NodeMkdirer    = (*node)(nil)
	_ fs.NodeUnlinker   = (*node)(nil)
	_ fs.NodeRmdirer    = (*node)(nil)
	_ fs.NodeRenamer    = (*node)(nil)
	_ fs.NodeReaddirer  = (*node)(nil)
	_ fs.NodeStatfser   = (*node)(nil)
	_ fs.NodeOpendirer  = (*node)(nil)
	_ fs.NodeAllocater  = (*node)(nil)
	_ fs.NodeAccesser   = (*node)(nil)
	_ fs.NodeGetxattrer = (*node)(nil)
)

// lock takes the model lock and refuses nodes of an earlier boot.
func (n *node) lock() syscall.Errno {
	n.m.mu.Lock()
	if n.gen != n.m.gen {
		n.m.mu.Unlock()
		return syscall.EIO
	}
	return 0
}

func (n *node) unlock() { n.m.mu.Unlock() }

func (n *node) child(ctx context.Context, in *inode, out *fuse.EntryOut) *fs.Inode {
	var st syscall.Stat_t
	in.attr(&st)
	out.Attr.FromStat(&st)
	mode := uint32(syscall.S_IFREG)
	if in.dir {
		mode = syscall.S_IFDIR
	}
	return n.NewInode(ctx, &node{m: n.m, in: in, gen: n.gen}, fs.StableAttr{Mode: mode, Ino: in.id})
}

func (n *node) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if e := n.lock(); e != 0 {
		return nil, e
	}
	defer n.unlock()
	if !n.in.dir {
		return nil, syscall.ENOTDIR
	}
	c, ok := n.in.entries[name]
	if !ok {
		return nil, syscall.ENOENT
	}
	return n.child(ctx, c, out), 0
}

func (n *node) Getattr(ctx context.Context, f fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	if e := n.lock(); e != 0 {
		return e
	}
	defer n.unlock()
	var st syscall.Stat_t
	n.in.attr(&st)
	out.Attr.FromStat(&st)
	return 0
}

func (n *node) Setattr(ctx context.Context, f fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if e := n.lock(); e != 0 {
		return e
	}
	defer n.unlock()
	if size, ok := in.GetSize(); ok {
		if n.in.dir {
			return syscall.EISDIR
		}
		n.in.resize(int64(size))
	}
	if mode, ok := in.GetMode(); ok {
		n.in.perm = mode & 0o7777
	}
	if uid, ok := in.GetUID(); ok {
		n.in.uid = uid
	}
	if gid, ok := in.GetGID(); ok {
		n.in.gid = gid
	}
	if mtime, ok := in.GetMTime(); ok {
		n.in.mtime = mtime
	}
	var st syscall.Stat_t
	n.in.attr(&st)
	out.Attr.FromStat(&st)
	return 0
}

// Open hands out no file handle: reads and writes go to the node, and the kernel keeps
// neither direct_io (mmap must work) nor a cache across opens.
func (n *node) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	if e := n.lock(); e != 0 {
		return nil, 0, e
	}
	defer n.unlock()
	if n.in.dir {
		return nil, 0, syscall.EISDIR
	}
	if flags&syscall.O_TRUNC != 0 && flags&syscall.O_ACCMODE != syscall.O_RDONLY {
		n.in.resize(0)
	}
	return nil, 0, 0
}

func (n *node) Opendir(ctx context.Context) syscall.Errno {
	if e := n.lock(); e != 0 {
		return e
	}
	n.unlock()
	return 0
}

func (n *node) Create(ctx context.Context, name string, flags uint32, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	if e := n.lock(); e != 0 {
		return nil, nil, 0, e
	}
	defer n.unlock()
	if c, ok := n.in.entries[name]; ok {
		if flags&syscall.O_EXCL != 0 {
			return nil, nil, 0, syscall.EEXIST
		}
		if c.dir {
			return nil, nil, 0, syscall.EISDIR
		}
		if flags&syscall.O_TRUNC != 0 {
			c.resize(0)
		}
		return n.child(ctx, c, out), nil, 0, 0
	}
	uid, gid := caller(ctx)
	c := n.m.newInode(false, mode, uid, gid)
	n.in.entries[name] = c
	n.in.touch()
	return n.child(ctx, c, out), nil, 0, 0
}

func (n *node) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if e := n.lock(); e != 0 {
		return nil, e
	}
	defer n.unlock()
	if _, ok := n.in.entries[name]; ok {
		return nil, syscall.EEXIST
	}
	uid, gid := caller(ctx)
	c := n.m.newInode(true, mode, uid, gid)
	n.in.entries[name] = c
	n.in.touch()
	return n.child(ctx, c, out), 0
}

func (n *node) Read(ctx context.Context, f fs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	if e := n.lock(); e != 0 {
		return nil, e
	}
	defer n.unlock()
	if off >= int64(len(n.in.data)) {
		return fuse.ReadResultData(nil), 0
	}
	// A copy: the model's slice may change once the lock is released.
	k := copy(dest, n.in.data[off:])
	return fuse.ReadResultData(dest[:k]), 0
}

func (n *node) Write(ctx context.Context, f fs.FileHandle, data []byte, off int64) (uint32, syscall.Errno) {
	if e := n.lock(); e != 0 {
		return 0, e
	}
	defer n.unlock()
	n.in.write(data, off)
	return uint32(len(data)), 0
}

// Fsync serves fsync and fdatasync of files and of directories alike.
func (n *node) Fsync(ctx context.Context, f fs.FileHandle, flags uint32) syscall.Errno {
	// Outside the lock: concurrent fsyncs wait together, as on a disk.
	time.Sleep(time.Duration(n.m.syncDelay.Load()))
	if e := n.lock(); e != 0 {
		return e
	}
	defer n.unlock()
	n.m.syncInode(n.in)
	return 0
}

func (n *node) Allocate(ctx context.Context, f fs.FileHandle, off uint64, size uint64, mode uint32) syscall.Errno {
	if mode != 0 {
		return syscall.EOPNOTSUPP
	}
	if e := n.lock(); e != 0 {
		return e
	}
	defer n.unlock()
	if end := int64(off + size); end > int64(len(n.in.data)) {
		n.in.resize(end)
	}
	return 0
}

// Access allows everything: the tests run as root.
func (n *node) Access(ctx context.Context, mask uint32) syscall.Errno { return 0 }

// Getxattr says there are none, quickly.
func (n *node) Getxattr(ctx context.Context, attr string, dest []byte) (uint32, syscall.Errno) {
	return 0, syscall.ENODATA
}

func (n *node) Unlink(ctx context.Context, name string) syscall.Errno {
	return n.remove(name, false)
}

func (n *node) Rmdir(ctx context.Context, name string) syscall.Errno {
	return n.remove(name, true)
}

func (n *node) remove(name string, dir bool) syscall.Errno {
	if e := n.lock(); e != 0 {
		return e
	}
	defer n.unlock()
	c, ok := n.in.entries[name]
	switch {
	case !ok:
		return syscall.ENOENT
	case dir && !c.dir:
		return syscall.ENOTDIR
	case !dir && c.dir:
		return syscall.EISDIR
	case dir && len(c.entries) > 0:
		return syscall.ENOTEMPTY
	}
	delete(n.in.entries, name)
	n.in.touch()
	return 0
}

const renameNoReplace = 1 // RENAME_NOREPLACE

func (n *node) Rename(ctx context.Context, name string, newParent fs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	if flags&^renameNoReplace != 0 {
		return syscall.EINVAL
	}
	if e := n.lock(); e != 0 {
		return e
	}
	defer n.unlock()
	dst, ok := newParent.(*node)
	if !ok || dst.gen != n.gen {
		return syscall.EXDEV
	}
	src, ok := n.in.entries[name]
	if !ok {
		return syscall.ENOENT
	}
	if old, ok := dst.in.entries[newName]; ok {
		switch {
		case old == src:
			return 0
		case flags&renameNoReplace != 0:
			return syscall.EEXIST
		case old.dir && !src.dir:
			return syscall.EISDIR
		case !old.dir && src.dir:
			return syscall.ENOTDIR
		case old.dir && len(old.entries) > 0:
			return syscall.ENOTEMPTY
		}
	}
	if src.dir && src.reaches(dst.in) {
		return syscall.EINVAL
	}
	delete(n.in.entries, name)
	dst.in.entries[newName] = src
	n.in.touch()
	dst.in.touch()
	return 0
}

// reaches says whether d is in or under the directory in, through live entries.
func (in *inode) reaches(d *inode) bool {
	if in == d {
		return true
	}
	for _, c := range in.entries {
		if c.dir && c.reaches(d) {
			return true
		}
	}
	return false
}

func (in *inode) touch() {
	in.mtime = time.Now()
	in.ctime = in.mtime
}

func (n *node) Readdir(ctx context.Context) (fs.DirStream, syscall.Errno) {
	if e := n.lock(); e != 0 {
		return nil, e
	}
	defer n.unlock()
	list := make([]fuse.DirEntry, 0, len(n.in.entries))
	for name, c := range n.in.entries {
		mode := uint32(syscall.S_IFREG)
		if c.dir {
			mode = syscall.S_IFDIR
		}
		list = append(list, fuse.DirEntry{Name: name, Mode: mode, Ino: c.id})
	}
	return fs.NewListDirStream(list), 0
}

// capacity is the disk size statfs reports; extract checks free space against a reserve.
const capacity = 64 << 30

func (n *node) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	if e := n.lock(); e != 0 {
		return e
	}
	defer n.unlock()
	const bsize = 4096
	used := (n.m.used() + bsize - 1) / bsize
	out.Bsize = bsize
	out.Frsize = bsize
	out.Blocks = capacity / bsize
	out.Bfree = out.Blocks - min(used, out.Blocks)
	out.Bavail = out.Bfree
	out.Files = 1 << 20
	out.Ffree = out.Files - min(n.m.nextID, out.Files)
	out.NameLen = 255
	return 0
}

func caller(ctx context.Context) (uid, gid uint32) {
	if c, ok := fuse.FromContext(ctx); ok {
		return c.Uid, c.Gid
	}
	return 0, 0
}
