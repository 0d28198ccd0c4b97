package checkpoint

import (
	"context"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/extract-dev/extract/internal/safetensors"
)

// moveFile opens path the plain way and hands it to Move, for tests whose dump is an
// ordinary file; the orchestrator opens staging files with lstat and O_NOFOLLOW.
func (m *Mover) moveFile(ctx context.Context, path string, want Expect) (Moved, error) {
	f, err := os.Open(path)
	if err != nil {
		return Moved{}, err
	}
	defer f.Close()
	return m.Move(ctx, f, path, want)
}

func TestMoveRejectsADumpOfAnotherJobsLayersModelOrHiddenSize(t *testing.T) {
	for _, tc := range []struct {
		name   string
		dump   dumpSpec
		want   func(Expect) Expect
		reason string
	}{
		{name: "other layer set", dump: dumpSpec{meta: map[string]string{"layers": "3,31,59"}}, reason: `layers "3,31,59"`},
		{name: "layers in another order", dump: dumpSpec{meta: map[string]string{"layers": "30,2,58"}}, reason: "layers"},
		{name: "other model", dump: dumpSpec{meta: map[string]string{"model": "/models/DeepSeek-V3"}}, reason: "model"},
		{name: "no model when the job names one", dump: dumpSpec{meta: map[string]string{"model": ""}}, reason: "model"},
		{name: "hidden size of another model", dump: dumpSpec{H: 16}, want: func(e Expect) Expect { e.InputIDs = nil; return e }, reason: "hidden size 16"},
		{name: "protocol 0", dump: dumpSpec{meta: map[string]string{"protocol": "0"}}, reason: "protocol"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.dump.sample = 7
			path := writeDump(t, t.TempDir(), tc.dump)
			want := expectFor(7, 5)
			if tc.want != nil {
				want = tc.want(want)
			}
			out := t.TempDir()
			_, err := (&Mover{OutputDir: out}).moveFile(context.Background(), path, want)
			de, ok := errors.AsType[*DumpError](err)
			if !ok || !strings.Contains(de.Reason, tc.reason) {
				t.Fatalf("Move = %v, want a *DumpError saying %q", err, tc.reason)
			}
			if files := filesUnder(t, out); len(files) != 0 {
				t.Fatalf("a dump of another job left %v", files)
			}
		})
	}
}

func TestMoveAcceptsAnyModelWhenTheJobNamesNone(t *testing.T) {
	path := writeDump(t, t.TempDir(), dumpSpec{sample: 7, meta: map[string]string{"model": "/models/whatever"}})
	want := expectFor(7, 5)
	want.Model = ""
	moved, err := (&Mover{OutputDir: t.TempDir()}).moveFile(context.Background(), path, want)
	if err != nil || moved.Model != "/models/whatever" {
		t.Fatalf("Move = %+v, %v", moved, err)
	}
}

func TestMoveRefusesAnExpectWithoutHiddenSizeOrLayersAsTheCallersBug(t *testing.T) {
	path := writeDump(t, t.TempDir(), dumpSpec{sample: 7})
	for name, mangle := range map[string]func(*Expect){
		"no hidden size": func(e *Expect) { e.HiddenSize = 0 },
		"no layers":      func(e *Expect) { e.Layers = "" },
		"bad layers":     func(e *Expect) { e.Layers = "2,30" },
	} {
		t.Run(name, func(t *testing.T) {
			want := expectFor(7, 5)
			mangle(&want)
			_, err := (&Mover{OutputDir: t.TempDir()}).moveFile(context.Background(), path, want)
			if err == nil {
				t.Fatal("Move accepted an incomplete Expect")
			}
			if _, bad := errors.AsType[*DumpError](err); bad {
				t.Fatalf("an incomplete Expect is not the dump's fault: %v", err)
			}
		})
	}
}

