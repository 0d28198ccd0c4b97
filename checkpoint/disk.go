package checkpoint

import (
	"os"

	"github.com/extract-dev/extract/internal/atomicfile"
)

// diskOps are the output disk's calls on the way of a sample's file, one per step a fault
// or a crash can cut: create the temp, write it, fsync it, rename it, fsync the
// directory. outputDisk holds the real ones; a test swaps one step for a fault (ENOSPC,
// EIO) and shows what that step's failure leaves (faults_test.go), with no root and no
// full disk. Closing and removing a temp stay real: they are the cleanup under test.
type diskOps struct {
	create  func(path string) (*os.File, error)
	write   func(f *os.File, p []byte) (int, error)
	sync    func(f *os.File) error
	rename  func(from, to string) error
	syncDir func(dir string) error
}

// outputDisk is what createSample and pendingFile.commit call. Only tests replace it,
// and none of them runs in parallel.
var outputDisk = diskOps{
	create: func(path string) (*os.File, error) {
		return os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	},
	write:   (*os.File).Write,
	sync:    atomicfile.Sync,
	rename:  os.Rename,
	syncDir: atomicfile.SyncDir,
}
