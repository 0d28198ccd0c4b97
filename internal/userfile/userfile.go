// Package userfile opens the files a user names (a dataset, a conversation file) without
// trusting what the path is: a FIFO cannot hang the open, and only a regular file is read.
package userfile

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// ErrNotRegular marks a path that opened as something other than a regular file.
var ErrNotRegular = errors.New("not a regular file")

// OpenRegular opens path for reading with O_NONBLOCK, so a FIFO (or a symlink to one)
// cannot block the open, then requires by fstat of what was opened that it is a regular
// file. A symlink to a regular file is followed: a dataset kept in a managed folder and
// linked is common, and the open file is what is read. (O_NONBLOCK means nothing for a
// regular file's reads.)
func OpenRegular(path string) (*os.File, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, &os.PathError{Op: "stat", Path: path, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		unix.Close(fd)
		return nil, fmt.Errorf("%s is %s, %w", path, Kind(st.Mode), ErrNotRegular)
	}
	return os.NewFile(uintptr(fd), path), nil
}

// Kind names a stat mode's file type for messages.
func Kind(mode uint32) string {
	switch mode & unix.S_IFMT {
	case unix.S_IFIFO:
		return "a FIFO (named pipe)"
	case unix.S_IFDIR:
		return "a directory"
	case unix.S_IFCHR:
		return "a character device"
	case unix.S_IFBLK:
		return "a block device"
	case unix.S_IFSOCK:
		return "a socket"
	}
	return fmt.Sprintf("of type %#o", mode&unix.S_IFMT)
}
