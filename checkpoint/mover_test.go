package checkpoint

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"

	"github.com/extract-dev/extract/internal/safetensors"
	"github.com/extract-dev/extract/internal/testsupport"
)

// dumpSpec describes a test dump; the zero value of each field means protocol v1's default.
type dumpSpec struct {
	sample int
	T, H   int64
	// meta overrides the default metadata; an empty value deletes the key.
	meta map[string]string
	// tensors replaces the default three tensors.
	tensors []safetensors.Spec
}

func ridOf(sample, attempt int) string { return fmt.Sprintf("s%09d-a%d", sample, attempt) }

// idsOf is the token sequence test dumps carry for a sample.
func idsOf(sample int, T int64) []int64 {
	ids := make([]int64, T)
	for i := range ids {
		ids[i] = int64(sample*1000 + i*7 + 3)
	}
	return ids
}

// writeDump writes a dump the way the server hook does and returns its path. Tensor
// bytes are streamed from a pattern, so large dumps cost no memory.
func writeDump(tb testing.TB, dir string, d dumpSpec) string {
	tb.Helper()
	if d.T == 0 {
		d.T = 5
	}
	if d.H == 0 {
		d.H = 8
	}
	meta := map[string]string{"rid": ridOf(d.sample, 1), "protocol": "1", "layers": "2,30,58", "model": "kimi-k2.5", "hook_version": "0.3.1"}
	for k, v := range d.meta {
		if v == "" {
			delete(meta, k)
		} else {
			meta[k] = v
		}
	}
	specs := d.tensors
	if specs == nil {
		specs = []safetensors.Spec{
			{Name: "aux_hidden_state", DType: safetensors.BF16, Shape: []int64{d.T, 3 * d.H}},
			{Name: "hidden_state", DType: safetensors.BF16, Shape: []int64{d.T, d.H}},
			{Name: "input_ids", DType: safetensors.I64, Shape: []int64{d.T}},
		}
	}
	hdr, tensors, err := safetensors.EncodeHeader(specs, meta)
	if err != nil {
		tb.Fatal(err)
	}
	path := filepath.Join(dir, meta["rid"]+".safetensors")
	if meta["rid"] == "" {
		path = filepath.Join(dir, "norid.safetensors")
	}
	f, err := os.Create(path)
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write(hdr); err != nil {
		tb.Fatal(err)
	}
	buf := make([]byte, 1<<20)
	for ti, t := range tensors {
		if t.Name == "input_ids" && t.DType == safetensors.I64 {
			for _, id := range idsOf(d.sample, t.Elements()) {
				if err := binary.Write(f, binary.LittleEndian, id); err != nil {
					tb.Fatal(err)
				}
			}
			continue
		}
		for off := int64(0); off < t.Len(); off += int64(len(buf)) {
			chunk := buf[:min(int64(len(buf)), t.Len()-off)]
			for i := range chunk {
				chunk[i] = byte(int64(i)*131 + off + int64(ti)*17 + int64(d.sample))
			}
			if _, err := f.Write(chunk); err != nil {
				tb.Fatal(err)
			}
		}
	}
	if err := f.Close(); err != nil {
		tb.Fatal(err)
	}
	return path
}

func expectFor(sample int, T int64) Expect {
	return Expect{Sample: sample, RID: ridOf(sample, 1), InputIDs: idsOf(sample, T), DatasetFingerprint: "fp-1", HiddenSize: 8,
		Layers: "2,30,58", Model: "kimi-k2.5", ConfigFingerprint: "cfg-1"}
}

// tensorBytes returns the named tensor's bytes from a whole safetensors file.
func tensorBytes(tb testing.TB, file []byte, name string) []byte {
	tb.Helper()
	h, err := safetensors.ReadHeader(bytes.NewReader(file), int64(len(file)))
	if err != nil {
		tb.Fatal(err)
	}
	t, ok := h.Tensor(name)
	if !ok {
		tb.Fatalf("no tensor %s", name)
	}
	return file[h.DataStart+t.Begin : h.DataStart+t.End]
}

