package checkpoint

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// readOutput is ReadOutput for Verify: it can be cancelled between chunks, reuses one
// buffer, and leaves naming the file to the caller. With want it also checks the file
// against the job: width and layers always, and when deep the token count and the
// input_ids and loss_mask bytes against the dataset's.
func readOutput(ctx context.Context, path string, deep bool, want *fileWant, buf []byte) (OutputInfo, error) {
	sf, err := openSample(path)
	if err != nil {
		return OutputInfo{}, err
	}
	defer func() { _ = sf.Close() }()
	return sf.check(ctx, deep, want, buf)
}

// errForeign is a file without extract's metadata: another tool's, brought in by import.
var errForeign = errors.New("no extract metadata: not extract's output format (another tool's file)")

// info reads extract's metadata of an opened file.
func (sf *sampleFile) info() (OutputInfo, error) {
	md := sf.md
	if md == nil {
		return OutputInfo{}, errForeign
	}
	if md["format"] != outputFormat {
		return OutputInfo{}, fmt.Errorf("format %q, want %q", md["format"], outputFormat)
	}
	info := OutputInfo{
		RID: md["rid"], DatasetFingerprint: md["dataset_fingerprint"], Bytes: sf.size,
		ConfigFingerprint: md["config_fingerprint"], Layers: md["layers"], Model: md["model"],
		Protocol: md["protocol"], HookVersion: md["hook_version"], SourceID: md["source_id"],
	}
	var err error
	if info.Sample, err = strconv.Atoi(md["sample"]); err != nil || info.Sample < 0 {
		return OutputInfo{}, fmt.Errorf("metadata sample %q is not a sample index", md["sample"])
	}
	if info.Tokens, err = strconv.Atoi(md["tokens"]); err != nil || info.Tokens < 1 {
		return OutputInfo{}, fmt.Errorf("metadata tokens %q is not a token count", md["tokens"])
	}
	c := md["crc32c"]
	sum, err := strconv.ParseUint(c, 16, 32)
	if err != nil || len(c) != 8 || strings.ToLower(c) != c {
		return OutputInfo{}, fmt.Errorf("metadata crc32c %q is not 8 lowercase hex digits", c)
	}
	info.CRC32C = uint32(sum)
	if sf.gz {
		if info.HiddenSize, err = strconv.Atoi(md["hidden_size"]); err != nil || info.HiddenSize < 1 {
			return OutputInfo{}, fmt.Errorf("metadata hidden_size %q is not a width", md["hidden_size"])
		}
		return info, nil
	}
	if !sf.hasMask {
		return OutputInfo{}, errors.New("no tensor " + tensorLossMask)
	}
	if sf.tokens() != int64(info.Tokens) {
		return OutputInfo{}, fmt.Errorf("tensor %s has %d rows, metadata says %d tokens", sf.t[0].name, sf.tokens(), info.Tokens)
	}
	info.HiddenSize = int(sf.hidden())
	return info, nil
}

// check reads the file's metadata and checks it against want; deep also recomputes the
// crc32c of the tensor bytes and, with the dataset's sample, compares the tokens.
func (sf *sampleFile) check(ctx context.Context, deep bool, want *fileWant, buf []byte) (OutputInfo, error) {
	info, err := sf.info()
	if err != nil {
		return OutputInfo{}, err
	}
	if want != nil {
		if want.hidden > 0 && info.HiddenSize != want.hidden {
			return OutputInfo{}, wrong("hidden size %d, the job's is %d", info.HiddenSize, want.hidden)
		}
		if want.layers != "" {
			got, err := parseLayers(info.Layers)
			if wl, _ := parseLayers(want.layers); err != nil || !slices.Equal(got, wl) {
				return OutputInfo{}, wrong("layers %q, the job captures %q", info.Layers, want.layers)
			}
		}
	}
	if !deep {
		return info, nil
	}
	T := int64(info.Tokens)
	compare := want != nil && want.haveSample
	if compare {
		if want.haveIDs && int64(len(want.ids)) != T {
			return OutputInfo{}, wrong("%d tokens, the dataset's sample has %d", T, len(want.ids))
		}
		if want.mask != nil && int64(len(want.mask)) != T {
			return OutputInfo{}, wrong("%d tokens, the dataset's loss_mask has %d", T, len(want.mask))
		}
	}
	o := scanOpts{}
	if compare {
		o.ids, o.haveIDs = want.ids, want.haveIDs
		// A dataset line without loss_mask means all ones, unless import kept the
		// mask of the file it adopted.
		o.mask, o.cmpMask = want.mask, want.mask != nil || sf.md[mdMaskSource] != maskFromFile
	}
	sum, roles, err := sf.scan(ctx, o, buf)
	if err != nil {
		return OutputInfo{}, err
	}
	if sf.gz {
		if roles != 4 || !sf.hasMask {
			return OutputInfo{}, errors.New("tensors missing from the stream")
		}
		if sf.tokens() != T || sf.hidden() != int64(info.HiddenSize) {
			return OutputInfo{}, fmt.Errorf("tensors hold %d tokens of width %d, metadata says %d of %d", sf.tokens(), sf.hidden(), T, info.HiddenSize)
		}
	}
	if sum != info.CRC32C {
		return OutputInfo{}, fmt.Errorf("crc32c mismatch: metadata %08x, data %08x", info.CRC32C, sum)
	}
	return info, nil
}

