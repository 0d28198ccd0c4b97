package checkpoint

import (
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/extract-dev/extract/internal/atomicfile"
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

// Import checks src against want and brings it into l: the file as it is (a hard link,
// or with copy or across filesystems a durable copy) when it already is l's format,
// else rewritten by the writers; either way through a temp name, fsynced, renamed,
// directory fsynced. The caller commits it to the index after. scratch is a folder on
// the output disk for decompressing a .gz that must be converted.
func Import(ctx context.Context, src ImportFile, l Layout, want ImportWant, copyOnly bool, scratch string) (ImportResult, error) {
	reject := func(format string, args ...any) (ImportResult, error) {
		return ImportResult{}, &RejectError{Path: src.Path, Sample: src.Sample, Reason: fmt.Sprintf(format, args...)}
	}
	sf, err := openSample(src.Path)
	if err != nil {
		return reject("%v", err)
	}
	defer sf.Close()
	// torch.save into a gzip stream writes its records sized after their data, which
	// only the central directory at the end resolves: another tool's .ckpt.gz is
	// decompressed first and then handled as the .ckpt it holds.
	unzipped := false
	if sf.gz && sf.md == nil {
		plain, err := gunzipTo(ctx, src.Path, scratch)
		if ctx.Err() != nil {
			return ImportResult{}, fmt.Errorf("import sample %d: %w", src.Sample, ctx.Err())
		}
		if err != nil {
			return reject("%v", err)
		}
		defer os.Remove(plain)
		if sf, err = openSample(plain); err != nil {
			return reject("%v", err)
		}
		defer sf.Close()
		unzipped = true
	}
	buf := make([]byte, 1<<20)
	ids := want.InputIDs
	if sf.md == nil && want.RequireExtract {
		return reject("not extract's own file (no extract metadata)")
	}
	if md := sf.md; md != nil {
		if md["sample"] != strconv.Itoa(src.Sample) {
			return reject("metadata names sample %s", md["sample"])
		}
		got, err := parseLayers(md["layers"])
		if wl, _ := parseLayers(want.Layers); err != nil || !slices.Equal(got, wl) {
			return reject("layers %q, the job captures %q", md["layers"], want.Layers)
		}
		if want.Model != "" && md["model"] != want.Model {
			return reject("model %q, the job runs %q", md["model"], want.Model)
		}
	}
	shape := func() (ImportResult, error, bool) {
		switch T := sf.tokens(); {
		case ids != nil && T != int64(len(ids)):
			r, e := reject("%d tokens, the dataset's line has %d", T, len(ids))
			return r, e, false
		case want.LossMask != nil && int64(len(want.LossMask)) != T:
			r, e := reject("%d tokens, the dataset's loss_mask has %d", T, len(want.LossMask))
			return r, e, false
		case sf.hidden() != int64(want.HiddenSize):
			r, e := reject("hidden size %d, the job's is %d", sf.hidden(), want.HiddenSize)
			return r, e, false
		}
		return ImportResult{}, nil, true
	}
	if !sf.gz {
		if r, e, ok := shape(); !ok {
			return r, e
		}
	}
	o := scanOpts{ids: ids, haveIDs: ids != nil, mask: want.LossMask, cmpMask: want.LossMask != nil && sf.hasMask, finite: true, anyOrder: true}
	sum, _, err := sf.scan(ctx, o, buf)
	if ctx.Err() != nil {
		return ImportResult{}, fmt.Errorf("import sample %d: %w", src.Sample, ctx.Err())
	}
	if err != nil {
		return reject("%v", err)
	}
	if sf.gz {
		if r, e, ok := shape(); !ok {
			return r, e
		}
	}
	final := l.Path(src.Sample)
	res := ImportResult{Path: final, Tokens: int(sf.tokens())}
	if sf.md != nil {
		res.RID = sf.md["rid"]
	}
	if sf.isLayout(l) && (sf.md == nil || sf.md["dataset_fingerprint"] == want.DatasetFingerprint && sf.md["config_fingerprint"] == want.ConfigFingerprint) {
		res.How, res.CRC32C = "link", sum
		if sf.md != nil {
			// extract's own file: verify reads its metadata, whose crc32c is canonical.
			info, err := sf.info()
			if err != nil {
				return reject("%v", err)
			}
			res.CRC32C = info.CRC32C
		}
		from := src.Path
		if unzipped {
			from, res.How = sf.path, "convert" // the decompressed copy, linked from scratch
		}
		if res.Bytes, err = placeAsIs(from, final, copyOnly, &res.How); err != nil {
			return ImportResult{}, fmt.Errorf("import sample %d: %w", src.Sample, err)
		}
		return res, nil
	}
	res.How = "convert"
	conv := sf
	if sf.gz {
		plain, err := gunzipTo(ctx, src.Path, scratch)
		if err != nil {
			return ImportResult{}, fmt.Errorf("import sample %d: %w", src.Sample, err)
		}
		defer os.Remove(plain)
		if conv, err = openSample(plain); err != nil {
			return reject("%v", err)
		}
		defer conv.Close()
	}
	s := conv.source(want.LossMask)
	s.md = map[string]string{
		"format": outputFormat, "sample": strconv.Itoa(src.Sample), "rid": res.RID,
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
	if res.Bytes, res.CRC32C, err = writeSample(ctx, l, final, s, buf); err != nil {
		return ImportResult{}, fmt.Errorf("import sample %d: %w", src.Sample, err)
	}
	return res, nil
}

// isLayout says whether the file already is what l writes: its extension and key names,
// loss_mask included, so that the trainer reads it as is.
func (sf *sampleFile) isLayout(l Layout) bool {
	if !strings.HasSuffix(sf.path, l.Ext()) || !sf.hasMask {
		return false
	}
	names := l.tensorNames()
	for r, t := range sf.t {
		if t.name != names[r] {
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

// placeAsIs puts src under final unchanged: a hard link unless copyOnly or the link
// fails (another filesystem), else a copy; fsynced either way, since the other tool may
// never have synced it.
func placeAsIs(src, final string, copyOnly bool, how *string) (int64, error) {
	tmp := tempPath(final)
	if err := atomicfile.MkdirAll(filepath.Dir(final), 0o755); err != nil {
		return 0, err
	}
	if err := os.Remove(tmp); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return 0, err
	}
	linked := !copyOnly && os.Link(src, tmp) == nil
	if !linked {
		*how = "copy"
		if err := copyFile(src, tmp); err != nil {
			os.Remove(tmp)
			return 0, err
		}
	}
	f, err := os.Open(tmp)
	if err != nil {
		return 0, err
	}
	st, err := f.Stat()
	if err == nil {
		err = atomicfile.Sync(f)
	}
	f.Close()
	if err == nil {
		err = os.Rename(tmp, final)
	}
	if err != nil {
		os.Remove(tmp)
		return 0, fmt.Errorf("place %s: %w", final, err)
	}
	return st.Size(), atomicfile.SyncDir(filepath.Dir(final))
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return fmt.Errorf("copy %s: %w", src, err)
	}
	return out.Close()
}

// gunzipTo decompresses src into a file in scratch and returns its path; the caller
// removes it. Its name keeps the inner extension, so openSample reads it as a torch zip.
func gunzipTo(ctx context.Context, src, scratch string) (string, error) {
	if err := os.MkdirAll(scratch, 0o755); err != nil {
		return "", err
	}
	in, err := os.Open(src)
	if err != nil {
		return "", err
	}
	defer in.Close()
	zr, err := gzip.NewReader(in)
	if err != nil {
		return "", fmt.Errorf("gunzip %s: %w", src, err)
	}
	dst := filepath.Join(scratch, strings.TrimSuffix(filepath.Base(src), ".gz"))
	out, err := os.Create(dst)
	if err != nil {
		return "", err
	}
	_, err = io.Copy(out, &ctxReader{ctx, zr})
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(dst)
		return "", fmt.Errorf("gunzip %s: %w", src, err)
	}
	return dst, nil
}
