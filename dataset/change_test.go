package dataset

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// changeDataset writes n samples of three ids each; sample i's ids are i+1, i+2, i+3.
func changeDataset(t *testing.T, n int) string {
	t.Helper()
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, `{"input_ids": [%d, %d, %d]}`+"\n", i+1, i+2, i+3)
	}
	return writeDataset(t, b.String())
}

// wantChanged checks err is ErrChanged (and so ErrBad, exit 2) and that
// its message says each of want.
func wantChanged(t *testing.T, err error, want ...string) {
	t.Helper()
	if !errors.Is(err, ErrChanged) || !errors.Is(err, ErrBad) {
		t.Fatalf("err = %v, want ErrChanged wrapping ErrBad", err)
	}
	for _, w := range append(want, "--fresh") {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not say %q", err, w)
		}
	}
}

func TestASameLengthEditInPlaceAfterOpenIsCaughtByTheLinesChecksum(t *testing.T) {
	path := changeDataset(t, 100)
	d, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	st, _ := os.Stat(path)
	// Same length, same file, and the mtime put back: only the bytes tell.
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	off := d.lines[50].off + int64(len(`{"input_ids": [`))
	if _, err := f.WriteAt([]byte("9"), off); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := os.Chtimes(path, st.ModTime(), st.ModTime()); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Sample(49); err != nil {
		t.Errorf("an untouched line: %v", err)
	}
	_, err = d.Sample(50)
	wantChanged(t, err, path, "sample 50", "line 51 bytes differ")
}

func TestAnEditThatMovesTheMtimeIsCaughtOnAnyLine(t *testing.T) {
	path := changeDataset(t, 100)
	d, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("9"), d.lines[50].off+int64(len(`{"input_ids": [`))); err != nil {
		t.Fatal(err)
	}
	f.Close()
	later := time.Now().Add(time.Hour)
	if err := os.Chtimes(path, later, later); err != nil {
		t.Fatal(err)
	}
	_, err = d.Sample(3) // line 4 itself is unchanged; the file is not
	wantChanged(t, err, path, "sample 3", "mtime")
}

func TestAnAppendedLineIsCaughtBySize(t *testing.T) {
	path := changeDataset(t, 10)
	d, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString(`{"input_ids": [7]}` + "\n")
	f.Close()
	_, err = d.Sample(0)
	wantChanged(t, err, path, "size")
}

func TestADatasetReplacedByRenameIsCaught(t *testing.T) {
	path := changeDataset(t, 10)
	d, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	// The same bytes in a new file: the open descriptor still reads the old one, which
	// is exactly what must not go on silently.
	body, _ := os.ReadFile(path)
	tmp := filepath.Join(filepath.Dir(path), "new.jsonl")
	if err := os.WriteFile(tmp, body, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	_, err = d.Sample(2)
	wantChanged(t, err, path, "sample 2", "replaced")
}

func TestADatasetRemovedDuringTheRunIsCaught(t *testing.T) {
	path := changeDataset(t, 10)
	d, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	_, err = d.Sample(1)
	wantChanged(t, err, path, "sample 1", "removed")
}

func TestAnUntouchedDatasetReadByManyGoroutinesIsNeverCalledChanged(t *testing.T) {
	path := changeDataset(t, 500)
	d, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for g := range 16 {
		wg.Go(func() {
			for i := range d.Len() {
				k := (i + g*31) % d.Len()
				s, err := d.Sample(k)
				if err == nil && s.InputIDs[0] != int64(k+1) {
					err = fmt.Errorf("sample %d read as %v", k, s.InputIDs)
				}
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
