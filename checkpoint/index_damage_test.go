package checkpoint

import (
	"errors"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"
)

// isolated runs the calling test in a child process and reports its result: a damaged
// index used to kill the process with SIGBUS ("fatal error: fault"), which no recover
// catches, and a test of that must fail on its own instead of taking every other test
// down with it. It returns true in the child, where the test body runs.
func isolated(t *testing.T) bool {
	t.Helper()
	if os.Getenv("CHECKPOINT_ISOLATED") == t.Name() {
		return true
	}
	cmd := exec.Command(os.Args[0], "-test.run=^"+t.Name()+"$", "-test.v")
	cmd.Env = append(os.Environ(), "CHECKPOINT_ISOLATED="+t.Name())
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the test process died or failed (%v):\n%s", err, out)
	}
	if !strings.Contains(string(out), "--- PASS: "+t.Name()) {
		t.Fatalf("the child did not run the test:\n%s", out)
	}
	return false
}

// damagedFixture writes an index of 2,000 done samples, closes it and returns its path
// and size: large enough that truncating it to 10,000 bytes cuts off pages the meta
// page says exist.
func damagedFixture(t *testing.T) (string, int64) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "index.db")
	ix, err := Open(path, OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := ix.Init(Meta{DatasetFingerprint: "fp-1", Total: 2000}); err != nil {
		t.Fatal(err)
	}
	fillRecords(t, ix, 2000)
	if err := ix.Close(); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Size() <= 10000 {
		t.Fatalf("fixture is only %d bytes", st.Size())
	}
	return path, st.Size()
}

// wantDamaged opens path both ways and requires ErrDamaged naming the file and what.
func wantDamaged(t *testing.T, path, what string) {
	t.Helper()
	for _, ro := range []bool{true, false} {
		ix, err := Open(path, OpenOptions{ReadOnly: ro})
		if err == nil {
			_, _ = ix.Load(2000)
			_ = ix.Close()
			t.Fatalf("readonly=%v: Open of a damaged index succeeded", ro)
		}
		if !errors.Is(err, ErrDamaged) || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), what) {
			t.Fatalf("readonly=%v: Open = %v, want ErrDamaged naming %s and %q", ro, err, path, what)
		}
	}
}

func TestOpenOfATruncatedIndexIsErrDamagedNotSIGBUS(t *testing.T) {
	if !isolated(t) {
		return
	}
	path, _ := damagedFixture(t)
	if err := os.Truncate(path, 10000); err != nil {
		t.Fatal(err)
	}
	wantDamaged(t, path, "10000 bytes")
}

func TestOpenOfAnIndexWithZeroedMetaPagesIsErrDamaged(t *testing.T) {
	if !isolated(t) {
		return
	}
	path, _ := damagedFixture(t)
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(make([]byte, 2*4096), 0); err != nil {
		t.Fatal(err)
	}
	_ = f.Close()
	wantDamaged(t, path, "meta")
}

func TestOpenOfAnIndexWithOneBadMetaPageUsesTheOther(t *testing.T) {
	path, _ := damagedFixture(t)
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	// Scribble over the checksum of meta page 0; bbolt falls back to page 1, so must we.
	if _, err := f.WriteAt([]byte{1, 2, 3, 4, 5, 6, 7, 8}, 16+56); err != nil {
		t.Fatal(err)
	}
	_ = f.Close()
	ix, err := Open(path, OpenOptions{ReadOnly: true})
	if err != nil {
		t.Fatalf("Open with one good meta page = %v", err)
	}
	defer ix.Close()
	if _, err := ix.Load(2000); err != nil {
		t.Fatal(err)
	}
}

func TestOpenOfRandomGarbageIsErrDamaged(t *testing.T) {
	if !isolated(t) {
		return
	}
	r := rand.New(rand.NewPCG(1, 2))
	for _, size := range []int{100, 4096, 10000, 65536} {
		b := make([]byte, size)
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		path := filepath.Join(t.TempDir(), "index.db")
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
		wantDamaged(t, path, "meta")
	}
}

