package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// mdMaskSource in a file's metadata says where its loss_mask came from when not from
// the dataset: maskFromFile is the adopted file's own, kept because the line has none.
const (
	mdMaskSource = "loss_mask_source"
	maskFromFile = "imported_file"
)

// ImportFile is a sample file found under an import source.
type ImportFile struct {
	Path   string
	Sample int
	// Kind is what the name says: specforge (.ckpt, .ckpt.gz), modelopt (.pt) or
	// safetensors; extract's own files are told apart by their metadata.
	Kind Format
}

// importNames are the file names import recognises, longest suffix first:
// data_<i><ext> (SpecForge's and extract's grouped layouts) or <i><ext> (flat dirs).
var importNames = []struct {
	ext  string
	kind Format
}{{".ckpt.gz", FormatSpecForge}, {".ckpt", FormatSpecForge}, {".pt", FormatModelOpt}, {".safetensors", FormatSafetensors}}

// FindImportFiles lists the sample files under dir, sorted by sample then path; kinds,
// when not empty, keeps only those kinds. Hidden files (temp files) are skipped.
func FindImportFiles(dir string, kinds []Format) ([]ImportFile, error) {
	var out []ImportFile
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != dir && strings.HasPrefix(d.Name(), ".") {
				return filepath.SkipDir
			}
			return nil
		}
		name := d.Name()
		if !d.Type().IsRegular() || strings.HasPrefix(name, ".") {
			return nil
		}
		for _, n := range importNames {
			stem, ok := strings.CutSuffix(name, n.ext)
			if !ok {
				continue
			}
			stem = strings.TrimPrefix(stem, dataPrefix)
			s, err := strconv.Atoi(stem)
			if err == nil && s >= 0 && strconv.Itoa(s) == stem && (len(kinds) == 0 || slices.Contains(kinds, n.kind)) {
				out = append(out, ImportFile{Path: path, Sample: s, Kind: n.kind})
			}
			break
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", dir, err)
	}
	slices.SortFunc(out, func(a, b ImportFile) int {
		if a.Sample != b.Sample {
			return a.Sample - b.Sample
		}
		return strings.Compare(a.Path, b.Path)
	})
	return out, nil
}

// ImportWant is what the job says sample's file must hold.
type ImportWant struct {
	Sample int
	// InputIDs nil is a text sample: the file's ids are taken as they are.
	InputIDs []int64
	// LossMask nil means the dataset line has none: the file's mask is recorded.
	LossMask           []int64
	HiddenSize         int
	Layers, Model      string
	DatasetFingerprint string
	ConfigFingerprint  string
	// RequireExtract refuses files without extract's metadata (import --format extract).
	RequireExtract bool
	// ScratchKeep is the room a .gz source's decompression leaves free on the scratch
	// disk (the state disk): the disk's reserve.
	ScratchKeep int64
}

// RejectError is a file that does not match the job; it is left where it is.
type RejectError struct {
	Path   string
	Sample int
	Reason string
}

func (e *RejectError) Error() string {
	return fmt.Sprintf("sample %d: %s: %s", e.Sample, e.Path, e.Reason)
}

// ImportResult is a file import brought into the layout.
type ImportResult struct {
	Path   string
	Bytes  int64
	CRC32C uint32
	Tokens int
	RID    string
	// How is link, copy (the file as it is) or convert (rewritten into the job's format).
	How string
}

// How a good file comes into the layout: the only decision Import makes, as a value.
const (
	howLink    = "link"    // the file's own inode, hard-linked
	howCopy    = "copy"    // its bytes, copied from the descriptor that was checked
	howConvert = "convert" // rewritten by extract's writers from the checked tensors
)

// placement decides how a checked file enters layout l: as is (link, or copy when asked
// or when it came out of gzip into scratch) only when it is exactly what l writes (name,
// keys, shapes, no other tensor or record) and, if extract's own, of this job; else
// rewritten.
func placement(sf *sampleFile, l Layout, want ImportWant, copyOnly bool) string {
	asIs := sf.isLayout(l) && sf.inexact == "" &&
		(sf.md == nil || sf.md["dataset_fingerprint"] == want.DatasetFingerprint && sf.md["config_fingerprint"] == want.ConfigFingerprint)
	switch {
	case !asIs:
		return howConvert
	case copyOnly:
		return howCopy
	}
	return howLink
}

