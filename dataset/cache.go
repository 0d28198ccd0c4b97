package dataset

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/extract-dev/extract/configs"
	"github.com/extract-dev/extract/internal/atomicfile"
)

// The line-index cache lets a resume skip re-reading the dataset. It holds what
// Open computed (each line's offset, length, token count and crc32c, and the
// sha256 fingerprint) together with the file's identity at the time: device, inode,
// size, mtime and ctime, all to the nanosecond. It is used only when the open file's
// identity is exactly that one. Why that is a proof that the bytes are the ones hashed:
//
//   - Every change of a file's bytes through the file system (write, truncate, a write
//     through mmap, a copy-up) sets its ctime to the kernel's current time, and user
//     space cannot set ctime at all: utimensat sets mtime and atime, and sets ctime to
//     now. So an edit with the mtime put back still moves the ctime; a replacement
//     (rename over, delete and create) is another inode, or a reused inode number with a
//     new ctime.
//   - The one way an edit keeps the ctime is to land in the same timestamp tick as the
//     change that set it (git's "racy clean" case): the file was written at T, hashed
//     starting at T, written again at T. So the cache is written only when the ctime
//     and mtime are older than racyMargin before the hash began; any later write then
//     gets a later ctime. Until then every start hashes in full, as before.
//   - File systems that do not keep ctime themselves (FUSE, NFS, SMB: a daemon or a
//     server with its own clock answers stat) are not trusted: only the local ones in
//     ctimeFS are. Elsewhere every start hashes in full.
//
// What it does not cover, as git's index does not: root writing the block device under
// the file system, or stepping the clock back to the ctime's exact tick. Each sample is
// also checked against its line's crc32c when it is read for sending (Sample), so even
// then no line that differs from the hashed one reaches the server.
const datasetCacheName = "dataset.lines"

// racyMargin is how much older than the hash's start the dataset's ctime must be for
// the cache to be written: far above any local file system's timestamp tick (a jiffy).
// Tests lower it.
var racyMargin = time.Second

// ctimeFS are the statfs magic numbers of file systems that set ctime themselves, on
// this kernel's clock.
var ctimeFS = map[int64]string{
	0xEF53:     "ext2/3/4",
	0x58465342: "xfs",
	0x9123683E: "btrfs",
	0x01021994: "tmpfs",
	0xF2F52010: "f2fs",
	0x2FC12FC1: "zfs",
	0x794C7630: "overlayfs",
}

// cacheKey is the dataset file's identity as the cache records it. ctime is here and
// not in fileID: Sample must not fail a days-long job because someone chmods or hard
// links the dataset (both move ctime), while a cache miss only costs one full read.
type cacheKey struct {
	dev, ino     uint64
	size         int64
	mtime, ctime int64 // ns since the epoch
	fsType       int64
}

func cacheKeyOf(f *os.File) (cacheKey, error) {
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		return cacheKey{}, err
	}
	var fs syscall.Statfs_t
	if err := syscall.Fstatfs(int(f.Fd()), &fs); err != nil {
		return cacheKey{}, err
	}
	return cacheKey{
		dev: uint64(st.Dev), ino: st.Ino, size: st.Size,
		mtime: st.Mtim.Nano(), ctime: st.Ctim.Nano(), fsType: int64(fs.Type),
	}, nil
}

// OpenCached is Open that reuses the line index and fingerprint kept in
// stateDir when the dataset file is provably the one they were computed from (see
// datasetCacheName), and otherwise reads it in full and keeps them there for the next
// start. A cache that is missing, stale, corrupt or unreadable is never an error: the
// dataset is read in full (bounded by dataset_max_line, stopped with errclass.ErrTemporary when
// ctx ends). stateDir is created if it is missing ("" keeps no cache).
func OpenCached(ctx context.Context, cfg *configs.Config) (*Dataset, error) {
	path, stateDir := cfg.Dataset, cfg.StateDir
	f, err := openDatasetFile(path)
	if err != nil {
		return nil, err
	}
	d := &Dataset{Path: path, f: f}
	cachePath := ""
	if stateDir != "" {
		cachePath = filepath.Join(stateDir, datasetCacheName)
		if key, err := cacheKeyOf(f); err == nil && ctimeFS[key.fsType] != "" {
			if c, err := readDatasetCache(cachePath); err == nil && c.key == key && (cfg.DatasetMaxLine <= 0 || c.linesWithin(cfg.DatasetMaxLine)) {
				d.lines, d.Fingerprint, d.Size, d.cached = c.lines, c.fingerprint, key.size, true
				d.stat = fileID{dev: key.dev, ino: key.ino, size: key.size, mtime: key.mtime}
				return d, nil
			}
		}
	}
	if err := d.index(ctx, cfg.DatasetMaxLine); err != nil {
		_ = f.Close()
		return nil, err
	}
	if cachePath != "" && d.indexedKey.cacheable() {
		// Best effort: without a cache the next start reads the dataset again, as now.
		if err := atomicfile.MkdirAll(stateDir, 0o755); err == nil {
			_ = atomicfile.WriteFile(cachePath, encodeDatasetCache(d), 0o644)
		}
	}
	return d, nil
}

