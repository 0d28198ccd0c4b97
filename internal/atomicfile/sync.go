//go:build !extract_skip_output_fsync

package atomicfile

import "os"

// Sync fsyncs a file's data. The power-cut test builds a twin binary with the build tag
// extract_skip_output_fsync, in which this does nothing, to prove the test notices.
func Sync(f *os.File) error { return f.Sync() }

func syncDir(d *os.File) error { return d.Sync() }
