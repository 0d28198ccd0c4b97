package checkpoint

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"time"

	"github.com/extract-dev/extract/internal/atomicfile"
)

// bbolt's on-disk meta page (go.etcd.io/bbolt/internal/common): a 16-byte page header,
// then the meta, in the machine's byte order. These are the format's constants, not
// its code: a file bbolt would reject or fault on is refused before bolt.Open maps it.
const (
	boltMagic        = 0xED0CDAED
	boltVersion      = 2
	boltPageHeader   = 16
	boltMetaChecksum = 56 // the checksum covers the meta up to this offset
	boltMetaSize     = 64
	boltNoFreelist   = ^uint64(0)
	boltMinPageSize  = 1024
	boltMaxPageSize  = 1 << 24 // bbolt probes for the second meta up to 16 MiB
)

// boltMeta is what checkFile needs of a meta page.
type boltMeta struct {
	pageSize               uint64
	root, freelist, pgid   uint64
	txid                   uint64
	magicOK, versionOK, ok bool
}

func parseBoltMeta(page []byte) boltMeta {
	if len(page) < boltPageHeader+boltMetaSize {
		return boltMeta{}
	}
	b := page[boltPageHeader : boltPageHeader+boltMetaSize]
	ne := binary.NativeEndian
	m := boltMeta{
		pageSize: uint64(ne.Uint32(b[8:])),
		root:     ne.Uint64(b[16:]),
		freelist: ne.Uint64(b[32:]),
		pgid:     ne.Uint64(b[40:]),
		txid:     ne.Uint64(b[48:]),
	}
	m.magicOK = ne.Uint32(b[0:]) == boltMagic
	m.versionOK = ne.Uint32(b[4:]) == boltVersion
	h := fnv.New64a()
	h.Write(b[:boltMetaChecksum])
	m.ok = m.magicOK && m.versionOK && h.Sum64() == ne.Uint64(b[boltMetaChecksum:])
	return m
}

func (m boltMeta) why() string {
	switch {
	case !m.magicOK:
		return "no bbolt magic"
	case !m.versionOK:
		return "not bbolt format version 2"
	case !m.ok:
		return "checksum mismatch"
	}
	return "ok"
}

// checkFile reads the two meta pages of the bbolt file at path the way bbolt will and
// refuses a file it would fault on: no valid meta page, a page size out of range, or a
// file shorter than the high-water mark of the meta that bbolt would use (pages past
// the end of a mapped file are SIGBUS, which kills the process). An empty file is fine
// for a read-write open, which initialises it, and damage for a read-only one.
func checkFile(path string, readOnly bool) error {
	damaged := func(format string, args ...any) error {
		return fmt.Errorf("index %s: %w: %s", path, ErrDamaged, fmt.Sprintf(format, args...))
	}
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil // bbolt creates it (read-write) or reports it missing (read-only)
	}
	if err != nil {
		return fmt.Errorf("index %s: %w", path, err)
	}
	defer func() { _ = f.Close() }()
	st, err := f.Stat()
	if err != nil {
		return fmt.Errorf("index %s: %w", path, err)
	}
	if !st.Mode().IsRegular() {
		return damaged("not a regular file (%s)", st.Mode().Type())
	}
	size := st.Size()
	if size == 0 {
		if readOnly {
			return damaged("the file is empty (0 bytes): no index was ever written to it")
		}
		return nil
	}
	read := func(off int64) []byte {
		buf := make([]byte, boltPageHeader+boltMetaSize)
		n, _ := f.ReadAt(buf, off)
		return buf[:n]
	}

	// The page size comes from the first valid meta: page 0, else page 1 probed at each
	// possible page size, as bbolt's getPageSize does.
	m0 := parseBoltMeta(read(0))
	pageSize := uint64(0)
	if m0.ok {
		pageSize = m0.pageSize
	} else {
		for ps := int64(boltMinPageSize); ps <= boltMaxPageSize && ps < size-boltMinPageSize; ps <<= 1 {
			if m := parseBoltMeta(read(ps)); m.ok {
				pageSize = m.pageSize
				break
			}
		}
	}
	if pageSize == 0 {
		return damaged("no valid meta page in %d bytes (page 0: %s)", size, m0.why())
	}
	if pageSize < boltMinPageSize || pageSize > boltMaxPageSize || pageSize&(pageSize-1) != 0 {
		return damaged("meta page size %d is not a power of two in %d..%d", pageSize, boltMinPageSize, boltMaxPageSize)
	}
	if uint64(size) < 2*pageSize {
		return damaged("the file is %d bytes, shorter than its two %d-byte meta pages (truncated)", size, pageSize)
	}
	m1 := parseBoltMeta(read(int64(pageSize)))

	// bbolt uses the valid meta with the higher txid.
	use, which := m0, 0
	if !m0.ok || (m1.ok && m1.txid > m0.txid) {
		use, which = m1, 1
	}
	if !use.ok {
		return damaged("both meta pages are invalid (page 0: %s; page 1: %s)", m0.why(), m1.why())
	}
	if use.pageSize != pageSize {
		return damaged("meta page %d says page size %d, the file's first meta %d", which, use.pageSize, pageSize)
	}
	if use.pgid < 2 || use.pgid > uint64(size)/pageSize {
		return damaged("the file is %d bytes, but meta page %d (txid %d) says %d pages of %d bytes (%d bytes): truncated",
			size, which, use.txid, use.pgid, pageSize, use.pgid*pageSize)
	}
	if use.root >= use.pgid || (use.freelist != boltNoFreelist && use.freelist >= use.pgid) {
		return damaged("meta page %d points past its %d pages (root %d, freelist %d)", which, use.pgid, use.root, use.freelist)
	}
	return nil
}

