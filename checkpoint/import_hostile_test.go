package checkpoint

import (
	"archive/zip"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"hash/crc32"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/extract-dev/extract/internal/testsupport"
	"github.com/extract-dev/extract/internal/torchzip/torchforge"
)

// forgedSample writes a torch zip of pkl over torchforge's storages for a 3-token,
// width-4 sample (ids 7, 8, 9), and a storage 4 of NaN, at
// dir/rows_0-2000/data_<s>.ckpt[.gz].
func forgedSample(t *testing.T, dir string, s int, pkl []byte, gz bool) ImportFile {
	return forgedFile(t, dir, s, pkl, gz, true, 4)
}

func forgedFile(t *testing.T, dir string, s int, pkl []byte, gz, nanStorage bool, H int64) ImportFile {
	t.Helper()
	path := filepath.Join(dir, "rows_0-2000", "data_"+itoa(int64(s))+".ckpt")
	os.MkdirAll(filepath.Dir(path), 0o755)
	if err := torchforge.WriteArchive(path, pkl, torchforge.Storages(3, H, nanStorage)); err != nil {
		t.Fatal(err)
	}
	if gz {
		b, _ := os.ReadFile(path)
		var z bytes.Buffer
		w := gzip.NewWriter(&z)
		w.Write(b)
		w.Close()
		os.Remove(path)
		path += ".gz"
		os.WriteFile(path, z.Bytes(), 0o644)
	}
	return ImportFile{Path: path, Sample: s, Kind: FormatSpecForge}
}

func forgedWant(s int) ImportWant {
	return ImportWant{Sample: s, InputIDs: []int64{7, 8, 9}, LossMask: []int64{1, 1, 1}, HiddenSize: 4,
		Layers: "2,30,58", DatasetFingerprint: "fp-1", ConfigFingerprint: "cfg-1"}
}

func TestImportLinksAForgedButPlainPickleAndRefusesEveryHostileOneLeavingNoOutput(t *testing.T) {
	from := t.TempDir()
	l := Layout{Dir: t.TempDir(), Format: FormatSpecForge}
	// The control: the forger's plain dict is exactly torch.save's shape and is linked.
	plain := torchforge.Dict(torchforge.Sample(3, 4), nil, nil)
	good := forgedFile(t, from, 0, plain, false, false, 4)
	if res, err := Import(context.Background(), good, l, forgedWant(0), false, t.TempDir()); err != nil || res.How != howLink {
		t.Fatalf("the plain forged dict: %+v, %v; want it linked", res, err)
	}
	// A record no tensor uses is not torch.save's shape: rewritten, not linked.
	extra := forgedFile(t, from, 9, plain, false, true, 4)
	if res, err := Import(context.Background(), extra, l, forgedWant(9), false, t.TempDir()); err != nil || res.How != howConvert {
		t.Errorf("the dict with an unused record: %+v, %v; want it rewritten", res, err)
	}
	for i, c := range []struct {
		name string
		pkl  []byte
		gz   bool
		H    int64
		want string
	}{
		{"os.system payload", torchforge.OSSystem(3, 4, "touch /nonexistent/pwned"), false, 4, "GLOBAL typing.collections"},
		{"os.system payload in .ckpt.gz", torchforge.OSSystem(3, 4, "touch /nonexistent/pwned"), true, 4, "GLOBAL typing.collections"},
		{"hidden_state re-pointed at a NaN storage", torchforge.Repointed(3, 4, "4"), false, 4, "BUILD"},
		// 96 elements at 2^63-64: the end overflows int64 (issue 17's offset).
		{"storage offset 2^63-64", torchforge.BigOffset(3, 32), false, 32, "lies outside"},
	} {
		s := i + 1
		src := forgedFile(t, from, s, c.pkl, c.gz, true, c.H)
		want := forgedWant(s)
		want.HiddenSize = int(c.H)
		res, err := Import(context.Background(), src, l, want, false, t.TempDir())
		if !isReject(err, c.want) {
			t.Errorf("%s: import = %+v, %v; want it left alone naming %q", c.name, res, err, c.want)
		}
		if _, err := os.Lstat(l.Path(s)); !os.IsNotExist(err) {
			t.Errorf("%s: an output exists at %s (%v)", c.name, l.Path(s), err)
		}
	}
}

