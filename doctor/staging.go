// The staging dirs in shared memory: who owns them, and what a crashed run left there.

package doctor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/extract-dev/extract/checkpoint"
	"github.com/extract-dev/extract/configs"
	"github.com/extract-dev/extract/shm"
)

// StagingOwner is who may write the staging dirs: us, and the members of shm_group.
func StagingOwner(cfg *configs.Config) (shm.Owner, error) {
	gid, err := shm.LookupGroup(cfg.ShmGroup)
	if err != nil {
		return shm.Owner{}, fmt.Errorf("%w: %w", configs.ErrInvalid, err)
	}
	return shm.Owner{UID: os.Geteuid(), Group: gid}, nil
}

// checkStaging checks the staging dir: only we (and shm_group) may write it and every
// replica's subdir, a tmpfs, room for its budget and for the largest remaining dump, and
// what a crashed run left there.
func (d *doctor) checkStaging(context.Context) []Check {
	const name = "staging"
	dir := d.cfg.ShmDir
	owner, err := StagingOwner(d.cfg)
	if err != nil {
		return []Check{failCheck(name, "set shm_group to a group that exists here (getent group), or unset it", "%v", err)}
	}
	for _, sd := range d.cfg.StagingDirs() {
		var unsafe *shm.UnsafeDirError
		if err := shm.CheckDir(sd, owner); errors.As(err, &unsafe) {
			return []Check{failCheck(name, unsafe.Fix, "%s: a dump planted or rewritten there would be adopted as a sample's output", unsafe.Problem)}
		}
	}
	existing, err := existingAncestor(dir)
	if err != nil {
		return []Check{failCheck(name, "set shm_dir to a folder on /dev/shm", "shm_dir %s: %v", dir, err)}
	}
	fs, err := shm.StatFS(existing)
	if err != nil {
		return []Check{failCheck(name, "", "%v", err)}
	}
	budget := int64(d.cfg.ShmBudget)
	if budget == 0 {
		budget = fs.Total / 2
	}
	lo := d.leftovers(dir)
	// What the run reclaims before it needs the room: dumps it moves or removes.
	room := fs.Free + lo.completeBytes
	var parts []string
	if existing != dir {
		parts = append(parts, fmt.Sprintf("%s does not exist yet (created at launch)", dir))
	} else {
		parts = append(parts, dir)
	}
	parts = append(parts, fmt.Sprintf("%s free of %s, budget %s", fmtSize(fs.Free), fmtSize(fs.Total), fmtSize(budget)))
	if lo.complete+lo.partial+lo.other > 0 {
		parts = append(parts, lo.String())
	}
	reason := strings.Join(parts, "; ")
	if d.ds != nil && d.running == 0 {
		largest, sample := int64(0), -1
		for _, s := range d.remaining() {
			if b := d.opt.Job.SampleBytes(d.ds.Tokens(s)); b > largest {
				largest, sample = b, s
			}
		}
		if sample >= 0 && largest > room {
			return []Check{failCheck(name, "free space on that tmpfs, grow it (mount -o remount,size=…), or drop the sample from the dataset",
				"%s; the largest remaining sample (%d, %d tokens) makes a %s dump, more than the %s the staging filesystem can offer", reason, sample, d.ds.Tokens(sample), fmtSize(largest), fmtSize(room))}
		}
	}
	switch {
	case !fs.Tmpfs:
		return []Check{warnCheck(name, "set shm_dir to a folder on /dev/shm", "%s; not on tmpfs: every dump is written to a disk before it is copied", reason)}
	case room < budget:
		return []Check{warnCheck(name, "free space on that tmpfs or lower shm_budget; admission keeps fewer samples in flight meanwhile",
			"%s; only %s of the budget is available", reason, fmtSize(room))}
	}
	return []Check{okCheck(name, "%s", reason)}
}

type stagingLeftovers struct {
	complete, adopt, stale, partial, other int
	completeBytes, partialBytes            int64
	known                                  bool // adopt and stale are known (the index was read)
}

func (l stagingLeftovers) String() string {
	var s []string
	if l.complete > 0 {
		c := fmt.Sprintf("%d complete dump(s), %s", l.complete, fmtSize(l.completeBytes))
		if l.known {
			c += fmt.Sprintf(": %d to adopt, %d stale (removed by the run)", l.adopt, l.stale)
		} else {
			c += ": adopted when they are their sample's current attempt"
		}
		s = append(s, c)
	}
	if l.partial > 0 {
		s = append(s, fmt.Sprintf("%d partial dump(s), %s, discarded when the run launches a fresh server", l.partial, fmtSize(l.partialBytes)))
	}
	if l.other > 0 {
		s = append(s, fmt.Sprintf("%d other file(s), ignored", l.other))
	}
	return "leftovers: " + strings.Join(s, "; ")
}

// leftovers counts what the staging dir holds: complete dumps a run adopts (the current
// attempt of a sample not done) or removes, partial ones it discards, and other files.
func (d *doctor) leftovers(dir string) stagingLeftovers {
	var lo stagingLeftovers
	entries, err := os.ReadDir(dir)
	if err != nil {
		return lo
	}
	lo.known = d.prog != nil
	for _, e := range entries {
		info, err := e.Info()
		if err != nil || !info.Mode().IsRegular() {
			continue
		}
		name := e.Name()
		if rid, isDump := shm.ParseDumpName(name); isDump {
			lo.complete++
			lo.completeBytes += info.Size()
			if lo.known {
				if rid.Sample < len(d.prog.State) && d.prog.State[rid.Sample] != checkpoint.StateDone && int(d.prog.Attempt[rid.Sample]) == rid.Attempt {
					lo.adopt++
				} else {
					lo.stale++
				}
			}
			continue
		}
		switch {
		case strings.HasSuffix(name, shm.PartialSuffix):
			lo.partial++
			lo.partialBytes += info.Size()
		case strings.HasPrefix(name, ".hook-"):
			// The hook's marker: part of a server, not a leftover.
		default:
			lo.other++
		}
	}
	return lo
}
