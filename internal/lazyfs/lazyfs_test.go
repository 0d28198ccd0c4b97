package lazyfs

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

	"github.com/extract-dev/extract/internal/testsupport"
)

// mount mounts a fresh disk in a temp dir, or skips when FUSE cannot be mounted here.
func mount(t *testing.T) (*FS, string) {
	t.Helper()
	dir := t.TempDir()
	f := New()
	if err := f.Mount(dir); err != nil {
		if errors.Is(err, ErrUnavailable) {
			testsupport.Unavailable(t, testsupport.FUSE, "mount: %v", err)
		}
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := f.Unmount(); err != nil {
			t.Errorf("unmount: %v", err)
		}
	})
	return f, dir
}

func syncPath(t *testing.T, path string) {
	t.Helper()
	d, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		t.Fatalf("fsync %s: %v", path, err)
	}
}

func writeFile(t *testing.T, path, body string, sync bool) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(body); err != nil {
		t.Fatal(err)
	}
	if sync {
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

func cut(t *testing.T, f *FS) {
	t.Helper()
	if err := f.PowerCut(); err != nil {
		t.Fatalf("power cut: %v", err)
	}
}

func readOrMissing(t *testing.T, path string) (string, bool) {
	t.Helper()
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return "", false
	}
	if err != nil {
		t.Fatal(err)
	}
	return string(b), true
}

func TestUnsyncedWritesAreGoneAfterAPowerCutAndSyncedOnesStay(t *testing.T) {
	f, dir := mount(t)
	writeFile(t, filepath.Join(dir, "synced"), "kept", true)
	writeFile(t, filepath.Join(dir, "named-only"), "lost data", false)
	syncPath(t, dir)
	writeFile(t, filepath.Join(dir, "never-named"), "lost", true)
	// Written after the sync: the synced file keeps its synced content.
	writeFile(t, filepath.Join(dir, "synced"), "overwritten, not synced", false)
	if got, _ := readOrMissing(t, filepath.Join(dir, "synced")); got != "overwritten, not synced" {
		t.Fatalf("live view before the cut: %q", got)
	}
	cut(t, f)
	if got, ok := readOrMissing(t, filepath.Join(dir, "synced")); got != "kept" {
		t.Errorf("synced file after the cut: %q (exists %v), want %q", got, ok, "kept")
	}
	if got, ok := readOrMissing(t, filepath.Join(dir, "named-only")); !ok || got != "" {
		t.Errorf("file whose name but not data was synced: %q (exists %v), want empty", got, ok)
	}
	if _, ok := readOrMissing(t, filepath.Join(dir, "never-named")); ok {
		t.Errorf("file whose directory entry was never synced survived the cut")
	}
}

func TestFsyncedFileInAnUnsyncedDirectoryLosesItsName(t *testing.T) {
	f, dir := mount(t)
	writeFile(t, filepath.Join(dir, "a"), "data", true)
	cut(t, f)
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Fatalf("after the cut the directory lists %v, want nothing", entries)
	}
}

func TestRenameWithoutDirectoryFsyncLeavesTheOldNameAfterACut(t *testing.T) {
	f, dir := mount(t)
	tmp, final := filepath.Join(dir, ".x.tmp"), filepath.Join(dir, "x")
	writeFile(t, tmp, "whole", true)
	syncPath(t, dir)
	if err := os.Rename(tmp, final); err != nil {
		t.Fatal(err)
	}
	cut(t, f)
	if _, ok := readOrMissing(t, final); ok {
		t.Errorf("new name survived a rename whose directory was not synced")
	}
	if got, _ := readOrMissing(t, tmp); got != "whole" {
		t.Errorf("old name after the cut holds %q, want %q", got, "whole")
	}
	// The crash-safe way: rename, then fsync the directory.
	if err := os.Rename(tmp, final); err != nil {
		t.Fatal(err)
	}
	syncPath(t, dir)
	cut(t, f)
	if got, _ := readOrMissing(t, final); got != "whole" {
		t.Errorf("renamed and synced file holds %q after the cut", got)
	}
	if _, ok := readOrMissing(t, tmp); ok {
		t.Errorf("old name came back after a synced rename")
	}
}

func TestFsyncOfOneFileMakesNoOtherFileDurable(t *testing.T) {
	f, dir := mount(t)
	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	writeFile(t, a, "", false)
	writeFile(t, b, "", false)
	syncPath(t, dir)
	writeFile(t, a, "a's data", false)
	writeFile(t, b, "b's data", true)
	cut(t, f)
	if got, _ := readOrMissing(t, a); got != "" {
		t.Errorf("a holds %q after b was synced, want empty", got)
	}
	if got, _ := readOrMissing(t, b); got != "b's data" {
		t.Errorf("b holds %q", got)
	}
}

