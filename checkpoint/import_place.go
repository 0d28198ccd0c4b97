package checkpoint

import (
	"bufio"
	"compress/gzip"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/extract-dev/extract/internal/atomicfile"
	"github.com/extract-dev/extract/internal/torchzip"
)

// checkFunc checks an opened file's tensors as import requires: the crc32c of what it
// read, or a reason to refuse the file.
type checkFunc func(f *sampleFile) (sum uint32, reason string, err error)

// placedFile is what a placement put under the final name, or why it refused.
type placedFile struct {
	size   int64
	sum    uint32
	copied bool // a copy of the checked bytes where a link was asked
	reject string
}

// placeAsIs puts sf's file under final unchanged. A link is of the very inode that was
// checked (linkat of the open descriptor, not of the name), and only if an fstat now
// matches before, taken when it was opened; a copy is of that descriptor's bytes, and the copy is
// checked again before its rename, so what is placed is what was checked whatever
// another tool does to the name or the file meanwhile. Either is fsynced, renamed and
// its directory fsynced: the other tool may never have synced it.
func placeAsIs(ctx context.Context, sf *sampleFile, before unix.Stat_t, final string, copyOnly bool, check checkFunc) (placedFile, error) {
	tmp := tempPath(final)
	if err := atomicfile.MkdirAll(filepath.Dir(final), 0o755); err != nil {
		return placedFile{}, err
	}
	if err := os.Remove(tmp); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return placedFile{}, err
	}
	if !copyOnly {
		sum, reason, err := check(sf)
		if err != nil || reason != "" {
			return placedFile{reject: reason}, err
		}
		after, err := fstat(sf.f)
		if err != nil {
			return placedFile{}, err
		}
		if changed(before, after) {
			return placedFile{reject: "the file changed while it was checked (another tool is writing it): import it once it is finished"}, nil
		}
		if linkFd(sf.f, tmp) == nil {
			err := atomicfile.Sync(sf.f) // the same inode: its data and size, durable
			if err == nil {
				err = renameDurably(tmp, final)
			}
			if err != nil {
				os.Remove(tmp)
				return placedFile{}, fmt.Errorf("place %s: %w", final, err)
			}
			return placedFile{size: after.Size, sum: sum}, nil
		}
	}
	p, err := copyFd(ctx, sf, tmp, final)
	if err != nil {
		return placedFile{}, err
	}
	copied, err := openSampleAs(tmp, sf.path)
	if err != nil {
		p.abort()
		return placedFile{}, fmt.Errorf("read back the copy %s: %w", tmp, err)
	}
	sum, reason, err := check(copied)
	size := copied.size
	copied.Close()
	if err != nil || reason != "" {
		p.abort()
		return placedFile{reject: reason}, err
	}
	if err := p.commit(); err != nil {
		return placedFile{}, err
	}
	return placedFile{size: size, sum: sum, copied: !copyOnly}, nil
}

// placeConverted rewrites sf into l's format under final: the source is checked first
// (a refusal writes nothing, and only the source has its zip CRC-32s), the writers
// stream it into a temp file, and that file is checked again before its rename: what
// is placed is what was checked, even if the source changed in between.
func placeConverted(ctx context.Context, sf *sampleFile, l Layout, final string, src ImportFile, want ImportWant, rid string, buf []byte, check checkFunc) (placedFile, error) {
	if _, reason, err := check(sf); err != nil || reason != "" {
		return placedFile{reject: reason}, err
	}
	s := sf.source(want.LossMask)
	s.md = map[string]string{
		"format": outputFormat, "sample": strconv.Itoa(src.Sample), "rid": rid,
		"dataset_fingerprint": want.DatasetFingerprint, "config_fingerprint": want.ConfigFingerprint,
		"layers": want.Layers, "model": want.Model, "protocol": protocolVersion,
		"tokens": strconv.FormatInt(s.T, 10), "hidden_size": strconv.FormatInt(s.H, 10),
		"imported_from": src.Path,
	}
	if s.mask != nil {
		s.md[mdMaskSource] = maskFromFile
	}
	if sf.md != nil {
		s.md["layers"], s.md["model"], s.md["hook_version"] = sf.md["layers"], sf.md["model"], sf.md["hook_version"]
	}
	p, size, sum, err := createSample(ctx, l, final, s, buf)
	if err != nil {
		return placedFile{}, err
	}
	out, err := openSampleAs(p.tmp, final)
	if err != nil {
		p.abort()
		return placedFile{}, fmt.Errorf("read back %s: %w", p.tmp, err)
	}
	got, reason, err := check(out)
	out.Close()
	if err != nil || reason != "" {
		p.abort()
		return placedFile{reject: reason}, err
	}
	if got != sum {
		p.abort()
		return placedFile{}, fmt.Errorf("%s reads back with crc32c %08x, written as %08x", p.tmp, got, sum)
	}
	if err := p.commit(); err != nil {
		return placedFile{}, err
	}
	return placedFile{size: size, sum: sum}, nil
}

