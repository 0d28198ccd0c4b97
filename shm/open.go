package shm

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// ErrNotRegular marks a staging entry that is not a regular file: a FIFO, a symlink, a
// directory or a device. The staging dir is world-writable (invariant 8), so such an
// entry is reported and never opened, followed or read.
var ErrNotRegular = errors.New("not a regular file")

// ErrStagingGone means the staging dir itself was removed or renamed while watched.
var ErrStagingGone = errors.New("staging dir gone")

// OpenDump opens a staging entry for reading without trusting it: lstat first, then
// open with O_NOFOLLOW|O_NONBLOCK (a FIFO swapped in between cannot block us, a symlink
// cannot redirect us), then fstat to check what was really opened. Every read of the
// file must stay within the size that fstat reports.
func OpenDump(path string) (*os.File, error) {
	fi, err := os.Lstat(path)
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("staging entry %s is %s: %w", path, describeMode(fi.Mode()), ErrNotRegular)
	}
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ELOOP) {
		return nil, fmt.Errorf("staging entry %s became a symlink: %w", path, ErrNotRegular)
	}
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		_ = unix.Close(fd)
		return nil, &os.PathError{Op: "fstat", Path: path, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		_ = unix.Close(fd)
		return nil, fmt.Errorf("staging entry %s was swapped for a non-regular file: %w", path, ErrNotRegular)
	}
	return os.NewFile(uintptr(fd), path), nil
}

// describeMode names a file type for messages.
func describeMode(m fs.FileMode) string {
	switch {
	case m&fs.ModeSymlink != 0:
		return "a symlink"
	case m&fs.ModeNamedPipe != 0:
		return "a FIFO"
	case m.IsDir():
		return "a directory"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeDevice != 0:
		return "a device"
	}
	return "not a regular file (" + m.Type().String() + ")"
}

// RemovePartials deletes the half-written dumps of a server that is no longer running: only
// regular files named <rid>.safetensors.partial, the one name the hook writes. Anything
// else that ends in .partial belongs to someone else and stays.
func RemovePartials(dir string) (int, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return 0, fmt.Errorf("scan staging dir %s: %w", dir, err)
	}
	n := 0
	for _, e := range entries {
		if !e.Type().IsRegular() || !IsPartialName(e.Name()) {
			continue
		}
		if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return n, fmt.Errorf("remove partial dump: %w", err)
		}
		n++
	}
	return n, nil
}

// IsPartialName says whether name is a dump being written: <rid>.safetensors.partial.
func IsPartialName(name string) bool {
	if len(name) <= len(PartialSuffix) || name[len(name)-len(PartialSuffix):] != PartialSuffix {
		return false
	}
	_, ok := ParseDumpName(name[:len(name)-len(PartialSuffix)])
	return ok
}

// RemoveDumps deletes the complete dumps in the staging dir (regular files under a dump
// name, the names the hook writes), for --fresh: the old job's dumps must not be adopted.
// A missing dir has none.
func RemoveDumps(dir string) (int, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("scan staging dir %s: %w", dir, err)
	}
	n := 0
	for _, e := range entries {
		if _, ok := ParseDumpName(e.Name()); !ok || !e.Type().IsRegular() {
			continue
		}
		if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return n, fmt.Errorf("remove old dump: %w", err)
		}
		n++
	}
	return n, nil
}
