package shm

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// stagingDir returns a fresh directory on a real tmpfs when the machine has /dev/shm.
func stagingDir(t *testing.T) string {
	t.Helper()
	if fs, err := StatFS("/dev/shm"); err == nil && fs.Tmpfs {
		dir, err := os.MkdirTemp("/dev/shm", "shm-test-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		return dir
	}
	return t.TempDir()
}

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func TestParseRID(t *testing.T) {
	tests := []struct {
		in      string
		want    RID
		wantErr bool
	}{
		{"s000018421-a2", RID{18421, 2}, false},
		{"s000000000-a1", RID{0, 1}, false},
		{"s18421-a2", RID{}, true},
		{"s000018421-a0", RID{}, true},
		{"s000018421", RID{}, true},
		{"x000018421-a1", RID{}, true},
		{"s000018421-a1 ", RID{}, true},
	}
	for _, tt := range tests {
		got, err := ParseRID(tt.in)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("ParseRID(%q) = %v, %v; want %v, err=%v", tt.in, got, err, tt.want, tt.wantErr)
		}
		if err == nil && got.String() != tt.in {
			t.Errorf("RID round trip: %q became %q", tt.in, got.String())
		}
	}
}

func TestParseDumpNameAcceptsOnlyFinalNames(t *testing.T) {
	for name, want := range map[string]bool{
		"s000000007-a1.safetensors":         true,
		"s000000007-a1.safetensors.partial": false,
		".s000000007-a1.safetensors.tmp":    false,
		"notes.txt":                         false,
		"s7-a1.safetensors":                 false,
	} {
		if _, ok := ParseDumpName(name); ok != want {
			t.Errorf("ParseDumpName(%q) = %v, want %v", name, ok, want)
		}
	}
}