// linkFd hard-links the open file's inode at tmp: through /proc/self/fd, which needs no
// privilege (AT_EMPTY_PATH needs CAP_DAC_READ_SEARCH). It fails across filesystems, on
// protected_hardlinks for another user's file, or without /proc; the caller copies.
func linkFd(f *os.File, tmp string) error {
	return unix.Linkat(unix.AT_FDCWD, "/proc/self/fd/"+strconv.Itoa(int(f.Fd())), unix.AT_FDCWD, tmp, unix.AT_SYMLINK_FOLLOW)
}

// copyFd copies the first sf.size bytes of the open file (the size fstat saw when it was
// opened) into a new temp file at tmp, to be committed to final.
func copyFd(ctx context.Context, sf *sampleFile, tmp, final string) (*pendingFile, error) {
	out, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return nil, err
	}
	p := &pendingFile{f: out, tmp: tmp, final: final}
	n, err := io.Copy(newWriteback(out), &ctxReader{ctx, io.NewSectionReader(sf.f, 0, sf.size)})
	if err == nil && n != sf.size {
		err = fmt.Errorf("%s ended at %d of the %d bytes it had when opened", sf.path, n, sf.size)
	}
	if err != nil {
		p.abort()
		return nil, fmt.Errorf("copy %s: %w", sf.path, err)
	}
	return p, nil
}

func renameDurably(tmp, final string) error {
	if err := os.Rename(tmp, final); err != nil {
		return err
	}
	return atomicfile.SyncDir(filepath.Dir(final))
}

func fstat(f *os.File) (unix.Stat_t, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return st, fmt.Errorf("fstat %s: %w", f.Name(), err)
	}
	return st, nil
}

// changed says whether a file was written between two fstats of it.
func changed(a, b unix.Stat_t) bool {
	return a.Size != b.Size || a.Mtim != b.Mtim || a.Ctim != b.Ctim || a.Ino != b.Ino
}

// gunzipRefusal is a .gz source refused before (or while) it was decompressed.
type gunzipRefusal struct{ reason string }

func (e *gunzipRefusal) Error() string { return e.reason }

// ErrScratchFull means the state disk lacks the room to decompress a .gz source: the
// file may be good, the disk is the problem.
var ErrScratchFull = errors.New("not enough room on the state disk to decompress")

// gunzipSlack bounds what a torch zip holds besides its pickle and storages: each
// record's header, padding and descriptor, the central directory, the small records.
const gunzipSlack = 64 << 10

