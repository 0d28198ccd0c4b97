package torchzip

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/extract-dev/extract/internal/torchzip/torchforge"
)

// Import reads files another tool wrote: no input may panic, hang or allocate beyond
// its own size.

func FuzzOpenAndDecode(f *testing.F) {
	path := filepath.Join(f.TempDir(), "a.pt")
	writeArchive(&testing.T{}, path, false)
	good, _ := os.ReadFile(path)
	f.Add(good)
	writeArchive(&testing.T{}, path, true)
	z64, _ := os.ReadFile(path)
	f.Add(z64)
	f.Add(good[:len(good)/2])
	for _, p := range torchforge.Hostile() {
		torchforge.WriteArchive(path, p, torchforge.Storages(3, 4, true))
		b, _ := os.ReadFile(path)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		r := bytes.NewReader(b)
		if a, err := Open(r, int64(len(b))); err == nil {
			if pkl, ok := a.Get("data.pkl"); ok {
				if p, err := ReadSmall(r, pkl, 1<<20); err == nil {
					DecodeDict(p)
				}
			}
		}
		Walk(bytes.NewReader(b), func(string, int64, io.Reader) error { return nil })
	})
}

func FuzzDecodeDict(f *testing.F) {
	f.Add(EncodeDict([]Tensor{{Name: "x", DType: BFloat16, Key: "0", StorageNumel: 1 << 40, Shape: []int64{1, 1 << 20, 1 << 20}, Stride: []int64{1 << 40, 1 << 20, 1}}}))
	f.Add([]byte{0x80, 2, '}', '.'})
	for _, p := range torchforge.Hostile() {
		f.Add(p)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		DecodeDict(b)
	})
}
