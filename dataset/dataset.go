package dataset

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"syscall"
	"time"

	"github.com/extract-dev/extract/configs"
	"github.com/extract-dev/extract/internal/conversation"
	"github.com/extract-dev/extract/internal/errclass"
	"github.com/extract-dev/extract/internal/userfile"
)

// ErrBad marks a dataset the user must fix (exit 2).
var ErrBad = errors.New("bad dataset")

// ErrChanged is a dataset modified, replaced or removed while a job reads it:
// outputs made from the new bytes would carry the old fingerprint. It wraps
// ErrBad, so it is exit 2 too.
var ErrChanged = fmt.Errorf("%w: changed during the run", ErrBad)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Dataset is a validated JSONL dataset. It keeps each line's offset, not its content,
// so memory stays small however long the prompts are; a sample is re-read when sent.
type Dataset struct {
	Path        string
	Fingerprint string // sha256 of the file's bytes
	Size        int64
	lines       []lineRef
	f           *os.File // kept open for Sample; ReadAt is safe from many goroutines
	stat        fileID   // the file as indexed; Sample refuses to read any other

	indexedKey indexedKey // the file's identity over the full read, for the cache
	cached     bool       // lines and Fingerprint came from the cache (cache.go)
}

type lineRef struct {
	off    int64
	len    int32
	tokens int32  // exact for input_ids; an upper bound (bytes) for text
	crc    uint32 // crc32c of the line as indexed; fits the struct's padding, so free
	text   bool
}

// fileID is what Sample compares to notice a dataset changed under the job: an edit
// moves size or mtime, a replacement (rename over, delete and recreate) the inode.
type fileID struct {
	dev, ino uint64
	size     int64
	mtime    int64 // ns since the epoch: comparable with ==, unlike a time.Time
}

func fileIDOf(fi os.FileInfo) fileID {
	id := fileID{size: fi.Size(), mtime: fi.ModTime().UnixNano()}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		id.dev, id.ino = uint64(st.Dev), st.Ino
	}
	return id
}

// Sample is one dataset line, decoded.
type Sample struct {
	Index    int
	InputIDs []int64 // nil for a text sample
	LossMask []int64 // nil: all ones
	Text     string
	// SourceID is the line's "id" (a prepared conversation's own id), "" without one.
	SourceID string
}

type rawSample struct {
	InputIDs *[]int64        `json:"input_ids"`
	LossMask *[]int64        `json:"loss_mask"`
	Text     *string         `json:"text"`
	ID       json.RawMessage `json:"id"`
}

// Open reads and checks every line before any GPU time is spent. An error names
// the line (1-based, as editors show it) and the sample index (0-based). Lines are
// bounded by the default dataset_max_line; a job's commands use OpenJob.
func Open(path string) (*Dataset, error) {
	return openDataset(context.Background(), path, configs.Default().DatasetMaxLine)
}

// OpenJob is Open of cfg's dataset with its dataset_max_line, ending with
// errclass.ErrTemporary when ctx does (a SIGTERM while a large dataset is read).
func OpenJob(ctx context.Context, cfg *configs.Config) (*Dataset, error) {
	return openDataset(ctx, cfg.Dataset, cfg.DatasetMaxLine)
}

func openDataset(ctx context.Context, path string, maxLine configs.ByteSize) (*Dataset, error) {
	f, err := openDatasetFile(path)
	if err != nil {
		return nil, err
	}
	d := &Dataset{Path: path, f: f}
	if err := d.index(ctx, maxLine); err != nil {
		_ = f.Close()
		return nil, err
	}
	return d, nil
}

// openDatasetFile opens the dataset as userfile.OpenRegular does: a FIFO, a device
// such as /dev/zero, a directory or a socket is refused at once, never read or waited on.
func openDatasetFile(path string) (*os.File, error) {
	f, err := userfile.OpenRegular(path)
	if errors.Is(err, userfile.ErrNotRegular) {
		return nil, fmt.Errorf("%w: dataset %w: extract reads the dataset more than once (to check every line, to hash it, to send each sample), so point dataset at a JSONL file", ErrBad, err)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: open dataset: %w", ErrBad, err)
	}
	return f, nil
}