func int64Bytes(vs []int64) []byte {
	b := make([]byte, 0, 8*len(vs))
	for _, v := range vs {
		b = binary.LittleEndian.AppendUint64(b, uint64(v))
	}
	return b
}

// filesUnder lists every regular file below dir.
func filesUnder(tb testing.TB, dir string) []string {
	tb.Helper()
	var files []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			files = append(files, p)
		}
		return nil
	})
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		tb.Fatal(err)
	}
	return files
}

func TestMoveWritesExactTensorsMetadataAndCRC(t *testing.T) {
	for _, tc := range []struct {
		name     string
		want     func(Expect) Expect
		lossMask []int64
	}{
		{"token sample with loss mask", func(e Expect) Expect { e.LossMask = []int64{0, 0, 1, 1, 1}; return e }, []int64{0, 0, 1, 1, 1}},
		{"text sample takes the dump's ids and all ones", func(e Expect) Expect { e.InputIDs = nil; return e }, []int64{1, 1, 1, 1, 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			shm, out := t.TempDir(), t.TempDir()
			dumpPath := writeDump(t, shm, dumpSpec{sample: 2345})
			want := tc.want(expectFor(2345, 5))
			m := &Mover{OutputDir: out, BufferSize: 64} // small chunks exercise the chunk loops
			moved, err := m.moveFile(context.Background(), dumpPath, want)
			if err != nil {
				t.Fatal(err)
			}
			if moved.Path != OutputPath(out, 2345) || moved.Tokens != 5 || moved.Layers != "2,30,58" || moved.Model != "kimi-k2.5" || moved.HookVersion != "0.3.1" || moved.Protocol != "1" {
				t.Fatalf("Moved = %+v", moved)
			}
			if files := filesUnder(t, out); len(files) != 1 || files[0] != moved.Path {
				t.Fatalf("output dir holds %v, want only %s", files, moved.Path)
			}
			if _, err := os.Stat(dumpPath); err != nil {
				t.Fatalf("Move must leave the dump: %v", err)
			}

			got, err := os.ReadFile(moved.Path)
			if err != nil {
				t.Fatal(err)
			}
			dump, err := os.ReadFile(dumpPath)
			if err != nil {
				t.Fatal(err)
			}
			if int64(len(got)) != moved.Bytes {
				t.Fatalf("file is %d bytes, Moved.Bytes %d", len(got), moved.Bytes)
			}
			for _, name := range []string{"input_ids", "hidden_state", "aux_hidden_state"} {
				if !bytes.Equal(tensorBytes(t, got, name), tensorBytes(t, dump, name)) {
					t.Errorf("tensor %s differs from the dump", name)
				}
			}
			if !bytes.Equal(tensorBytes(t, got, "loss_mask"), int64Bytes(tc.lossMask)) {
				t.Errorf("loss_mask = %x, want %v", tensorBytes(t, got, "loss_mask"), tc.lossMask)
			}

			h, err := safetensors.ReadHeader(bytes.NewReader(got), int64(len(got)))
			if err != nil {
				t.Fatal(err)
			}
			var order []string
			for _, ts := range h.Tensors {
				order = append(order, ts.Name)
			}
			if strings.Join(order, ",") != "input_ids,loss_mask,hidden_state,aux_hidden_state" {
				t.Errorf("tensor order %v", order)
			}
			sum := crc32.Checksum(got[h.DataStart:], castagnoli)
			wantMeta := map[string]string{
				"format": "extract/v1", "sample": "2345", "rid": ridOf(2345, 1), "dataset_fingerprint": "fp-1",
				"layers": "2,30,58", "model": "kimi-k2.5", "hook_version": "0.3.1", "protocol": "1",
				"tokens": "5", "crc32c": fmt.Sprintf("%08x", sum), "config_fingerprint": "cfg-1",
			}
			if !maps.Equal(h.Metadata, wantMeta) {
				t.Errorf("metadata = %v, want %v", h.Metadata, wantMeta)
			}
			if moved.CRC32C != sum {
				t.Errorf("Moved.CRC32C = %08x, data has %08x", moved.CRC32C, sum)
			}

			info, err := ReadOutput(moved.Path, true)
			if err != nil {
				t.Fatal(err)
			}
			wantInfo := OutputInfo{Sample: 2345, RID: ridOf(2345, 1), DatasetFingerprint: "fp-1", Tokens: 5, CRC32C: sum, Bytes: moved.Bytes,
				ConfigFingerprint: "cfg-1", Layers: "2,30,58", Model: "kimi-k2.5", HiddenSize: 8, Protocol: "1", HookVersion: "0.3.1"}
			if info != wantInfo {
				t.Fatalf("ReadOutput = %+v, want %+v", info, wantInfo)
			}
		})
	}
}