func TestOpenOfAnEmptyFileIsANewIndexReadWriteAndErrDamagedReadOnly(t *testing.T) {
	if !isolated(t) {
		return
	}
	path := filepath.Join(t.TempDir(), "index.db")
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := Open(path, OpenOptions{ReadOnly: true})
	if !errors.Is(err, ErrDamaged) || !strings.Contains(err.Error(), path) {
		t.Fatalf("read-only Open of a 0-byte file = %v, want ErrDamaged naming it", err)
	}
	ix, err := Open(path, OpenOptions{})
	if err != nil {
		t.Fatalf("read-write Open of a 0-byte file = %v, want a new index", err)
	}
	defer ix.Close()
	if _, ok, err := ix.Meta(); ok || err != nil {
		t.Fatalf("Meta of a new index = %v, %v", ok, err)
	}
}

func TestAnIndexTruncatedWhileOpenFailsItsReadsWithErrDamaged(t *testing.T) {
	if !isolated(t) {
		return
	}
	path, _ := damagedFixture(t)
	ix, err := Open(path, OpenOptions{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer ix.Close()
	// The pre-open check passed; now the pages vanish under bbolt's mmap, which is
	// SIGBUS on the next touch unless the read runs with SetPanicOnFault and a recover.
	if err := os.Truncate(path, 8192); err != nil {
		t.Fatal(err)
	}
	_, err = ix.Load(2000)
	if !errors.Is(err, ErrDamaged) || !strings.Contains(err.Error(), path) {
		t.Fatalf("Load of a truncated index = %v, want ErrDamaged naming it", err)
	}
	// The index stays usable as an error source, not a crash.
	if _, err := ix.Counters(); !errors.Is(err, ErrDamaged) {
		t.Fatalf("Counters after the fault = %v, want ErrDamaged", err)
	}
}

func TestOpenOfAnIndexWithScribbledDataPagesIsAnErrorNotAPanic(t *testing.T) {
	if !isolated(t) {
		return
	}
	path, size := damagedFixture(t)
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	junk := make([]byte, size-4*4096)
	for i := range junk {
		junk[i] = 0xa5
	}
	// Pages 0 and 1 are the metas; everything after page 3 (root and beyond) is junk.
	if _, err := f.WriteAt(junk, 4*4096); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(junk[:2*4096], 2*4096); err != nil {
		t.Fatal(err)
	}
	_ = f.Close()
	for _, ro := range []bool{true, false} {
		ix, err := Open(path, OpenOptions{ReadOnly: ro})
		if err == nil {
			_, err = ix.Load(2000)
			_ = ix.Close()
		}
		if !errors.Is(err, ErrDamaged) || !strings.Contains(err.Error(), path) {
			t.Fatalf("readonly=%v: %v, want ErrDamaged naming the file", ro, err)
		}
	}
}

// A bug in the code a transaction runs is not damage: guard re-panics it, since
// ErrDamaged's remedy (move the index aside and rebuild it) would treat a sound file.
func TestAPanicInTheCodeATxnRunsIsRepanickedNotCalledDamage(t *testing.T) {
	ix, err := Open(filepath.Join(t.TempDir(), "index.db"), OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer ix.Close()
	for name, bug := range map[string]func(){
		"nil map":     func() { m := map[string]map[string]int{}; m["a"]["x"] = 1 },
		"index":       func() { s := []int{}; i := 3; _ = s[i] },
		"nil pointer": func() { var p *Record; _ = p.Sample },
		"plain panic": func() { panic("bug") },
	} {
		var got error
		recovered := func() (r any) {
			defer func() { r = recover() }()
			got = ix.update(func(*bolt.Tx) error { bug(); return nil })
			return nil
		}()
		if recovered == nil {
			t.Errorf("%s: the panic became an error (%v), want it re-panicked", name, got)
		}
	}
	// The index is still usable afterwards.
	if _, _, err := ix.Meta(); err != nil {
		t.Fatalf("Meta after the panics: %v", err)
	}
}