// scanOpts says what scan checks besides computing the crc32c.
type scanOpts struct {
	ids     []int64
	haveIDs bool // compare input_ids with ids
	mask    []int64
	cmpMask bool // compare loss_mask with mask (nil: all ones)
	finite  bool // refuse NaN and ±Inf in the hidden states
	// anyOrder takes the tensors in the file's order: another tool's gzip stream need
	// not be canonical, and its crc32c is defined over the order it has.
	anyOrder bool
	// zipCRC compares each tensor that is a whole zip record with the CRC-32 the zip
	// directory records for it: the checksum another tool's torch file carries.
	zipCRC bool
}

// scan reads every tensor once, computing the crc32c of their bytes in walk order
// (canonical for extract's files) and applying o's checks; it returns how many tensors
// it saw.
func (sf *sampleFile) scan(ctx context.Context, o scanOpts, buf []byte) (uint32, int, error) {
	sum, roles := uint32(0), 0
	err := sf.walk(ctx, func(role int, r io.Reader) error {
		if role != roles && !o.anyOrder {
			return fmt.Errorf("tensor %s out of order: its crc32c cannot be checked", sf.t[role].name)
		}
		roles++
		var cmp io.Writer = io.Discard
		switch {
		case role == 0 && o.haveIDs:
			cmp = &int64Cmp{name: tensorInputIDs, want: o.ids}
		case role == 1 && o.cmpMask:
			cmp = &int64Cmp{name: tensorLossMask, want: o.mask, ones: o.mask == nil}
		case role >= 2 && o.finite:
			cmp = &finiteBF16{name: sf.t[role].name}
		}
		t := sf.t[role]
		ieee, wantIEEE := uint32(0), o.zipCRC && t.hasZipCRC
		for {
			n, err := r.Read(buf)
			sum = crc32.Update(sum, castagnoli, buf[:n])
			if wantIEEE {
				ieee = crc32.Update(ieee, crc32.IEEETable, buf[:n])
			}
			if _, werr := cmp.Write(buf[:n]); werr != nil {
				return werr
			}
			if err == io.EOF {
				if wantIEEE && ieee != t.zipCRC {
					return wrong("tensor %s: CRC-32 %08x, the zip directory records %08x: the file is damaged", t.name, ieee, t.zipCRC)
				}
				return nil
			}
			if err != nil {
				return fmt.Errorf("read %s: %w", sf.t[role].name, err)
			}
		}
	})
	return sum, roles, err
}

// finiteBF16 refuses NaN and ±Inf (exponent all ones) in a bf16 stream.
type finiteBF16 struct {
	name string
	pos  int64
	odd  []byte
}

func (f *finiteBF16) Write(p []byte) (int, error) {
	n := len(p)
	if len(f.odd) == 1 && len(p) > 0 {
		if err := f.check(f.odd[0], p[0]); err != nil {
			return 0, err
		}
		p, f.odd = p[1:], nil
	}
	for len(p) >= 2 {
		if err := f.check(p[0], p[1]); err != nil {
			return 0, err
		}
		p = p[2:]
	}
	if len(p) == 1 {
		f.odd = []byte{p[0]}
	}
	return n, nil
}