func TestMoveRejectsBadDumpsWithDumpErrorAndWritesNothing(t *testing.T) {
	bf, i64 := safetensors.BF16, safetensors.I64
	for _, tc := range []struct {
		name   string
		dump   dumpSpec
		mangle func(t *testing.T, path string)
		want   func(Expect) Expect
		reason string
	}{
		{name: "truncated file", mangle: func(t *testing.T, p string) { chsize(t, p, -1) }, reason: "truncated"},
		{name: "trailing bytes", mangle: func(t *testing.T, p string) { chsize(t, p, +8) }, reason: "trailing"},
		{name: "header length garbage", mangle: func(t *testing.T, p string) { patch(t, p, 0, bytes.Repeat([]byte{0xff}, 8)) }, reason: "header length"},
		{name: "wrong rid", dump: dumpSpec{meta: map[string]string{"rid": ridOf(7, 2)}}, reason: "current attempt"},
		{name: "protocol 2", dump: dumpSpec{meta: map[string]string{"protocol": "2"}}, reason: "protocol"},
		{name: "no layers", dump: dumpSpec{meta: map[string]string{"layers": ""}}, reason: "layers"},
		{name: "two layers", dump: dumpSpec{meta: map[string]string{"layers": "2,30"}}, reason: "layers"},
		{name: "missing tensor", dump: dumpSpec{tensors: []safetensors.Spec{
			{Name: "hidden_state", DType: bf, Shape: []int64{5, 8}}, {Name: "input_ids", DType: i64, Shape: []int64{5}},
		}}, reason: "tensors"},
		{name: "extra tensor", dump: dumpSpec{tensors: []safetensors.Spec{
			{Name: "aux_hidden_state", DType: bf, Shape: []int64{5, 24}}, {Name: "hidden_state", DType: bf, Shape: []int64{5, 8}},
			{Name: "input_ids", DType: i64, Shape: []int64{5}}, {Name: "logits", DType: bf, Shape: []int64{5, 2}},
		}}, reason: "tensors"},
		{name: "wrong dtype", dump: dumpSpec{tensors: []safetensors.Spec{
			{Name: "aux_hidden_state", DType: bf, Shape: []int64{5, 24}}, {Name: "hidden_state", DType: safetensors.F16, Shape: []int64{5, 8}},
			{Name: "input_ids", DType: i64, Shape: []int64{5}},
		}}, reason: "F16"},
		{name: "aux not 3H", dump: dumpSpec{tensors: []safetensors.Spec{
			{Name: "aux_hidden_state", DType: bf, Shape: []int64{5, 16}}, {Name: "hidden_state", DType: bf, Shape: []int64{5, 8}},
			{Name: "input_ids", DType: i64, Shape: []int64{5}},
		}}, reason: "aux_hidden_state shape"},
		{name: "hidden rows differ", dump: dumpSpec{tensors: []safetensors.Spec{
			{Name: "aux_hidden_state", DType: bf, Shape: []int64{5, 24}}, {Name: "hidden_state", DType: bf, Shape: []int64{4, 8}},
			{Name: "input_ids", DType: i64, Shape: []int64{5}},
		}}, reason: "rows"},
		{name: "no tokens", dump: dumpSpec{tensors: []safetensors.Spec{
			{Name: "aux_hidden_state", DType: bf, Shape: []int64{0, 24}}, {Name: "hidden_state", DType: bf, Shape: []int64{0, 8}},
			{Name: "input_ids", DType: i64, Shape: []int64{0}},
		}}, want: func(e Expect) Expect { e.InputIDs = nil; return e }, reason: "no tokens"},
		{name: "hidden size differs", dump: dumpSpec{H: 16}, reason: "hidden size 16"},
		{name: "input_ids differ", want: func(e Expect) Expect { e.InputIDs[3]++; return e }, reason: "position 3"},
		{name: "input_ids length differs", want: func(e Expect) Expect { e.InputIDs = e.InputIDs[:4]; return e }, reason: "server saw 5 tokens"},
		{name: "loss_mask wrong length", want: func(e Expect) Expect { e.InputIDs = nil; e.LossMask = []int64{1, 1, 1, 1, 1, 1}; return e }, reason: "loss_mask"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			shm, out := t.TempDir(), t.TempDir()
			tc.dump.sample = 7
			path := writeDump(t, shm, tc.dump)
			if tc.mangle != nil {
				tc.mangle(t, path)
			}
			want := expectFor(7, 5)
			if tc.want != nil {
				want = tc.want(want)
			}
			m := &Mover{OutputDir: out}
			_, err := m.moveFile(context.Background(), path, want)
			de, ok := errors.AsType[*DumpError](err)
			if !ok {
				t.Fatalf("Move = %v, want a *DumpError", err)
			}
			if de.Path != path || !strings.Contains(err.Error(), path) || !strings.Contains(de.Reason, tc.reason) {
				t.Fatalf("DumpError %q does not name the file and %q", err, tc.reason)
			}
			if files := filesUnder(t, out); len(files) != 0 {
				t.Fatalf("a bad dump left %v", files)
			}
		})
	}
}