// Import checks src against want and brings it into l: the file as it is (a hard link
// of the very inode checked, or a copy of its bytes checked again as copied) when it
// already is exactly l's format, else rewritten by the writers and the result checked;
// either way through a temp name, fsynced, renamed, directory fsynced. The caller
// commits it to the index after. scratch is a folder on the state disk for
// decompressing another tool's .gz.
//
// The file is opened once (no symlink, no FIFO, a regular file) and every check and the
// placement read that one descriptor: a file swapped under the name meanwhile is never
// the one placed. Extract's own files must match the crc32c their record holds, another
// tool's torch files the CRC-32 of their zip records.
func Import(ctx context.Context, src ImportFile, l Layout, want ImportWant, copyOnly bool, scratch string) (ImportResult, error) {
	reject := func(format string, args ...any) (ImportResult, error) {
		return ImportResult{}, &RejectError{Path: src.Path, Sample: src.Sample, Reason: fmt.Sprintf(format, args...)}
	}
	stopped := func() (ImportResult, error) {
		return ImportResult{}, fmt.Errorf("import sample %d: %w", src.Sample, ctx.Err())
	}
	sf, err := openSample(src.Path)
	if err != nil {
		return reject("%v", err)
	}
	defer func() { sf.Close() }() // the source, or what it decompressed into
	// opened is the file as it was before any read: a link is made only if it is the
	// same after every check.
	opened, err := fstat(sf.f)
	if err != nil {
		return ImportResult{}, err
	}
	var plains []string
	defer func() {
		for _, p := range plains {
			os.Remove(p)
		}
	}()
	if sf.md == nil && want.RequireExtract {
		return reject("not extract's own file (no extract metadata)")
	}
	if reason := checkOwnMetadata(sf, src.Sample, want); reason != "" {
		return reject("%s", reason)
	}
	// torch.save into a gzip stream sizes its records only in the central directory at
	// the end: another tool's .ckpt.gz is decompressed, bounded, from the descriptor
	// opened above, and handled as the .ckpt it holds.
	unzipped := false
	unzip := func() (ImportResult, error, bool) {
		plain, err := gunzipBounded(ctx, sf, want, scratch)
		if ctx.Err() != nil {
			r, e := stopped()
			return r, e, false
		}
		if rj, bad := errors.AsType[*gunzipRefusal](err); bad {
			r, e := reject("%s", rj.reason)
			return r, e, false
		}
		if err != nil {
			return ImportResult{}, fmt.Errorf("import sample %d: %w", src.Sample, err), false
		}
		plains = append(plains, plain)
		inner, err := openSample(plain)
		if err != nil {
			r, e := reject("%v", err)
			return r, e, false
		}
		if opened, err = fstat(inner.f); err != nil {
			inner.Close()
			return ImportResult{}, err, false
		}
		sf.Close()
		sf, unzipped = inner, true
		return ImportResult{}, nil, true
	}
	if sf.gz && sf.md == nil {
		if r, e, ok := unzip(); !ok {
			return r, e
		}
	}
	ownCRC, hasOwn := uint32(0), sf.md != nil
	if hasOwn {
		info, err := sf.info()
		if err != nil {
			return reject("%v", err)
		}
		ownCRC = info.CRC32C
	}
	buf := make([]byte, 1<<20)
	// check reads every tensor of f once; a second call for the same file (extract's
	// own .ckpt.gz, whose tensors only a read reveals) returns the first answer.
	var last struct {
		f      *sampleFile
		sum    uint32
		reason string
	}
	check := func(f *sampleFile) (uint32, string, error) {
		if f == last.f {
			return last.sum, last.reason, nil
		}
		sum, _, err := f.scan(ctx, importScan(f, want), buf)
		if ctx.Err() != nil {
			return 0, "", ctx.Err()
		}
		reason := ""
		switch {
		case err != nil:
			reason = err.Error()
		case f.gz && shapeMismatch(f, want) != "":
			reason = shapeMismatch(f, want)
		case hasOwn && sum != ownCRC:
			reason = fmt.Sprintf("crc32c mismatch: its record says %08x, its tensors hash to %08x: the file is damaged", ownCRC, sum)
		}
		last.f, last.sum, last.reason = f, sum, reason
		return sum, reason, nil
	}
	if sf.gz {
		// extract's own .ckpt.gz: its tensors are known once read.
		if _, reason, err := check(sf); err != nil {
			return stopped()
		} else if reason != "" {
			return reject("%s", reason)
		}
	} else if reason := shapeMismatch(sf, want); reason != "" {
		return reject("%s", reason)
	}
	final := l.Path(src.Sample)
	res := ImportResult{Path: final, Tokens: int(sf.tokens()), How: placement(sf, l, want, copyOnly)}
	if sf.md != nil {
		res.RID = sf.md["rid"]
	}
	if res.How == howConvert && sf.gz {
		if r, e, ok := unzip(); !ok {
			return r, e
		}
	}
	var placed placedFile
	var err2 error
	switch res.How {
	case howLink, howCopy:
		placed, err2 = placeAsIs(ctx, sf, opened, final, res.How == howCopy, check)
	default:
		placed, err2 = placeConverted(ctx, sf, l, final, src, want, res.RID, buf, check)
	}
	if ctx.Err() != nil {
		return stopped()
	}
	if placed.reject != "" {
		return reject("%s", placed.reject)
	}
	if err2 != nil {
		return ImportResult{}, fmt.Errorf("import sample %d: %w", src.Sample, err2)
	}
	res.Bytes, res.CRC32C = placed.size, placed.sum
	if hasOwn {
		res.CRC32C = ownCRC // verify reads the file's record, whose crc32c is canonical
	}
	if placed.copied && res.How == howLink {
		res.How = howCopy // the link failed (another filesystem): a copy, checked as copied
	}
	if unzipped {
		res.How = howConvert // out of gzip: not the source's bytes
	}
	return res, nil
}