// gunzipBounded decompresses the open .gz sf into a file in scratch, from the same
// descriptor, and returns its path; the caller removes it. The stream's first record
// must be data.pkl: its pickle declares every storage's size, and the tensors must fit
// the dataset line and the job before anything is written. The output is then bounded
// by what the pickle declares, and that must fit the disk's free room less
// want.ScratchKeep: a gzip bomb is refused after at most its declared size.
func gunzipBounded(ctx context.Context, sf *sampleFile, want ImportWant, scratch string) (string, error) {
	refuse := func(format string, args ...any) (string, error) {
		return "", &gunzipRefusal{fmt.Sprintf(format, args...)}
	}
	zr, err := gzip.NewReader(bufio.NewReaderSize(io.NewSectionReader(sf.f, 0, sf.size), 1<<16))
	if err != nil {
		return refuse("gunzip: %v", err)
	}
	defer zr.Close()
	zr.Multistream(false)
	in := &ctxReader{ctx, zr}
	head := make([]byte, 30+2*math.MaxUint16+maxPickle)
	n, err := io.ReadFull(in, head)
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
		return refuse("gunzip: %v", err)
	}
	head = head[:n]
	pkl, err := firstPickle(head)
	if err != nil {
		return refuse("%v", err)
	}
	ts, plen, err := torchzip.DecodeDictPrefix(pkl)
	if err != nil {
		return refuse("%v", err)
	}
	peek := &sampleFile{path: sf.path, gz: true}
	if err := peek.fromPickle(pkl[:plen], func(string) (torchzip.File, bool) { return torchzip.File{}, false }); err != nil {
		return refuse("%v", err)
	}
	if reason := shapeMismatch(peek, want); reason != "" {
		return refuse("%s", reason)
	}
	limit := int64(plen + gunzipSlack)
	for _, t := range ts {
		if limit > math.MaxInt64-t.StorageBytes() {
			return refuse("storages declare more than 2^63 bytes")
		}
		limit += t.StorageBytes()
	}
	if err := os.MkdirAll(scratch, 0o700); err != nil {
		return "", err
	}
	var st unix.Statfs_t
	if err := unix.Statfs(scratch, &st); err != nil {
		return "", fmt.Errorf("statfs %s: %w", scratch, err)
	}
	if free := int64(st.Bavail) * st.Bsize; limit > free-want.ScratchKeep {
		return "", fmt.Errorf("%w %s: its pickle declares up to %d bytes, %s has %d free and keeps %d (disk.reserve): free room on the state disk and import again",
			ErrScratchFull, sf.path, limit, scratch, free, want.ScratchKeep)
	}
	dst := filepath.Join(scratch, strings.TrimSuffix(filepath.Base(sf.path), ".gz"))
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return "", err
	}
	written, err := out.Write(head)
	var rest int64
	if err == nil {
		rest, err = io.Copy(out, io.LimitReader(in, limit-int64(written)+1))
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	switch {
	case err == nil && int64(written)+rest > limit:
		os.Remove(dst)
		return refuse("decompresses past the %d bytes its pickle declares (a gzip bomb?)", limit)
	case errors.Is(err, gzip.ErrChecksum), errors.Is(err, gzip.ErrHeader), errors.Is(err, io.ErrUnexpectedEOF):
		os.Remove(dst)
		return refuse("gunzip: %v", err)
	case err != nil:
		os.Remove(dst)
		return "", fmt.Errorf("gunzip %s into %s: %w", sf.path, scratch, err)
	}
	return dst, nil
}

// maxPickle is the largest data.pkl read: a dict of four tensors takes a few hundred bytes.
const maxPickle = 1 << 20

// firstPickle returns the bytes after the first local header of a zip stream, which
// must be its data.pkl (torch.save writes it first).
func firstPickle(head []byte) ([]byte, error) {
	if len(head) < 30 || binary.LittleEndian.Uint32(head) != 0x04034b50 {
		return nil, errors.New("not a torch zip inside the gzip")
	}
	nl, el := int(binary.LittleEndian.Uint16(head[26:])), int(binary.LittleEndian.Uint16(head[28:]))
	if 30+nl+el > len(head) {
		return nil, errors.New("first record header truncated")
	}
	name := string(head[30 : 30+nl])
	if _, rel, _ := strings.Cut(name, "/"); rel != "data.pkl" {
		return nil, fmt.Errorf("first record is %q, not data.pkl: its size cannot be bounded before decompressing", name)
	}
	return head[30+nl+el:], nil
}