// chsize grows or shrinks a file by delta bytes.
func chsize(t *testing.T, path string, delta int64) {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(path, st.Size()+delta); err != nil {
		t.Fatal(err)
	}
}

// patch overwrites bytes of a file at off.
func patch(t *testing.T, path string, off int64, b []byte) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

func TestMoveIntoFullDiskLeavesNoFileAndIsNotADumpError(t *testing.T) {
	out := t.TempDir()
	testsupport.Require(t, testsupport.Root) // to mount a 1 MiB tmpfs
	if err := syscall.Mount("tmpfs", out, "tmpfs", 0, "size=1m"); err != nil {
		testsupport.Unavailable(t, testsupport.Root, "mount a 1 MiB tmpfs: %v", err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(out, 0) })

	// 2 MiB of tensors: T=64, H=4096.
	dumpPath := writeDump(t, t.TempDir(), dumpSpec{sample: 3, T: 64, H: 4096})
	want := expectFor(3, 64)
	want.HiddenSize = 4096
	_, err := (&Mover{OutputDir: out}).moveFile(context.Background(), dumpPath, want)
	if err == nil {
		t.Fatal("Move of 2 MiB into 1 MiB succeeded")
	}
	if _, bad := errors.AsType[*DumpError](err); bad {
		t.Fatalf("a full output disk is not the dump's fault: %v", err)
	}
	if !errors.Is(err, syscall.ENOSPC) {
		t.Errorf("error %v, want ENOSPC", err)
	}
	if files := filesUnder(t, out); len(files) != 0 {
		t.Fatalf("full disk left %v", files)
	}
}

// cancelAfter is a context whose Err turns to Canceled after n checks, which cancels a
// move between two chunks deterministically.
type cancelAfter struct {
	context.Context
	n int
}

