package checkpoint

import (
	"os"

	"golang.org/x/sys/unix"
)

// writebackEvery is how many bytes a writer lets pile up in the page cache before it
// asks the kernel to start writing them out.
const writebackEvery = 8 << 20

// pageSize rounds the ranges handed to writeback; 4 KiB divides every page size Linux uses.
const pageSize = 4 << 10

// writeback is the output file as the format writers see it. Every writebackEvery bytes
// it starts the kernel's writeback of what was written (sync_file_range, no wait): the
// disk then works while the mover copies, and the fsync at commit finds most of a large
// file written already, as `cp` followed by `sync` has the disk write behind the copy.
// It is a hint: durability is still the fsync's alone.
type writeback struct {
	f                *os.File
	fd               int
	written, started int64 // bytes written; bytes before started are handed to writeback
}

func newWriteback(f *os.File) *writeback { return &writeback{f: f, fd: int(f.Fd())} }

func (w *writeback) Write(p []byte) (int, error) {
	n, err := outputDisk.write(w.f, p)
	w.written += int64(n)
	if w.written-w.started >= writebackEvery {
		// Whole pages only: the page the next Write continues would be written twice.
		end := w.written &^ (pageSize - 1)
		_ = unix.SyncFileRange(w.fd, w.started, end-w.started, unix.SYNC_FILE_RANGE_WRITE) // a hint; the fsync decides
		w.started = end
	}
	return n, err
}

func (w *writeback) WriteAt(p []byte, off int64) (int, error) { return w.f.WriteAt(p, off) }
