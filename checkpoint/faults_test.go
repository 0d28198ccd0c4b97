package checkpoint

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
)

// The steps of an output's way to disk, in order (diskOps).
const (
	stepCreate  = "create temp"
	stepWrite   = "write"
	stepSync    = "fsync"
	stepRename  = "rename"
	stepSyncDir = "dir fsync"
)

// injectFault makes one step of outputDisk fail with errno, as a full or failing disk
// would, until the returned clear is called; the test's end restores the real disk. The
// fault is the bare errno, so any path in the error the mover returns is its own. A
// write fault lets the first write (the header) through and cuts the next one in half,
// so that something is on disk when it fails.
func injectFault(t *testing.T, step string, errno syscall.Errno) (clear func()) {
	t.Helper()
	real := outputDisk
	t.Cleanup(func() { outputDisk = real })
	var on atomic.Bool
	on.Store(true)
	ops := real
	switch step {
	case stepCreate:
		ops.create = func(path string) (*os.File, error) {
			if on.Load() {
				return nil, errno
			}
			return real.create(path)
		}
	case stepWrite:
		var writes atomic.Int64
		ops.write = func(f *os.File, p []byte) (int, error) {
			if on.Load() && writes.Add(1) > 1 {
				n, _ := real.write(f, p[:len(p)/2])
				return n, errno
			}
			return real.write(f, p)
		}
	case stepSync:
		ops.sync = func(f *os.File) error {
			if on.Load() {
				return errno
			}
			return real.sync(f)
		}
	case stepRename:
		ops.rename = func(from, to string) error {
			if on.Load() {
				return errno
			}
			return real.rename(from, to)
		}
	case stepSyncDir:
		ops.syncDir = func(dir string) error {
			if on.Load() {
				return errno
			}
			return real.syncDir(dir)
		}
	default:
		t.Fatalf("no step %q", step)
	}
	outputDisk = ops
	return func() { on.Store(false) }
}

// moveAndCommit is a move as the orchestrator makes it (orchestrator/move.go): Stage,
// then CommitTo, which commits the index only once the output is durable.
func moveAndCommit(m *Mover, ix *Index, dumpPath string, want Expect) (Moved, error) {
	src, err := os.Open(dumpPath)
	if err != nil {
		return Moved{}, err
	}
	defer src.Close()
	st, err := m.Stage(context.Background(), src, dumpPath, want)
	if err != nil {
		return Moved{}, err
	}
	return st.CommitTo(ix, Record{Attempt: 1, RID: want.RID})
}

