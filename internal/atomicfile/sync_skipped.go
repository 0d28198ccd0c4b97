//go:build extract_skip_output_fsync

package atomicfile

import "os"

// Sync is a deliberate fault: this build never fsyncs file data, so the power-cut test
// must see samples marked done whose files did not survive.
func Sync(f *os.File) error { return nil }

func syncDir(d *os.File) error { return d.Sync() }
