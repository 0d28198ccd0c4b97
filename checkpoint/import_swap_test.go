package checkpoint

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/extract-dev/extract/internal/torchzip/torchforge"
)

// TestImportUnderAToolSwappingGoodAndNaNVersionsPlacesOnlyCheckedBytes has another
// "tool" rename a good and a NaN version of every source file over its name, as fast as
// it can, while import links (and, separately, copies) them: every file import counts
// must hold the good version, whichever it opened.
func TestImportUnderAToolSwappingGoodAndNaNVersionsPlacesOnlyCheckedBytes(t *testing.T) {
	const n, T, H = 40, 3, 2048 // wide rows: each check takes a while, the swaps land in it
	pkl := torchforge.Dict(torchforge.Sample(T, H), nil, nil)
	good := torchforge.Storages(T, H, false)
	bad := append([][]byte(nil), good...)
	bad[2] = torchforge.BF16(T*H, 0x7fc0)
	for _, copyOnly := range []bool{false, true} {
		t.Run(fmt.Sprintf("copy=%v", copyOnly), func(t *testing.T) {
			from, masters := t.TempDir(), t.TempDir()
			var files []ImportFile
			for s := range n {
				g, b := filepath.Join(masters, fmt.Sprintf("g%d", s)), filepath.Join(masters, fmt.Sprintf("b%d", s))
				if torchforge.WriteArchive(g, pkl, good) != nil || torchforge.WriteArchive(b, pkl, bad) != nil {
					t.Fatal("write the versions")
				}
				path := filepath.Join(from, "rows_0-2000", fmt.Sprintf("data_%d.ckpt", s))
				os.MkdirAll(filepath.Dir(path), 0o755)
				if err := os.Link(g, path); err != nil {
					t.Fatal(err)
				}
				files = append(files, ImportFile{Path: path, Sample: s, Kind: FormatSpecForge})
			}
			stop := make(chan struct{})
			var swaps, current atomic.Int64
			var wg sync.WaitGroup
			wg.Add(1)
			go func() { // the other tool: atomic renames of either version over the name import reads
				defer wg.Done()
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					s := int(current.Load())
					master := filepath.Join(masters, fmt.Sprintf("%c%d", "gb"[i%2], s))
					tmp := files[s].Path + ".swap"
					if os.Link(master, tmp) == nil && os.Rename(tmp, files[s].Path) == nil {
						swaps.Add(1)
					}
					os.Remove(tmp) // left when the name already was that version: rename of a link to itself does nothing
				}
			}()
			l := Layout{Dir: t.TempDir(), Format: FormatSpecForge}
			var done, refused int
			for round := 0; round < 20 && done < n; round++ {
				for _, f := range files {
					if _, err := os.Stat(l.Path(f.Sample)); err == nil {
						continue
					}
					want := forgedWant(f.Sample)
					want.HiddenSize = H
					current.Store(int64(f.Sample))
					for at := swaps.Load(); swaps.Load() < at+3; {
						runtime.Gosched() // the tool is swapping this very name
					}
					_, err := Import(context.Background(), f, l, want, copyOnly, t.TempDir())
					switch {
					case err == nil:
						done++
						if _, err := os.Stat(l.Path(f.Sample)); err != nil {
							t.Fatalf("sample %d imported but %v", f.Sample, err)
						}
					case isReject(err, "not finite"), isReject(err, "changed while it was checked"):
						refused++
					default:
						t.Fatalf("sample %d: %v", f.Sample, err)
					}
				}
			}
			close(stop)
			wg.Wait()
			nan := 0
			for _, f := range files {
				ts, err := ReadTensors(l.Path(f.Sample))
				if errors.Is(err, fs.ErrNotExist) {
					continue
				}
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(ts[tensorHidden], good[2]) {
					nan++
				}
			}
			t.Logf("%d swaps; %d imported, %d refused on the way", swaps.Load(), done, refused)
			if swaps.Load() < int64(n) || refused == 0 {
				t.Fatalf("%d swaps and %d refusals: the race was not exercised", swaps.Load(), refused)
			}
			if nan > 0 {
				t.Fatalf("%d of %d imported files hold the NaN version", nan, done)
			}
		})
	}
}