// indexedKey is the file's identity over a full read: the key before it (equal to the
// one after, or the read failed), and when the read began.
type indexedKey struct {
	key   cacheKey
	began time.Time
	ok    bool // the key was read before and after, and both agree
}

// cacheable says whether a cache of this read may be trusted on a later start.
func (k indexedKey) cacheable() bool {
	if !k.ok || ctimeFS[k.key.fsType] == "" {
		return false
	}
	limit := k.began.Add(-racyMargin).UnixNano()
	return k.key.ctime < limit && k.key.mtime < limit
}

// The cache file: a header, the lines, and a crc32c of all that comes before it.
var datasetCacheMagic = []byte("extract dataset.lines v1\n")

const lineRecord = 8 + 4 + 4 + 4 + 1 // off, len, tokens, crc, text

type datasetCache struct {
	key         cacheKey
	fingerprint string
	lines       []lineRef
}

func encodeDatasetCache(d *Dataset) []byte {
	k := d.indexedKey.key
	b := make([]byte, 0, len(datasetCacheMagic)+6*8+1+len(d.Fingerprint)+8+len(d.lines)*lineRecord+4)
	b = append(b, datasetCacheMagic...)
	for _, v := range []uint64{k.dev, k.ino, uint64(k.size), uint64(k.mtime), uint64(k.ctime), uint64(k.fsType)} {
		b = binary.LittleEndian.AppendUint64(b, v)
	}
	b = append(b, byte(len(d.Fingerprint)))
	b = append(b, d.Fingerprint...)
	b = binary.LittleEndian.AppendUint64(b, uint64(len(d.lines)))
	for _, l := range d.lines {
		b = binary.LittleEndian.AppendUint64(b, uint64(l.off))
		b = binary.LittleEndian.AppendUint32(b, uint32(l.len))
		b = binary.LittleEndian.AppendUint32(b, uint32(l.tokens))
		b = binary.LittleEndian.AppendUint32(b, l.crc)
		t := byte(0)
		if l.text {
			t = 1
		}
		b = append(b, t)
	}
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
}

var errBadCache = errors.New("not a valid dataset cache")

// readDatasetCache reads and checks a cache file: a torn, truncated or corrupted one is
// errBadCache (the crc32c and the lines' own consistency), never lines.
// linesWithin says whether every cached line fits maxLine: a cache kept under a larger
// dataset_max_line must not let a line past the current one.
func (c datasetCache) linesWithin(maxLine configs.ByteSize) bool {
	for _, l := range c.lines {
		if int64(l.len) > int64(maxLine) {
			return false
		}
	}
	return true
}

func readDatasetCache(path string) (datasetCache, error) {
	var c datasetCache
	b, err := os.ReadFile(path)
	if err != nil {
		return c, err
	}
	if len(b) < len(datasetCacheMagic)+6*8+1+8+4 || !bytes.HasPrefix(b, datasetCacheMagic) {
		return c, errBadCache
	}
	body, sum := b[:len(b)-4], binary.LittleEndian.Uint32(b[len(b)-4:])
	if crc32.Checksum(body, castagnoli) != sum {
		return c, errBadCache
	}
	p := body[len(datasetCacheMagic):]
	u64 := func() uint64 { v := binary.LittleEndian.Uint64(p); p = p[8:]; return v }
	c.key = cacheKey{dev: u64(), ino: u64(), size: int64(u64()), mtime: int64(u64()), ctime: int64(u64()), fsType: int64(u64())}
	n := int(p[0])
	p = p[1:]
	if len(p) < n+8 {
		return c, errBadCache
	}
	c.fingerprint = string(p[:n])
	p = p[n:]
	count := u64()
	if count == 0 || uint64(len(p)) != count*lineRecord {
		return c, errBadCache
	}
	c.lines = make([]lineRef, count)
	var end int64
	for i := range c.lines {
		r := p[i*lineRecord : (i+1)*lineRecord]
		l := lineRef{
			off: int64(binary.LittleEndian.Uint64(r)), len: int32(binary.LittleEndian.Uint32(r[8:])),
			tokens: int32(binary.LittleEndian.Uint32(r[12:])), crc: binary.LittleEndian.Uint32(r[16:]), text: r[20] == 1,
		}
		// Lines follow each other in the file, none empty.
		if l.off < end || l.len < 0 || l.tokens < 1 {
			return c, errBadCache
		}
		end = l.off + int64(l.len)
		c.lines[i] = l
	}
	if end > c.key.size {
		return c, errBadCache
	}
	return c, nil
}