// statOpen is the open file's identity now.
func (d *Dataset) statOpen() (fileID, error) {
	fi, err := d.f.Stat()
	if err != nil {
		return fileID{}, err
	}
	return fileIDOf(fi), nil
}

// index reads every line, refusing one longer than maxLine (memory stays bounded
// whatever the file holds), and hashes the file meanwhile; it stops with errclass.ErrTemporary
// when ctx ends.
func (d *Dataset) index(ctx context.Context, maxLine configs.ByteSize) error {
	path, f := d.Path, d.f
	if maxLine <= 0 {
		maxLine = configs.Default().DatasetMaxLine // a config built in code, not loaded
	}
	began := time.Now()
	keyBefore, keyErr := cacheKeyOf(f)
	before, err := d.statOpen()
	if err != nil {
		return fmt.Errorf("%w: %v", ErrBad, err)
	}
	// The fingerprint is hashed on the other core while this one checks the lines: on a
	// resume of a 500 MB dataset the two together are most of the time to the first request.
	// It reads the open file, not the path: a file renamed over the path meanwhile must not
	// be the one hashed.
	hashCtx, stopHash := context.WithCancel(ctx)
	defer stopHash()
	fp := make(chan hashResult, 1)
	go func() { fp <- hashFile(hashCtx, f) }()
	stopped := func() error {
		stopHash()
		<-fp
		return fmt.Errorf("%w: stopped (%v) while reading dataset %s", errclass.ErrTemporary, context.Cause(ctx), path)
	}
	r := bufio.NewReaderSize(f, 1<<20)
	var off int64
	var long []byte // a line longer than the reader's buffer, assembled
	for {
		if ctx.Err() != nil {
			return stopped()
		}
		line, err := r.ReadSlice('\n')
		n := int64(len(long)) + int64(len(line))
		if err == nil {
			n-- // the newline
		}
		if n > int64(maxLine) {
			stopHash()
			<-fp
			return fmt.Errorf("%w: %s line %d (sample %d) is longer than dataset_max_line (%s): is this a JSONL dataset? raise dataset_max_line if a line is meant to be that long", ErrBad, path, len(d.lines)+1, len(d.lines), maxLine)
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			long = append(long, line...)
			continue
		}
		if long != nil {
			line = append(long, line...)
			long = nil
		}
		if len(line) > 0 {
			n := len(d.lines)
			trimmed := bytes.TrimRight(line, "\r\n")
			ref := lineRef{off: off, len: int32(len(trimmed)), crc: crc32.Checksum(trimmed, castagnoli)}
			if tokens, ok := scanIDsLine(trimmed); ok {
				ref.tokens = int32(tokens)
			} else {
				s, perr := decodeLine(trimmed, n)
				if perr != nil {
					<-fp
					return fmt.Errorf("%w: %s line %d (sample %d): %v", ErrBad, path, n+1, n, perr)
				}
				ref.text = s.InputIDs == nil
				if ref.text {
					ref.tokens = int32(len(s.Text))
				} else {
					ref.tokens = int32(len(s.InputIDs))
				}
			}
			d.lines = append(d.lines, ref)
			off += int64(len(line))
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			<-fp
			return fmt.Errorf("read dataset %s: %w", path, err)
		}
	}
	h := <-fp
	if ctx.Err() != nil {
		return stopped()
	}
	if h.err != nil {
		return fmt.Errorf("read dataset %s: %w", path, h.err)
	}
	if h.size != off {
		return fmt.Errorf("%w: %s changed while it was read (%d bytes, then %d)", ErrChanged, path, off, h.size)
	}
	// A same-length edit while the two passes read would leave line checksums and the
	// fingerprint describing different bytes; the mtime says whether one happened.
	after, err := d.statOpen()
	if err != nil {
		return fmt.Errorf("%w: %v", ErrBad, err)
	}
	if after != before {
		return fmt.Errorf("%w: %s changed while it was read (%s); open it again once nothing writes it", ErrChanged, path, describeChange(before, after))
	}
	d.stat = after
	if keyAfter, err := cacheKeyOf(f); keyErr == nil && err == nil && keyAfter == keyBefore {
		d.indexedKey = indexedKey{key: keyBefore, began: began, ok: true}
	}
	if len(d.lines) == 0 {
		return fmt.Errorf("%w: %s has no samples", ErrBad, path)
	}
	d.Size = off
	d.Fingerprint = h.sum
	return nil
}