func TestWatcherReportsLeftoversThenRenamedDumps(t *testing.T) {
	dir := stagingDir(t)
	write := func(name string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("s000000001-a1.safetensors")         // leftover: adopted
	write("s000000002-a1.safetensors.partial") // leftover partial: never reported
	write("README")                            // foreign: ignored and counted

	w, err := NewWatcher(dir, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	leftovers, err := w.Scan()
	if err != nil || len(leftovers) != 1 || leftovers[0].RID != (RID{1, 1}) {
		t.Fatalf("Scan = %v, %v; want the one leftover s000000001-a1", leftovers, err)
	}
	out := make(chan Dump)
	go w.Run(ctx, out)

	expect := func(want RID) {
		t.Helper()
		select {
		case d := <-out:
			if d.RID != want {
				t.Fatalf("got dump %v, want %v", d.RID, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("no dump reported, want %v", want)
		}
	}
	// The hook's protocol: write the partial, then rename it to the final name.
	partial := filepath.Join(dir, "s000000003-a2.safetensors.partial")
	if err := os.WriteFile(partial, []byte("data"), 0o644); err != nil {
		t.Fatal(err)
	}
	select {
	case d := <-out:
		t.Fatalf("partial reported as %v", d)
	case <-time.After(200 * time.Millisecond):
	}
	if err := os.Rename(partial, filepath.Join(dir, "s000000003-a2.safetensors")); err != nil {
		t.Fatal(err)
	}
	expect(RID{3, 2})
	if got := w.Ignored(); got != 1 {
		t.Errorf("Ignored() = %d, want 1 (README)", got)
	}
}

func TestWatcherKeepsDrainingWhileConsumerIsSlow(t *testing.T) {
	dir := stagingDir(t)
	w, err := NewWatcher(dir, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out := make(chan Dump)
	go w.Run(ctx, out)

	const n = 500
	for i := 0; i < n; i++ {
		name := RID{Sample: i, Attempt: 1}.FileName()
		if err := os.WriteFile(filepath.Join(dir, name+PartialSuffix), nil, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(filepath.Join(dir, name+PartialSuffix), filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	got := map[int]bool{}
	deadline := time.After(10 * time.Second)
	for len(got) < n {
		select {
		case d := <-out:
			got[d.RID.Sample] = true
		case <-deadline:
			t.Fatalf("reported %d of %d dumps", len(got), n)
		}
	}
}

func TestMeasureCountsBytesAndPartials(t *testing.T) {
	dir := stagingDir(t)
	os.WriteFile(filepath.Join(dir, "s000000001-a1.safetensors"), make([]byte, 1000), 0o644)
	os.WriteFile(filepath.Join(dir, "s000000002-a1.safetensors.partial"), make([]byte, 24), 0o644)
	u, err := Measure(dir)
	if err != nil {
		t.Fatal(err)
	}
	if u.Bytes != 1024 || u.Files != 2 || u.Partials != 1 {
		t.Errorf("Measure = %+v, want 1024 bytes in 2 files, 1 partial", u)
	}
	if u.Free <= 0 || u.Total < u.Free {
		t.Errorf("Measure free/total = %d/%d", u.Free, u.Total)
	}
}

func TestHostileStagingEntriesAreReportedAndNeverOpened(t *testing.T) {
	dir := stagingDir(t)
	secret := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secret, []byte("private"), 0o600); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(dir, "s999999990-a1.safetensors")
	if err := unix.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "s999999996-a1.safetensors")
	if err := os.Symlink(secret, link); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "s999999997-a1.safetensors"), 0o755); err != nil {
		t.Fatal(err)
	}
	w, err := NewWatcher(dir, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	dumps, err := w.Scan()
	if err != nil {
		t.Fatal(err)
	}
	if len(dumps) != 0 {
		t.Errorf("Scan reported %v; a FIFO, a symlink and a directory are not dumps", dumps)
	}
	if got := w.NotRegular(); got != 3 {
		t.Errorf("NotRegular() = %d, want 3", got)
	}

	// A FIFO or a symlink reaching the opener (swapped in after a scan) is refused at
	// once: never blocking, never followed.
	done := make(chan error, 2)
	go func() {
		_, err := OpenDump(fifo)
		done <- err
	}()
	go func() {
		_, err := OpenDump(link)
		done <- err
	}()
	for range 2 {
		select {
		case err := <-done:
			if !errors.Is(err, ErrNotRegular) {
				t.Errorf("OpenDump = %v, want ErrNotRegular", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("OpenDump blocked on a FIFO")
		}
	}
	f, err := OpenDump(secret)
	if err != nil {
		t.Fatalf("OpenDump of a regular file: %v", err)
	}
	f.Close()
}

func TestRemovePartialsDeletesOnlyTheHooksPartials(t *testing.T) {
	dir := stagingDir(t)
	for _, name := range []string{"s000000001-a1.safetensors.partial", "model-weights.bin.partial", "s000000002-a1.safetensors"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	n, err := RemovePartials(dir)
	if err != nil || n != 1 {
		t.Fatalf("RemovePartials = %d, %v; want 1 removed", n, err)
	}
	for name, want := range map[string]bool{"s000000001-a1.safetensors.partial": false, "model-weights.bin.partial": true, "s000000002-a1.safetensors": true} {
		if _, err := os.Lstat(filepath.Join(dir, name)); (err == nil) != want {
			t.Errorf("%s present = %v, want %v", name, err == nil, want)
		}
	}
}

// A staging dir removed under the run (a cleanup of /dev/shm, a remount) leaves the watch
// on a dead inode: Run must end with an error instead of waiting for dumps forever.
func TestWatcherEndsWhenItsStagingDirIsRemoved(t *testing.T) {
	dir := stagingDir(t)
	w, err := NewWatcher(dir, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	done := make(chan error, 1)
	go func() { done <- w.Run(context.Background(), make(chan Dump, 1)) }()
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), dir) {
			t.Fatalf("Run = %v; want an error naming %s", err, dir)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run went on after its staging dir was removed")
	}
}