func TestMoveWritesTheConfigFingerprintIntoTheOutput(t *testing.T) {
	path := writeDump(t, t.TempDir(), dumpSpec{sample: 7})
	want := expectFor(7, 5)
	want.ConfigFingerprint = "cfg-abc"
	moved, err := (&Mover{OutputDir: t.TempDir()}).moveFile(context.Background(), path, want)
	if err != nil {
		t.Fatal(err)
	}
	info, err := ReadOutput(moved.Path, true)
	if err != nil {
		t.Fatal(err)
	}
	if info.ConfigFingerprint != "cfg-abc" || info.Layers != "2,30,58" || info.HiddenSize != 8 {
		t.Fatalf("ReadOutput = %+v, want config_fingerprint cfg-abc, layers 2,30,58, hidden 8", info)
	}
}

func TestMoveReadsTheHandedFileAndNeverOpensThePath(t *testing.T) {
	dir := t.TempDir()
	path := writeDump(t, dir, dumpSpec{sample: 7})
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// Whatever now sits at the path (here a FIFO, which would block an open) is not
	// what the caller checked and opened; the mover must read f alone. f's offset is
	// also moved, so the header must be read from offset 0, not from where f stands.
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(path, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Seek(100, 0); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	var moved Moved
	go func() {
		var err error
		moved, err = (&Mover{OutputDir: t.TempDir()}).Move(context.Background(), f, path, expectFor(7, 5))
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Move blocked: it opened the path instead of reading the handed file")
	}
	if _, err := ReadOutput(moved.Path, true); err != nil {
		t.Fatal(err)
	}
}

func TestMoveRejectsAHandedFileThatIsNotRegular(t *testing.T) {
	path := filepath.Join(t.TempDir(), ridOf(7, 1)+".safetensors")
	if err := syscall.Mkfifo(path, 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOFOLLOW, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	_, err = (&Mover{OutputDir: t.TempDir()}).Move(context.Background(), f, path, expectFor(7, 5))
	if de, ok := errors.AsType[*DumpError](err); !ok || !strings.Contains(de.Reason, "not a regular file") {
		t.Fatalf("Move of a FIFO = %v, want a *DumpError saying not a regular file", err)
	}
}

// A 2,440-byte-class dump whose T = 2^61+305 makes every tensor's byte size wrap to
// what the offsets hold; the mover once wrote 971 MB of loss mask from it.
func TestMoveRejectsADumpWhoseTokenCountOverflowsAndWritesNothing(t *testing.T) {
	const T = 1<<61 + 305
	hdr := `{"aux_hidden_state":{"dtype":"BF16","shape":[2305843009213694257,24],"data_offsets":[0,14640]},` +
		`"hidden_state":{"dtype":"BF16","shape":[2305843009213694257,8],"data_offsets":[14640,19520]},` +
		`"input_ids":{"dtype":"I64","shape":[2305843009213694257],"data_offsets":[19520,21960]},` +
		`"__metadata__":{"rid":"s000000007-a1","protocol":"1","layers":"2,30,58","model":"kimi-k2.5","hook_version":"0.3.1"}}`
	for len(hdr)%8 != 0 {
		hdr += " "
	}
	file := binary.LittleEndian.AppendUint64(nil, uint64(len(hdr)))
	file = append(file, hdr...)
	file = append(file, make([]byte, 21960)...)
	path := filepath.Join(t.TempDir(), ridOf(7, 1)+".safetensors")
	if err := os.WriteFile(path, file, 0o600); err != nil {
		t.Fatal(err)
	}
	want := expectFor(7, 5)
	want.InputIDs = nil // a text sample: nothing else bounds T
	out := t.TempDir()
	_, err := (&Mover{OutputDir: out}).moveFile(context.Background(), path, want)
	if _, ok := errors.AsType[*DumpError](err); !ok {
		t.Fatalf("Move of T=%d = %v, want a *DumpError", uint64(T), err)
	}
	if files := filesUnder(t, out); len(files) != 0 {
		t.Fatalf("left %v", files)
	}
	_ = safetensors.BF16
}