type hashResult struct {
	sum  string
	size int64
	err  error
}

// hashFile is the dataset fingerprint: the sha256 of the file's bytes. It reads with
// ReadAt, so it shares f with the line pass, which reads through f's offset; it stops
// between chunks when ctx ends.
func hashFile(ctx context.Context, f *os.File) hashResult {
	h := sha256.New()
	buf := make([]byte, 1<<20)
	var n int64
	for {
		if err := ctx.Err(); err != nil {
			return hashResult{err: err}
		}
		k, err := f.ReadAt(buf, n)
		h.Write(buf[:k])
		n += int64(k)
		if errors.Is(err, io.EOF) {
			return hashResult{sum: hex.EncodeToString(h.Sum(nil)), size: n}
		}
		if err != nil {
			return hashResult{err: err}
		}
	}
}

// scanIDsLine recognises the common line, {"input_ids":[...]} with an optional
// "loss_mask":[...] in either order, and returns its token count without decoding it.
// It accepts a line only if decodeLine accepts it with the same result: plain decimal
// ids, a mask of 0s and 1s as long as the ids, no other keys, no escapes, no nulls.
// Anything else returns false and goes through decodeLine, so what is refused, and the
// message that says why, do not change.
func scanIDsLine(b []byte) (int, bool) {
	i := skipJSONSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return 0, false
	}
	ids, mask := -1, -1
keys:
	for {
		i = skipJSONSpace(b, i+1)
		var isMask bool
		switch {
		case bytes.HasPrefix(b[i:], []byte(`"input_ids"`)) && ids < 0:
		case bytes.HasPrefix(b[i:], []byte(`"loss_mask"`)) && mask < 0:
			isMask = true
		case bytes.HasPrefix(b[i:], []byte(`"id"`)) || bytes.HasPrefix(b[i:], []byte(`"line"`)):
			// A prepared conversation's source id and line (docs/dataset.md), which
			// decodeLine reads as the sample's source and otherwise ignores.
			next, ok := skipSourceField(b, i)
			if !ok {
				return 0, false
			}
			i = skipJSONSpace(b, next)
			if i < len(b) && b[i] == ',' {
				continue
			}
			if i >= len(b) || b[i] != '}' {
				return 0, false
			}
			break keys
		default:
			return 0, false
		}
		i = skipJSONSpace(b, i+len(`"input_ids"`))
		if i >= len(b) || b[i] != ':' {
			return 0, false
		}
		n, next, ok := scanUintList(b, skipJSONSpace(b, i+1), isMask)
		if !ok {
			return 0, false
		}
		if isMask {
			mask = n
		} else {
			ids = n
		}
		i = skipJSONSpace(b, next)
		if i < len(b) && b[i] == ',' {
			continue
		}
		if i >= len(b) || b[i] != '}' {
			return 0, false
		}
		break
	}
	if skipJSONSpace(b, i+1) != len(b) || ids < 1 || (mask >= 0 && mask != ids) {
		return 0, false
	}
	return ids, true
}

// scanUintList reads a JSON list of non-negative integers that fit an int64 (of 0s and
// 1s when bits) at b[i:], returning its length and the index after the closing bracket.
func scanUintList(b []byte, i int, bits bool) (n, next int, ok bool) {
	if i >= len(b) || b[i] != '[' {
		return 0, 0, false
	}
	i = skipJSONSpace(b, i+1)
	if i < len(b) && b[i] == ']' {
		return 0, i + 1, true
	}
	for {
		start := i
		for i < len(b) && b[i]-'0' < 10 {
			i++
		}
		digits := i - start
		if digits == 0 || digits > 18 || (digits > 1 && b[start] == '0') || (bits && (digits != 1 || b[start] > '1')) {
			return 0, 0, false
		}
		n++
		if i < len(b) && b[i] == ',' {
			i++
			if i < len(b) && b[i]-'0' < 10 {
				continue // the common case: "1,2,3"
			}
			i = skipJSONSpace(b, i)
			continue
		}
		i = skipJSONSpace(b, i)
		if i < len(b) && b[i] == ',' {
			i = skipJSONSpace(b, i+1)
			continue
		}
		if i < len(b) && b[i] == ']' {
			return n, i + 1, true
		}
		return 0, 0, false
	}
}