// guard runs fn, which touches bbolt's mmap, so that a damaged file is an error: a
// fault on a page past the end of the file (SIGBUS) becomes a panic on this goroutine
// instead of killing the process, and guard turns that panic, or one bbolt raises itself
// (its assertions about the pages it reads), into an error wrapping ErrDamaged that
// names the file. Any other panic (a bug in the code fn runs: a nil map, an index out of
// range) is re-panicked: calling it damage would send the operator to move a sound index
// aside and rebuild it.
func guard(path string, fn func() error) (err error) {
	old := debug.SetPanicOnFault(true)
	defer func() {
		debug.SetPanicOnFault(old)
		if r := recover(); r != nil {
			if !isFault(r) && !raisedByBolt() {
				panic(r)
			}
			err = fmt.Errorf("index %s: %w: reading it failed: %v", path, ErrDamaged, r)
		}
	}()
	return fn()
}

// isFault says whether a recovered value is a memory fault that SetPanicOnFault turned
// into a panic: a runtime.Error that carries the faulting address.
func isFault(r any) bool {
	re, ok := r.(runtime.Error)
	if !ok {
		return false
	}
	_, ok = re.(interface{ Addr() uintptr })
	return ok
}

// raisedByBolt says whether the panic being recovered started in bbolt's code: called
// from a deferred function, it finds runtime.gopanic on the stack and the first frame
// below it outside the runtime (which raises index and nil errors on the code's behalf).
func raisedByBolt() bool {
	pcs := make([]uintptr, 128)
	frames := runtime.CallersFrames(pcs[:runtime.Callers(1, pcs)])
	inPanic := false
	for {
		f, more := frames.Next()
		switch {
		case f.Function == "runtime.gopanic":
			inPanic = true
		case inPanic && !strings.HasPrefix(f.Function, "runtime."):
			return strings.HasPrefix(f.Function, "go.etcd.io/bbolt")
		}
		if !more {
			return false
		}
	}
}

// MoveAside renames a damaged or unwanted index to <path>.broken-<UTC time> in the same
// directory and makes the rename durable; it never deletes. The caller then creates a
// new index at path, Inits it and runs Verify with Repair to rebuild it from the
// output files. It returns the new name.
func MoveAside(path string) (string, error) {
	if _, err := os.Lstat(path); err != nil {
		return "", fmt.Errorf("move index aside: %w", err)
	}
	stamp := time.Now().UTC().Format("20060102T150405.000000000Z")
	aside := path + ".broken-" + stamp
	// Never overwrite an earlier one (the stamp's nanoseconds make a clash a bug).
	if _, err := os.Lstat(aside); !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("move index %s aside: %s exists", path, aside)
	}
	if err := os.Rename(path, aside); err != nil {
		return "", fmt.Errorf("move index %s aside: %w", path, err)
	}
	if err := atomicfile.SyncDir(filepath.Dir(path)); err != nil {
		return "", fmt.Errorf("move index %s aside to %s: %w", path, aside, err)
	}
	return aside, nil
}