// checkOwnMetadata compares extract's own file's record with the job; "" when it has
// none or it matches.
func checkOwnMetadata(sf *sampleFile, sample int, want ImportWant) string {
	md := sf.md
	if md == nil {
		return ""
	}
	if md["sample"] != strconv.Itoa(sample) {
		return fmt.Sprintf("metadata names sample %s", md["sample"])
	}
	got, err := parseLayers(md["layers"])
	if wl, _ := parseLayers(want.Layers); err != nil || !slices.Equal(got, wl) {
		return fmt.Sprintf("layers %q, the job captures %q", md["layers"], want.Layers)
	}
	if want.Model != "" && md["model"] != want.Model {
		return fmt.Sprintf("model %q, the job runs %q", md["model"], want.Model)
	}
	return ""
}

// shapeMismatch compares the file's T and H with the dataset line and the job.
func shapeMismatch(sf *sampleFile, want ImportWant) string {
	switch T := sf.tokens(); {
	case want.InputIDs != nil && T != int64(len(want.InputIDs)):
		return fmt.Sprintf("%d tokens, the dataset's line has %d", T, len(want.InputIDs))
	case want.LossMask != nil && int64(len(want.LossMask)) != T:
		return fmt.Sprintf("%d tokens, the dataset's loss_mask has %d", T, len(want.LossMask))
	case sf.hidden() != int64(want.HiddenSize):
		return fmt.Sprintf("hidden size %d, the job's is %d", sf.hidden(), want.HiddenSize)
	}
	return ""
}

// importScan is what import checks in a file's tensors: ids and mask against the
// dataset, every hidden value finite, and the zip records' CRC-32s.
func importScan(sf *sampleFile, want ImportWant) scanOpts {
	return scanOpts{ids: want.InputIDs, haveIDs: want.InputIDs != nil, mask: want.LossMask,
		cmpMask: want.LossMask != nil && sf.hasMask, finite: true, anyOrder: true, zipCRC: true}
}

// isLayout says whether the file already is what l writes: its extension, key names
// (loss_mask included) and shapes (the batch dim where l has one), so that the trainer
// reads it as is.
func (sf *sampleFile) isLayout(l Layout) bool {
	if !strings.HasSuffix(sf.path, l.Ext()) || !sf.hasMask {
		return false
	}
	names := l.tensorNames()
	for r, t := range sf.t {
		rank := 1
		if r >= 2 {
			rank = 2
			if l.batchDim() {
				rank = 3
			}
		}
		if t.name != names[r] || (!sf.gz && len(t.shape) != rank) {
			return false
		}
	}
	return true
}

// source is the opened (random-access) file as the writers stream it. The dataset's
// mask, when it has one, replaces the file's (they were checked equal); without one the
// file's is kept.
func (sf *sampleFile) source(datasetMask []int64) *sample {
	seg := func(r int) segment { return segment{sf.f, sf.t[r].off, sf.t[r].n} }
	s := &sample{T: sf.tokens(), H: sf.hidden(), ids: seg(0), hidden: seg(2), aux: seg(3), maskVals: datasetMask,
		readErr: func(off int64, err error) error { return fmt.Errorf("read %s at %d: %w", sf.path, off, err) }}
	if datasetMask == nil && sf.hasMask {
		m := seg(1)
		s.mask = &m
	}
	return s
}