// skipSourceField reads `"id": "<string without escapes>"` or `"line": <digits>` at b[i:]
// and returns the index after its value.
func skipSourceField(b []byte, i int) (int, bool) {
	key := `"id"`
	if bytes.HasPrefix(b[i:], []byte(`"line"`)) {
		key = `"line"`
	}
	i = skipJSONSpace(b, i+len(key))
	if i >= len(b) || b[i] != ':' {
		return 0, false
	}
	i = skipJSONSpace(b, i+1)
	if key == `"line"` {
		start := i
		for i < len(b) && b[i]-'0' < 10 {
			i++
		}
		return i, i > start && i-start <= 18
	}
	if i >= len(b) || b[i] != '"' {
		return 0, false
	}
	for j := i + 1; j < len(b); j++ {
		switch {
		case b[j] == '"':
			return j + 1, true
		case b[j] == '\\' || b[j] < 0x20:
			return 0, false // escapes and control bytes: decodeLine judges those
		}
	}
	return 0, false
}

func skipJSONSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

func decodeLine(line []byte, index int) (Sample, error) {
	var raw rawSample
	// Other fields (ids, conversations, sources) are common in datasets and ignored.
	dec := json.NewDecoder(bytes.NewReader(line))
	if len(bytes.TrimSpace(line)) == 0 {
		return Sample{}, errors.New("empty line (every line must be one JSON sample)")
	}
	if err := dec.Decode(&raw); err != nil {
		return Sample{}, fmt.Errorf("invalid JSON: %v", err)
	}
	if dec.More() {
		return Sample{}, errors.New("more than one JSON value on the line")
	}
	// encoding/json leaves a null list element as 0, so [1,null,3] would be sent as
	// [1,0,3]. A second, slower decode finds it, only on lines that say null at all.
	if bytes.Contains(line, []byte("null")) {
		if err := findNull(line); err != nil {
			return Sample{}, err
		}
	}
	s := Sample{Index: index, SourceID: conversation.SourceID(raw.ID)}
	switch {
	case raw.InputIDs != nil && raw.Text != nil:
		return s, errors.New(`has both "input_ids" and "text"; give one`)
	case raw.InputIDs != nil:
		if len(*raw.InputIDs) == 0 {
			return s, errors.New(`"input_ids" is empty`)
		}
		for i, id := range *raw.InputIDs {
			if id < 0 {
				return s, fmt.Errorf(`"input_ids"[%d] = %d is negative`, i, id)
			}
		}
		s.InputIDs = *raw.InputIDs
	case raw.Text != nil:
		if *raw.Text == "" {
			return s, errors.New(`"text" is empty`)
		}
		if raw.LossMask != nil {
			return s, errors.New(`"loss_mask" needs "input_ids" (with "text" the server tokenizes, so the mask is all 1)`)
		}
		s.Text = *raw.Text
	default:
		return s, errors.New(`missing "input_ids" (list of int) or "text"`)
	}
	if raw.LossMask != nil {
		if len(*raw.LossMask) != len(s.InputIDs) {
			return s, fmt.Errorf(`"loss_mask" has %d values, "input_ids" has %d`, len(*raw.LossMask), len(s.InputIDs))
		}
		for i, m := range *raw.LossMask {
			if m != 0 && m != 1 {
				return s, fmt.Errorf(`"loss_mask"[%d] = %d, want 0 or 1`, i, m)
			}
		}
		s.LossMask = *raw.LossMask
	}
	return s, nil
}