func TestSubdirectoriesUnlinkAndChmodFollowTheSameRules(t *testing.T) {
	f, dir := mount(t)
	sub := filepath.Join(dir, "rows_0-2000")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	syncPath(t, dir)
	writeFile(t, filepath.Join(sub, "gone"), "x", true)
	writeFile(t, filepath.Join(sub, "kept"), "y", true)
	if err := os.Chmod(filepath.Join(sub, "kept"), 0o600); err != nil {
		t.Fatal(err)
	}
	syncPath(t, sub)
	if err := os.Remove(filepath.Join(sub, "gone")); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(filepath.Join(sub, "kept")); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("chmod: %v %v", st, err)
	}
	cut(t, f)
	if got, _ := readOrMissing(t, filepath.Join(sub, "gone")); got != "x" {
		t.Errorf("an unlink whose directory was not synced was durable: %q", got)
	}
	st, err := os.Lstat(filepath.Join(sub, "kept"))
	if err != nil || st.Size() != 1 {
		t.Fatalf("kept after the cut: %v %v", st, err)
	}
	// os.CreateTemp, ReadDir and Remove work on the mount.
	tmp, err := os.CreateTemp(sub, ".t.tmp*")
	if err != nil {
		t.Fatal(err)
	}
	tmp.Close()
	if entries, err := os.ReadDir(sub); err != nil || len(entries) != 3 {
		t.Errorf("ReadDir: %v %v", entries, err)
	}
	if err := os.Remove(sub); !errors.Is(err, syscall.ENOTEMPTY) && !errors.Is(err, syscall.EEXIST) {
		t.Errorf("removing a non-empty dir: %v", err)
	}
}

// TestMain doubles as the bbolt helper process: a process must never fault in an mmap
// of a FUSE file that it serves itself (the fault blocks a thread the Go runtime must
// stop for GC, while the server goroutines are stopped), so bbolt runs in a child.
func TestMain(m *testing.M) {
	if args := os.Getenv("LAZYFS_BOLT_HELPER"); args != "" {
		if err := boltHelper(strings.Fields(args)); err != nil {
			fmt.Fprintln(os.Stderr, "bolt helper:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

const boltKeys = 50

var boltValue = bytes.Repeat([]byte("v"), 64<<10)

// boltHelper is "commit PATH": open, sync the directory, commit, say so and wait to be
// killed; or "check PATH": every committed key must be there.
func boltHelper(args []string) error {
	if len(args) != 2 {
		return fmt.Errorf("usage: commit|check PATH, got %q", args)
	}
	path := args[1]
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		return err
	}
	switch args[0] {
	case "commit":
		// bbolt syncs its file, never its directory: the caller must.
		d, err := os.Open(filepath.Dir(path))
		if err != nil {
			return err
		}
		if err := d.Sync(); err != nil {
			return err
		}
		for i := 0; i < boltKeys; i++ {
			err := db.Update(func(tx *bolt.Tx) error {
				b, err := tx.CreateBucketIfNotExists([]byte("done"))
				if err != nil {
					return err
				}
				return b.Put([]byte{byte(i)}, boltValue)
			})
			if err != nil {
				return err
			}
		}
		// Read back through bbolt's mmap.
		if err := db.View(func(tx *bolt.Tx) error {
			if n := tx.Bucket([]byte("done")).Stats().KeyN; n != boltKeys {
				return fmt.Errorf("%d keys before the cut", n)
			}
			return nil
		}); err != nil {
			return err
		}
		// A second open of the file must wait for bbolt's flock.
		if _, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 100 * time.Millisecond}); !errors.Is(err, berrors.ErrTimeout) {
			return fmt.Errorf("second open while the first holds the flock: %v, want a timeout", err)
		}
		fmt.Println("committed")
		select {}
	case "check":
		defer db.Close()
		return db.View(func(tx *bolt.Tx) error {
			b := tx.Bucket([]byte("done"))
			if b == nil {
				return errors.New("bucket lost")
			}
			for i := 0; i < boltKeys; i++ {
				if !bytes.Equal(b.Get([]byte{byte(i)}), boltValue) {
					return fmt.Errorf("key %d lost or changed", i)
				}
			}
			return nil
		})
	}
	return fmt.Errorf("unknown mode %q", args[0])
}

func boltCommand(mode, path string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "LAZYFS_BOLT_HELPER="+mode+" "+path)
	cmd.Stderr = os.Stderr
	return cmd
}

func TestBboltCommitsSurviveAPowerCutAndAnUnsyncedPlainWriteDoesNot(t *testing.T) {
	f, dir := mount(t)
	path := filepath.Join(dir, "index.db")
	commit := boltCommand("commit", path)
	out, err := commit.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := commit.Start(); err != nil {
		t.Fatal(err)
	}
	defer commit.Process.Kill()
	line, err := bufio.NewReader(out).ReadString('\n')
	if line != "committed\n" {
		commit.Wait()
		t.Fatalf("bbolt helper: %q %v", line, err)
	}
	writeFile(t, filepath.Join(dir, "plain"), "not synced", false)
	syncPath(t, dir)

	// Power goes while bbolt has the file open and mapped: the unmount must force it.
	cut(t, f)
	commit.Process.Kill()
	commit.Wait()

	if err := boltCommand("check", path).Run(); err != nil {
		t.Fatalf("committed data after the cut: %v", err)
	}
	if got, _ := readOrMissing(t, filepath.Join(dir, "plain")); got != "" {
		t.Errorf("unsynced plain write survived the cut: %q", got)
	}
	if s := f.Stats(); s.Boots != 2 || s.FileSyncs < 2*boltKeys {
		t.Errorf("stats %+v: want 2 boots and two fdatasyncs per commit", s)
	}
}