// ownFile has import convert a good forged file into extract's own file of layout l
// (safetensors by default), fingerprints fp-1 and cfg-1.
func ownFile(t *testing.T, l Layout, s int) string {
	t.Helper()
	src := forgedSample(t, t.TempDir(), s, torchforge.Dict(torchforge.Sample(3, 4), nil, nil), false) // its unused record makes it a conversion
	res, err := Import(context.Background(), src, l, forgedWant(s), false, t.TempDir())
	if err != nil || res.How != howConvert {
		t.Fatalf("make extract's own file: %+v, %v", res, err)
	}
	if _, err := ReadOutput(res.Path, true); err != nil {
		t.Fatalf("the own file does not verify: %v", err)
	}
	return res.Path
}

// flipTensorByte flips one bit in the last tensor byte of a file (aux_hidden_state's
// last element in every format extract writes, before any trailing record).
func flipTensorByte(t *testing.T, path string) {
	t.Helper()
	sf, err := openSample(path)
	if err != nil {
		t.Fatal(err)
	}
	at := sf.t[3].off + sf.t[3].n - 2
	sf.Close()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 1)
	f.ReadAt(b, at)
	b[0] ^= 0x01
	f.WriteAt(b, at)
}

func TestImportOfExtractsOwnFileWithAFlippedBitIsRefusedNotLaunderedIntoAFreshCrc(t *testing.T) {
	for _, src := range []Layout{{Format: FormatSafetensors}, {Format: FormatSpecForge}} {
		src.Dir = t.TempDir()
		path := ownFile(t, src, 5)
		flipTensorByte(t, path)
		in := ImportFile{Path: path, Sample: 5, Kind: src.Format}
		for _, dst := range []Layout{src, {Format: FormatModelOpt}, {Format: FormatSpecForge, Gzip: true}} {
			dst.Dir = t.TempDir()
			for _, copyOnly := range []bool{false, true} {
				res, err := Import(context.Background(), in, dst, forgedWant(5), copyOnly, t.TempDir())
				if !isReject(err, "the file is damaged") {
					t.Errorf("%s into %s (copy %v): %+v, %v; want the damage refused", src.Name(), dst.Name(), copyOnly, res, err)
				}
				if _, err := os.Lstat(dst.Path(5)); !os.IsNotExist(err) {
					t.Errorf("%s into %s: output left at %s", src.Name(), dst.Name(), dst.Path(5))
				}
			}
		}
	}
}

// smallTmpfs mounts a real tmpfs of size (root only) for the test.
func smallTmpfs(t *testing.T, size string) string {
	t.Helper()
	mnt := filepath.Join(t.TempDir(), "disk")
	os.MkdirAll(mnt, 0o755)
	if err := syscall.Mount("tmpfs", mnt, "tmpfs", 0, "size="+size); err != nil {
		if strings.Contains(os.Getenv("EXTRACT_CI_REQUIRE"), "root") {
			t.Fatalf("EXTRACT_CI_REQUIRE names root but a tmpfs cannot be mounted: %v", err)
		}
		testsupport.Unavailable(t, testsupport.Root, "cannot mount a tmpfs here: %v", err)
	}
	t.Cleanup(func() { syscall.Unmount(mnt, syscall.MNT_DETACH) })
	return mnt
}

func TestAGzipBombIsRefusedQuicklyWritingNoMoreThanItsPickleDeclares(t *testing.T) {
	scratch := filepath.Join(smallTmpfs(t, "16m"), "import-scratch")
	// A good sample's records, then 256 MiB of zeros in a record no tensor uses:
	// a 256 KiB .ckpt.gz.
	path := filepath.Join(t.TempDir(), "rows_0-2000", "data_1.ckpt.gz")
	const junk = 256 << 20
	writeBombGz(t, path, junk, nil)
	st, _ := os.Stat(path)
	t.Logf("bomb: %d bytes of gzip, %d decompressed", st.Size(), junk)

	start := time.Now()
	src := ImportFile{Path: path, Sample: 1, Kind: FormatSpecForge}
	res, err := Import(context.Background(), src, Layout{Dir: t.TempDir(), Format: FormatSpecForge}, forgedWant(1), false, scratch)
	took := time.Since(start)
	if !isReject(err, "decompresses past") {
		t.Fatalf("import of the bomb = %+v, %v; want it refused for decompressing past its declared size", res, err)
	}
	if took > 20*time.Second {
		t.Fatalf("the refusal took %v", took)
	}
	left, _ := os.ReadDir(scratch)
	if len(left) != 0 {
		t.Fatalf("scratch keeps %d entries", len(left))
	}
	t.Logf("refused in %v: %v", took, err)
}