// A fault at any step between the dump and the index (ENOSPC or EIO at the temp's
// create, a write, its fsync, the rename, the directory's fsync) is the disk's: the
// error names the output's file, no final name holds a torn file, no temp is left, the
// sample is not committed and its dump stays in staging (design.md, invariants 2 and 5),
// and the same move succeeds once the disk is well again. A dir fsync that fails after
// the rename cuts exactly between rename and commit (design.md's crash row "rename and
// commit"): the file under its final name is complete, and the retry writes the same
// bytes and commits.
func TestAFaultAtEachStepOfAMoveLeavesNothingTornOrCommittedAndTheRetrySucceeds(t *testing.T) {
	const sample = 3
	want := expectFor(sample, 64)
	want.HiddenSize = 64
	// The reference: the same dump moved on a disk without faults.
	refDump := writeDump(t, t.TempDir(), dumpSpec{sample: sample, T: 64, H: 64})
	ref, err := (&Mover{OutputDir: t.TempDir(), BufferSize: 1024}).moveFile(context.Background(), refDump, want)
	if err != nil {
		t.Fatal(err)
	}
	refBytes, err := os.ReadFile(ref.Path)
	if err != nil {
		t.Fatal(err)
	}

	for _, step := range []string{stepCreate, stepWrite, stepSync, stepRename, stepSyncDir} {
		for name, errno := range map[string]syscall.Errno{"ENOSPC": syscall.ENOSPC, "EIO": syscall.EIO} {
			t.Run(step+"/"+name, func(t *testing.T) {
				out := t.TempDir()
				dumpPath := writeDump(t, t.TempDir(), dumpSpec{sample: sample, T: 64, H: 64})
				ix := newIndex(t, 10)
				if err := ix.RecordAttempt(sample, 1, ""); err != nil {
					t.Fatal(err)
				}
				m := &Mover{OutputDir: out, BufferSize: 1024}
				final := m.layout().Path(sample)
				tmp := tempPath(final)

				clear := injectFault(t, step, errno)
				_, err := moveAndCommit(m, ix, dumpPath, want)
				if err == nil {
					t.Fatalf("a move with %v at %s succeeded", errno, step)
				}
				if !errors.Is(err, errno) {
					t.Errorf("error %q does not wrap %v", err, errno)
				}
				if _, bad := errors.AsType[*DumpError](err); bad {
					t.Errorf("%v at %s is the disk's fault, not the dump's (a DumpError quarantines the dump): %v", errno, step, err)
				}
				if _, blocked := errors.AsType[*BlockedError](err); blocked {
					t.Errorf("%v at %s is the disk's, not something in the way (a BlockedError fails the sample): %v", errno, step, err)
				}
				named := tmp
				if step == stepSyncDir {
					named = final // the temp is gone; the file whose entry is not durable is
				}
				if !strings.Contains(err.Error(), named) {
					t.Errorf("error %q does not name %s", err, named)
				}

				got, err := os.ReadFile(final)
				switch {
				case step == stepSyncDir && err != nil:
					t.Errorf("the rename happened before the dir fsync failed, yet %s: %v", final, err)
				case step == stepSyncDir && !bytes.Equal(got, refBytes):
					t.Errorf("%s holds %d bytes that differ from a whole output's %d", final, len(got), len(refBytes))
				case step != stepSyncDir && !errors.Is(err, os.ErrNotExist):
					t.Errorf("%v at %s left %s under its final name (%d bytes, err %v)", errno, step, final, len(got), err)
				}
				if files := filesUnder(t, out); len(files) > 1 || len(files) == 1 && files[0] != final {
					t.Errorf("%v at %s left %v (a temp must be removed)", errno, step, files)
				}
				if r := mustGet(t, ix, sample); r.State == StateDone {
					t.Errorf("%v at %s, yet the index says sample %d is done", errno, step, sample)
				}
				if c := mustCounters(t, ix); c.Done != 0 {
					t.Errorf("counters say %d done after a failed move", c.Done)
				}
				if _, err := os.Stat(dumpPath); err != nil {
					t.Errorf("the dump must stay in staging for the retry: %v", err)
				}

				clear()
				moved, err := moveAndCommit(m, ix, dumpPath, want)
				if err != nil {
					t.Fatalf("the retry after the fault cleared: %v", err)
				}
				if got, err := os.ReadFile(final); err != nil || !bytes.Equal(got, refBytes) {
					t.Errorf("after the retry %s differs from a whole output (err %v)", final, err)
				}
				if files := filesUnder(t, out); len(files) != 1 {
					t.Errorf("after the retry the output holds %v, want %s alone", files, final)
				}
				r := mustGet(t, ix, sample)
				if r.State != StateDone || r.CRC32C != moved.CRC32C || r.CRC32C != ref.CRC32C || r.Bytes != ref.Bytes {
					t.Errorf("after the retry the index holds %+v, want done with crc %08x and %d bytes", r, ref.CRC32C, ref.Bytes)
				}
			})
		}
	}
}

// A crash between the temp's write and its rename (design.md's crash row "temp write and
// rename") leaves the temp under its name, unsynced, maybe torn or longer than the file
// the next move writes; the next run's move of the sample truncates and overwrites it,
// renames it, and leaves no stray.
func TestACrashBetweenTempWriteAndRenameLeavesATempTheNextMoveOverwrites(t *testing.T) {
	const sample = 5
	want := expectFor(sample, 64)
	want.HiddenSize = 64
	dumpPath := writeDump(t, t.TempDir(), dumpSpec{sample: sample, T: 64, H: 64})
	out := t.TempDir()

	src, err := os.Open(dumpPath)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	st, err := (&Mover{OutputDir: out}).Stage(context.Background(), src, dumpPath, want)
	if err != nil {
		t.Fatal(err)
	}
	// The crash: the process dies with its temp file open and nothing removes it. What
	// reached the disk may be more than one output's length (an earlier, longer write).
	tmp, final := st.file.tmp, st.moved.Path
	if _, err := st.file.f.WriteAt([]byte("garbage past the end of any output"), st.moved.Bytes+4096); err != nil {
		t.Fatal(err)
	}
	_ = st.file.f.Close()
	if _, err := os.Stat(final); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("before the rename %s exists (err %v)", final, err)
	}

	ix := newIndex(t, 10)
	next := &Mover{OutputDir: out}
	moved, err := moveAndCommit(next, ix, dumpPath, want)
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(final)
	if err != nil {
		t.Fatal(err)
	}
	if int64(len(got)) != moved.Bytes {
		t.Fatalf("%s is %d bytes, the move wrote %d: the leftover temp was not truncated", final, len(got), moved.Bytes)
	}
	if _, err := readOutput(context.Background(), final, true, nil, make([]byte, 1<<16)); err != nil {
		t.Fatalf("the output over the leftover temp does not verify: %v", err)
	}
	if _, err := os.Stat(tmp); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the temp %s is still there after the next move (err %v)", filepath.Base(tmp), err)
	}
	if r := mustGet(t, ix, sample); r.State != StateDone {
		t.Errorf("sample %d is %v after the next move, want done", sample, r.State)
	}
}
