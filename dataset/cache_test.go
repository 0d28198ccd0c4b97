package dataset

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/extract-dev/extract/configs"
)

// settledDataset writes a dataset and waits until it is older than the racy margin, as
// a dataset written before the job started is; the margin is lowered to keep tests fast.
func settledDataset(t *testing.T, n int) (path, stateDir string) {
	t.Helper()
	old := racyMargin
	racyMargin = 30 * time.Millisecond
	t.Cleanup(func() { racyMargin = old })
	path = changeDataset(t, n)
	time.Sleep(2 * racyMargin)
	return path, filepath.Join(t.TempDir(), "state")
}

// datasetConfig is the default config with the dataset and state dir set.
func datasetConfig(path, stateDir string) *configs.Config {
	cfg := configs.Default()
	cfg.Dataset, cfg.StateDir = path, stateDir
	return &cfg
}

func openCached(t *testing.T, path, stateDir string) *Dataset {
	t.Helper()
	d, err := OpenCached(context.Background(), datasetConfig(path, stateDir))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

func sha256Of(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func TestASecondOpenUsesTheCacheAndAgreesWithAFullRead(t *testing.T) {
	path, state := settledDataset(t, 500)
	first := openCached(t, path, state)
	if first.cached {
		t.Fatal("the first open found a cache that nobody wrote")
	}
	if _, err := os.Stat(filepath.Join(state, datasetCacheName)); err != nil {
		t.Fatalf("the first open kept no cache: %v", err)
	}
	second := openCached(t, path, state)
	if !second.cached {
		t.Fatal("the second open read the dataset again instead of using the cache")
	}
	full, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer full.Close()
	if second.Fingerprint != full.Fingerprint || second.Fingerprint != sha256Of(t, path) || second.Size != full.Size {
		t.Errorf("cached fingerprint %s size %d, full read %s size %d", second.Fingerprint, second.Size, full.Fingerprint, full.Size)
	}
	if !reflect.DeepEqual(second.lines, full.lines) || second.stat != full.stat {
		t.Error("the cached line index differs from a full read's")
	}
	s, err := second.Sample(321)
	if err != nil || !reflect.DeepEqual(s.InputIDs, []int64{322, 323, 324}) {
		t.Errorf("sample 321 from the cached index: %v, %v", s.InputIDs, err)
	}
}

func TestASameSizeEditWithTheMtimePutBackMissesTheCacheAndGetsANewFingerprint(t *testing.T) {
	path, state := settledDataset(t, 100)
	was := openCached(t, path, state).Fingerprint
	st, _ := os.Stat(path)
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("9"), int64(len(`{"input_ids": [`))); err != nil {
		t.Fatal(err)
	}
	f.Close()
	// Size, inode and mtime are as the cache recorded them; only the ctime moved.
	if err := os.Chtimes(path, st.ModTime(), st.ModTime()); err != nil {
		t.Fatal(err)
	}
	d := openCached(t, path, state)
	if d.cached {
		t.Fatal("an edited dataset was taken from the cache")
	}
	if d.Fingerprint == was || d.Fingerprint != sha256Of(t, path) {
		t.Fatalf("fingerprint %s after the edit (was %s, file's sha256 %s)", d.Fingerprint, was, sha256Of(t, path))
	}
	// A resume then refuses the new fingerprint: orchestrator's TestPrepareIndex pins it.
}

func TestADatasetReplacedAtItsPathMissesTheCache(t *testing.T) {
	path, state := settledDataset(t, 100)
	was := openCached(t, path, state)
	st, _ := os.Stat(path)
	b, _ := os.ReadFile(path)
	b[len(`{"input_ids": [`)] = '9'
	tmp := path + ".new"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(tmp, st.ModTime(), st.ModTime()); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	d := openCached(t, path, state)
	if d.cached || d.Fingerprint == was.Fingerprint || d.Fingerprint != sha256Of(t, path) {
		t.Fatalf("replaced dataset: cached %v, fingerprint %s (was %s)", d.cached, d.Fingerprint, was.Fingerprint)
	}
}

func TestACorruptOrTruncatedCacheIsIgnoredAndRebuilt(t *testing.T) {
	for name, damage := range map[string]func([]byte) []byte{
		"truncated":         func(b []byte) []byte { return b[:len(b)/2] },
		"cut by one byte":   func(b []byte) []byte { return b[:len(b)-1] },
		"one bit flipped":   func(b []byte) []byte { b[len(b)/2] ^= 1; return b },
		"empty":             func([]byte) []byte { return nil },
		"another's garbage": func([]byte) []byte { return []byte("{\"not\": \"a cache\"}\n") },
	} {
		t.Run(name, func(t *testing.T) {
			path, state := settledDataset(t, 200)
			want := openCached(t, path, state)
			cache := filepath.Join(state, datasetCacheName)
			b, err := os.ReadFile(cache)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(cache, damage(b), 0o644); err != nil {
				t.Fatal(err)
			}
			d := openCached(t, path, state)
			if d.cached {
				t.Fatal("a damaged cache was used")
			}
			if d.Fingerprint != want.Fingerprint || !reflect.DeepEqual(d.lines, want.lines) {
				t.Fatal("the full read after a damaged cache differs from the first")
			}
			if !openCached(t, path, state).cached {
				t.Error("the damaged cache was not rebuilt")
			}
		})
	}
}

func TestADatasetWrittenWithinTheRacyMarginIsNotCached(t *testing.T) {
	path := changeDataset(t, 10) // just written: an edit in the same tick would keep its ctime
	state := filepath.Join(t.TempDir(), "state")
	openCached(t, path, state)
	if _, err := os.Stat(filepath.Join(state, datasetCacheName)); !os.IsNotExist(err) {
		t.Fatalf("a cache was kept for a dataset changed %s ago (err %v)", "just now", err)
	}
	if openCached(t, path, state).cached {
		t.Fatal("a racy dataset was taken from a cache")
	}
}

func TestABadDatasetIsStillRefusedNamingTheLineWithACacheDir(t *testing.T) {
	path := writeDataset(t, `{"input_ids": [1]}`+"\n"+`{"input_ids": []}`+"\n")
	_, err := OpenCached(context.Background(), datasetConfig(path, filepath.Join(t.TempDir(), "state")))
	if !errors.Is(err, ErrBad) || !strings.Contains(err.Error(), "line 2 (sample 1)") {
		t.Fatalf("err = %v, want ErrBad naming line 2 (sample 1)", err)
	}
}