func TestImportRefusesAFIFOOrASymlinkSwappedInUnderASourceNameWithoutBlocking(t *testing.T) {
	from := t.TempDir()
	good := forgedFile(t, from, 2, torchforge.Dict(torchforge.Sample(3, 4), nil, nil), false, false, 4)
	fifo := filepath.Join(from, "rows_0-2000", "data_3.ckpt")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(from, "rows_0-2000", "data_4.ckpt")
	os.Symlink(good.Path, link)
	l := Layout{Dir: t.TempDir(), Format: FormatSpecForge}
	for s, c := range map[int]struct{ path, want string }{3: {fifo, "not a regular file"}, 4: {link, "symlink"}} {
		got := make(chan error, 1)
		go func() {
			_, err := Import(context.Background(), ImportFile{Path: c.path, Sample: s, Kind: FormatSpecForge}, l, forgedWant(s), false, t.TempDir())
			got <- err
		}()
		select {
		case err := <-got:
			if !isReject(err, c.want) {
				t.Errorf("sample %d: %v; want it refused as %q", s, err, c.want)
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("sample %d: import blocked on %s", s, c.path)
		}
	}
}

func TestAGzipThatCannotFitTheStateDiskIsATemporaryFailureNotARefusal(t *testing.T) {
	scratch := filepath.Join(smallTmpfs(t, "64k"), "import-scratch")
	const H = 4096 // 96 KiB of tensors: more than the disk
	src := forgedFile(t, t.TempDir(), 1, torchforge.Dict(torchforge.Sample(3, H), nil, nil), true, false, H)
	want := forgedWant(1)
	want.HiddenSize = H
	_, err := Import(context.Background(), src, Layout{Dir: t.TempDir(), Format: FormatSpecForge}, want, false, scratch)
	if !errors.Is(err, ErrScratchFull) || isReject(err, "") {
		t.Fatalf("import = %v; want ErrScratchFull (the disk, not the file)", err)
	}
	// With room, the same file is good.
	if _, err := Import(context.Background(), src, Layout{Dir: t.TempDir(), Format: FormatSpecForge}, want, false, t.TempDir()); err != nil {
		t.Fatalf("with room: %v", err)
	}
}

// writeBombGz writes a .ckpt.gz of a good 3-token sample followed by a record of junk
// zero bytes no tensor uses; md, when set, goes into the gzip header as extract's own
// metadata (a file that claims to be extract's).
func writeBombGz(t *testing.T, path string, junk int64, md map[string]string) {
	t.Helper()
	os.MkdirAll(filepath.Dir(path), 0o755)
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	gz, _ := gzip.NewWriterLevel(f, gzip.BestSpeed)
	if md != nil {
		js, _ := json.Marshal(md)
		gz.Header.Extra = append(binary.LittleEndian.AppendUint16([]byte{'E', 'X'}, uint16(len(js))), js...)
	}
	zw := zip.NewWriter(gz)
	zeros := make([]byte, 1<<20)
	crc := crc32.NewIEEE()
	for range junk >> 20 {
		crc.Write(zeros)
	}
	recs := append([][]byte{torchforge.Dict(torchforge.Sample(3, 4), nil, nil)}, torchforge.Storages(3, 4, false)...)
	for i, b := range recs {
		name := "archive/data/" + strconv.Itoa(i-1)
		if i == 0 {
			name = "archive/data.pkl"
		}
		w, _ := zw.CreateRaw(&zip.FileHeader{Name: name, Method: zip.Store, CRC32: crc32.ChecksumIEEE(b), CompressedSize64: uint64(len(b)), UncompressedSize64: uint64(len(b))})
		w.Write(b)
	}
	w, _ := zw.CreateRaw(&zip.FileHeader{Name: "archive/junk", Method: zip.Store, CRC32: crc.Sum32(), CompressedSize64: uint64(junk), UncompressedSize64: uint64(junk)})
	for range junk >> 20 {
		w.Write(zeros)
	}
	if zw.Close() != nil || gz.Close() != nil || f.Close() != nil {
		t.Fatal("write the bomb")
	}
}

func TestABombThatClaimsToBeExtractsOwnGzipIsRefusedAtItsUnusedRecord(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rows_0-2000", "data_1.ckpt.gz")
	writeBombGz(t, path, 1<<30, map[string]string{"format": outputFormat, "sample": "1", "layers": "2,30,58",
		"tokens": "3", "hidden_size": "4", "crc32c": "00000000"})
	start := time.Now()
	_, err := Import(context.Background(), ImportFile{Path: path, Sample: 1, Kind: FormatSpecForge},
		Layout{Dir: t.TempDir(), Format: FormatSpecForge, Gzip: true}, forgedWant(1), false, t.TempDir())
	if !isReject(err, "no tensor uses") || time.Since(start) > 10*time.Second {
		t.Fatalf("import of a 1 GiB bomb under extract's metadata: %v after %v; want it refused at the unused record", err, time.Since(start))
	}
}
