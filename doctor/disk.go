// The dataset, and whether the output disk holds what the run would still write.

package doctor

import (
	"context"
	"fmt"
	"strings"

	"github.com/extract-dev/extract/checkpoint"
	"github.com/extract-dev/extract/dataset"
	"github.com/extract-dev/extract/shm"
)

// loadDataset opens the dataset (unless the caller did) and says how it stands.
func (d *doctor) loadDataset(ctx context.Context) Check {
	d.ds = d.opt.Dataset
	if d.ds == nil {
		if c, done := d.loadConversations(); done { // prepare.go
			return c
		}
		ds, err := dataset.OpenJob(ctx, d.cfg)
		if err != nil {
			fix := "point dataset at the job's JSONL file"
			if strings.Contains(err.Error(), " line ") {
				fix = "fix that line (the sample index is the 0-based line number)"
			}
			return failCheck("dataset", fix, "%v", err)
		}
		d.ds, d.ownDS = ds, true
	}
	return okCheck("dataset", "%d samples, %d tokens, sha256 %.12s… (%s)", d.ds.Len(), d.ds.TotalTokens(nil), d.ds.Fingerprint, d.ds.Path)
}

// remaining lists the samples a run would still send.
func (d *doctor) remaining() []int {
	var out []int
	for i := range d.ds.Len() {
		if d.prog == nil || d.prog.State[i] != checkpoint.StateDone {
			out = append(out, i)
		}
	}
	return out
}

// checkDisk compares free space on the output disk with what the remaining samples
// will write plus disk.reserve: the incident was a disk that filled at half the job.
func (d *doctor) checkDisk(context.Context) []Check {
	const name = "disk"
	reserve := int64(d.cfg.Disk.Reserve)
	existing, err := existingAncestor(d.cfg.OutputDir)
	if err != nil {
		return []Check{failCheck(name, "", "output_dir %s: %v", d.cfg.OutputDir, err)}
	}
	fs, err := shm.StatFS(existing)
	if err != nil {
		return []Check{failCheck(name, "", "%v", err)}
	}
	if d.ds == nil {
		return []Check{warnCheck(name, "fix the dataset first", "%s free at %s; the need is unknown without a readable dataset", fmtSize(fs.Free), existing)}
	}
	if d.running > 0 {
		// The index, and so what is left, is not read while a run holds it.
		return []Check{okCheck(name, "%s free at %s (%s kept in reserve); a run is in progress (pid %d) and pauses at the reserve", fmtSize(fs.Free), existing, fmtSize(reserve), d.running)}
	}
	left := d.remaining()
	if len(left) == 0 {
		return []Check{okCheck(name, "%s free at %s; every sample is done, nothing is left to write", fmtSize(fs.Free), existing)}
	}
	var tokens int64
	text := 0
	for _, s := range left {
		tokens += int64(d.ds.Tokens(s))
		if d.ds.IsText(s) {
			text++
		}
	}
	need := tokens * d.cfg.OutputBytesPerToken()
	msg := fmt.Sprintf("%s free at %s; the %d remaining samples (%d tokens × %d bytes) need %s, plus %s kept in reserve",
		fmtSize(fs.Free), existing, len(left), tokens, d.cfg.OutputBytesPerToken(), fmtSize(need), fmtSize(reserve))
	if fs.Free >= need+reserve {
		return []Check{okCheck(name, "%s", msg)}
	}
	short := need + reserve - fs.Free
	fix := fmt.Sprintf("free %s on that disk, or set output_dir to a disk with room", fmtSize(short))
	if first := d.opt.Job.SampleBytes(d.ds.Tokens(left[0])); fs.Free < reserve+first {
		return []Check{failCheck(name, fix, "%s: not even the next sample (%s) fits above the reserve, so a run would admit nothing", msg, fmtSize(first))}
	}
	switch {
	case text > 0:
		// A text sample's tokens are counted as its bytes, several times too many.
		return []Check{warnCheck(name, fix, "%s (an upper bound: %d text samples are counted by bytes)", msg, text)}
	case d.cfg.Disk.WhenShort == "warn":
		return []Check{warnCheck(name, fix, "%s: the run pauses at the reserve, %s short, until room returns", msg, fmtSize(short))}
	}
	return []Check{failCheck(name, fix+", or set disk.when_short: warn to start anyway and pause at the reserve, "+fmtSize(short)+" short", "%s", msg)}
}