func (c *cancelAfter) Err() error {
	if c.n--; c.n < 0 {
		return context.Canceled
	}
	return nil
}

func TestMoveCancelledMidCopyRemovesTempFile(t *testing.T) {
	dumpPath := writeDump(t, t.TempDir(), dumpSpec{sample: 1, T: 64, H: 64})
	out := t.TempDir()
	want := expectFor(1, 64)
	want.HiddenSize = 64
	ctx := &cancelAfter{Context: context.Background(), n: 10}
	_, err := (&Mover{OutputDir: out, BufferSize: 1024}).moveFile(ctx, dumpPath, want)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Move = %v, want context.Canceled", err)
	}
	if files := filesUnder(t, out); len(files) != 0 {
		t.Fatalf("a cancelled move left %v", files)
	}
}

func TestMoveAgainOverwritesTheOutputIdempotently(t *testing.T) {
	dumpPath := writeDump(t, t.TempDir(), dumpSpec{sample: 4001})
	out := t.TempDir()
	m := &Mover{OutputDir: out}
	first, err := m.moveFile(context.Background(), dumpPath, expectFor(4001, 5))
	if err != nil {
		t.Fatal(err)
	}
	before, _ := os.ReadFile(first.Path)
	// A crash between create and rename leaves a temp file; the retry must reuse its name.
	if err := os.WriteFile(tempPath(first.Path), []byte("partial"), 0o644); err != nil {
		t.Fatal(err)
	}
	second, err := m.moveFile(context.Background(), dumpPath, expectFor(4001, 5))
	if err != nil {
		t.Fatal(err)
	}
	after, _ := os.ReadFile(second.Path)
	if first != second || !bytes.Equal(before, after) {
		t.Fatalf("second move differs: %+v vs %+v", first, second)
	}
	if files := filesUnder(t, out); len(files) != 1 {
		t.Fatalf("output dir holds %v, want one file", files)
	}
}

func TestMoveOfA64MiBDumpKeepsTheHeapFlat(t *testing.T) {
	if testing.Short() {
		t.Skip("writes 128 MiB")
	}
	// T=1024, H=8192: 64 MiB of hidden states.
	dumpPath := writeDump(t, t.TempDir(), dumpSpec{sample: 5, T: 1024, H: 8192})
	want := expectFor(5, 1024)
	want.HiddenSize = 8192
	m := &Mover{OutputDir: t.TempDir()}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	moved, err := m.moveFile(context.Background(), dumpPath, want)
	runtime.ReadMemStats(&after)
	if err != nil {
		t.Fatal(err)
	}
	if moved.Bytes < 64<<20 {
		t.Fatalf("moved only %d bytes", moved.Bytes)
	}
	// Total allocation bounds any peak of HeapInuse, garbage included.
	alloc := after.TotalAlloc - before.TotalAlloc
	inuse := int64(after.HeapInuse) - int64(before.HeapInuse)
	t.Logf("moving %d MiB allocated %d KiB, HeapInuse grew %d KiB", moved.Bytes>>20, alloc>>10, inuse>>10)
	if alloc > 16<<20 || inuse > 16<<20 {
		t.Fatalf("allocated %d bytes, HeapInuse grew %d; want both under 16 MiB", alloc, inuse)
	}
}

func BenchmarkMove256MiB(b *testing.B) {
	// T=4096, H=8192: 256 MiB of hidden states.
	dumpPath := writeDump(b, b.TempDir(), dumpSpec{sample: 6, T: 4096, H: 8192})
	want := expectFor(6, 4096)
	want.HiddenSize = 8192
	m := &Mover{OutputDir: b.TempDir()}
	b.SetBytes(4 * 4096 * 8192 * 2)
	for b.Loop() {
		if _, err := m.moveFile(context.Background(), dumpPath, want); err != nil {
			b.Fatal(err)
		}
	}
}
