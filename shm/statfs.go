package shm

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// FS describes the filesystem under a path.
type FS struct {
	Free  int64 // available to an unprivileged writer
	Total int64
	Tmpfs bool
}

// StatFS reads free and total bytes of the filesystem holding path.
func StatFS(path string) (FS, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return FS{}, fmt.Errorf("statfs %s: %w", path, err)
	}
	bs := int64(st.Bsize)
	return FS{Free: int64(st.Bavail) * bs, Total: int64(st.Blocks) * bs, Tmpfs: st.Type == unix.TMPFS_MAGIC}, nil
}