// findNull names the first null element of "input_ids" or "loss_mask".
func findNull(line []byte) error {
	var raw struct {
		InputIDs []*int64 `json:"input_ids"`
		LossMask []*int64 `json:"loss_mask"`
	}
	if err := json.Unmarshal(line, &raw); err != nil {
		return fmt.Errorf("invalid JSON: %v", err)
	}
	for _, l := range []struct {
		key string
		v   []*int64
	}{{"input_ids", raw.InputIDs}, {"loss_mask", raw.LossMask}} {
		for i, p := range l.v {
			if p == nil {
				return fmt.Errorf(`"%s"[%d] is null, want an integer`, l.key, i)
			}
		}
	}
	return nil
}

// Len is the number of samples.
func (d *Dataset) Len() int { return len(d.lines) }

// Tokens is the sample's token count (an upper bound for a text sample).
func (d *Dataset) Tokens(i int) int { return int(d.lines[i].tokens) }

// IsText says whether sample i is text, which the server tokenizes, rather than input_ids.
func (d *Dataset) IsText(i int) bool { return d.lines[i].text }

// TotalTokens sums Tokens over the samples where include is true (all if nil).
func (d *Dataset) TotalTokens(include func(int) bool) int64 {
	var n int64
	for i, l := range d.lines {
		if include == nil || include(i) {
			n += int64(l.tokens)
		}
	}
	return n
}

// Sample reads sample i back from the file. The file must not change under a running
// job: an edit, a replacement or a removal since Open, or line bytes that differ
// from those indexed, is an error wrapping ErrChanged, never a sample.
func (d *Dataset) Sample(i int) (Sample, error) {
	l := d.lines[i]
	if err := d.checkUnchanged(); err != nil {
		return Sample{}, d.changed(i, err.Error())
	}
	b := make([]byte, l.len)
	if _, err := d.f.ReadAt(b, l.off); err != nil {
		if errors.Is(err, io.EOF) {
			return Sample{}, d.changed(i, fmt.Sprintf("line %d is cut short", i+1))
		}
		return Sample{}, fmt.Errorf("read dataset %s sample %d: %w", d.Path, i, err)
	}
	// The stat above cannot see an edit that kept size and mtime (or came after it);
	// the checksum covers the very bytes decoded.
	if crc32.Checksum(b, castagnoli) != l.crc {
		return Sample{}, d.changed(i, fmt.Sprintf("line %d bytes differ from when the run opened it", i+1))
	}
	s, err := decodeLine(b, i)
	if err != nil {
		return Sample{}, d.changed(i, fmt.Sprintf("line %d: %v", i+1, err))
	}
	return s, nil
}

// checkUnchanged compares the open file and the file now at Path with the one indexed.
func (d *Dataset) checkUnchanged() error {
	now, err := d.statOpen()
	if err != nil {
		return fmt.Errorf("stat: %v", err)
	}
	if now != d.stat {
		return fmt.Errorf("modified during the run: %s", describeChange(d.stat, now))
	}
	fi, err := os.Stat(d.Path)
	if errors.Is(err, os.ErrNotExist) {
		return errors.New("removed during the run")
	}
	if err != nil {
		return fmt.Errorf("stat: %v", err)
	}
	if at := fileIDOf(fi); at.dev != d.stat.dev || at.ino != d.stat.ino {
		return fmt.Errorf("replaced during the run (inode %d, now %d)", d.stat.ino, at.ino)
	}
	return nil
}

func (d *Dataset) changed(i int, what string) error {
	return fmt.Errorf("%w: dataset %s, read for sample %d (line %d): %s; restore the file as it was when the run started, or start over with --fresh", ErrChanged, d.Path, i, i+1, what)
}

func describeChange(was, now fileID) string {
	switch {
	case was.dev != now.dev || was.ino != now.ino:
		return fmt.Sprintf("inode %d, now %d", was.ino, now.ino)
	case was.size != now.size:
		return fmt.Sprintf("size %d bytes, now %d", was.size, now.size)
	default:
		return fmt.Sprintf("mtime %s, now %s", time.Unix(0, was.mtime).UTC().Format(time.RFC3339Nano), time.Unix(0, now.mtime).UTC().Format(time.RFC3339Nano))
	}
}

// Close closes the dataset file.
func (d *Dataset) Close() error { return d.f.Close() }