func (f *finiteBF16) check(lo, hi byte) error {
	if hi&0x7f == 0x7f && lo&0x80 == 0x80 {
		return wrong("%s element %d is not finite (NaN or Inf)", f.name, f.pos)
	}
	f.pos++
	return nil
}

// int64Cmp compares a stream of little-endian int64s with want (ones: all ones, the
// default loss mask), naming the first position that differs.
type int64Cmp struct {
	name    string
	want    []int64
	ones    bool
	pos     int64
	partial [8]byte
	np      int
}

func (c *int64Cmp) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		k := copy(c.partial[c.np:], p)
		c.np += k
		p = p[k:]
		if c.np < 8 {
			break
		}
		c.np = 0
		got := int64(binary.LittleEndian.Uint64(c.partial[:]))
		w := int64(1)
		if !c.ones {
			if c.pos >= int64(len(c.want)) {
				return 0, wrong("%s longer than the dataset's %d", c.name, len(c.want))
			}
			w = c.want[c.pos]
		}
		if got != w {
			return 0, wrong("%s differ from the dataset at position %d: file has %d, dataset %d", c.name, c.pos, got, w)
		}
		c.pos++
	}
	return n, nil
}

// checkImported checks a file another tool wrote, which extract import linked in as it
// was: it has no extract metadata, so the index record is the reference (tokens, and
// deep, the crc32c import computed and the dataset's tokens).
func checkImported(ctx context.Context, path string, r Record, deep bool, want *fileWant, buf []byte) (string, error) {
	sf, err := openSample(path)
	if err != nil {
		return err.Error(), nil
	}
	defer func() { _ = sf.Close() }()
	if !sf.gz && sf.tokens() != int64(r.Tokens) {
		return fmt.Sprintf("%d tokens, index recorded %d", sf.tokens(), r.Tokens), nil
	}
	if !sf.gz && want != nil && want.hidden > 0 && sf.hidden() != int64(want.hidden) {
		return fmt.Sprintf("hidden size %d, the job's is %d", sf.hidden(), want.hidden), nil
	}
	if !deep {
		return "", nil
	}
	o := scanOpts{anyOrder: true}
	if want != nil && want.haveSample {
		o.ids, o.haveIDs = want.ids, want.haveIDs
		// A dataset line without loss_mask took the file's at import.
		o.mask, o.cmpMask = want.mask, want.mask != nil
	}
	sum, _, err := sf.scan(ctx, o, buf)
	if ctx.Err() != nil {
		return "", fmt.Errorf("verify sample %d: %w", r.Sample, ctx.Err())
	}
	switch {
	case err != nil:
		return err.Error(), nil
	case sum != r.CRC32C:
		return fmt.Sprintf("crc32c %08x, index recorded %08x at import", sum, r.CRC32C), nil
	}
	return "", nil
}

// maxSkippedRecord bounds a record inside gzip that no tensor uses: reading past it
// would only decompress a bomb.
const maxSkippedRecord = 1 << 20

func boundedSkip(name string, size int64) error {
	if size > maxSkippedRecord {
		return fmt.Errorf("record %s holds %d bytes no tensor uses (more than %d)", name, size, maxSkippedRecord)
	}
	return nil
}

// openRegular opens path for reading without trusting it: never through a symlink at
// its last component, never blocking on a FIFO swapped in, and only a regular file
// (fstat of what was opened, not a stat of the name). It returns the size fstat saw;
// every read of the file stays within it.
func openRegular(path string) (*os.File, int64, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ELOOP) {
		return nil, 0, fmt.Errorf("%s is a symlink: only regular files are read", path)
	}
	if err != nil {
		return nil, 0, &os.PathError{Op: "open", Path: path, Err: err}
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		_ = unix.Close(fd)
		return nil, 0, &os.PathError{Op: "fstat", Path: path, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		_ = unix.Close(fd)
		return nil, 0, fmt.Errorf("%s is not a regular file (mode %o)", path, st.Mode&unix.S_IFMT)
	}
	return os.NewFile(uintptr(fd), path), st.Size, nil
}
