package configs

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
)

// MaxShards bounds shard.count: far above any cluster's node count, and small enough
// that listing the shard dirs stays cheap.
const MaxShards = 1 << 16

// Shard is this run's part of a job split across nodes: shard Index of Count (Count 0:
// not sharded). Which samples a shard owns is orchestrator.ShardRange's rule. A sharded
// run keeps its own state in state_dir/shard-<i>-of-<n> and stages in
// shm_dir/shard-<i>-of-<n>, so shards never share a lock, an index or a dump; all shards
// write the one output_dir layout.
type Shard struct {
	Index int `mapstructure:"index"`
	Count int `mapstructure:"count"`
}

// Sharded says whether the job is split.
func (s Shard) Sharded() bool { return s.Count > 0 }

// DirName is the shard's subdir of state_dir and shm_dir.
func (s Shard) DirName() string { return ShardDirName(s.Index, s.Count) }

func (s Shard) String() string { return fmt.Sprintf("%d/%d", s.Index, s.Count) }

// ShardDirName is shard i of n's subdir name, shard-<i>-of-<n>.
func ShardDirName(i, n int) string { return fmt.Sprintf("shard-%d-of-%d", i, n) }

// ParseShardDirName reads a ShardDirName back; ok is false for any other name.
func ParseShardDirName(name string) (i, n int, ok bool) {
	rest, found := strings.CutPrefix(name, "shard-")
	if !found {
		return 0, 0, false
	}
	a, b, found := strings.Cut(rest, "-of-")
	if !found {
		return 0, 0, false
	}
	i, err1 := strconv.Atoi(a)
	n, err2 := strconv.Atoi(b)
	if err1 != nil || err2 != nil || n < 1 || n > MaxShards || i < 0 || i >= n || ShardDirName(i, n) != name {
		return 0, 0, false
	}
	return i, n, true
}

// JobStateDir is the job's state_dir, the folder that holds every shard's subdir; for an
// unsharded job it is StateDir itself.
func (c *Config) JobStateDir() string {
	if c.Shard.Sharded() {
		return filepath.Dir(c.StateDir)
	}
	return c.StateDir
}

// resolveShard applies the --shard flag's spec over the shard keys, then points
// state_dir and shm_dir at the shard's subdirs. getenv reads the scheduler's variables.
func (c *Config) resolveShard(spec string, getenv func(string) string) error {
	if spec != "" {
		s, err := ParseShard(spec, c.Shard.Count, getenv)
		if err != nil {
			return err
		}
		c.Shard = s
	}
	s := c.Shard
	if s.Count > 0 && s.Count <= MaxShards && s.Index >= 0 && s.Index < s.Count {
		if c.StateDir != "" {
			c.StateDir = filepath.Join(c.StateDir, s.DirName())
		}
		if c.ShmDir != "" {
			c.ShmDir = filepath.Join(c.ShmDir, s.DirName())
		}
	}
	return nil
}

// ParseShard reads a --shard value: "i/n"; or "auto", the index from the scheduler
// (SLURM_ARRAY_TASK_ID, else Kubernetes' JOB_COMPLETION_INDEX) and the count from
// "auto/n", else shard.count (pinned, e.g. EXTRACT_SHARD_COUNT), else
// SLURM_ARRAY_TASK_COUNT when the array is the full 0..n-1 range.
//
// The index is the task id itself, never its offset from the array's first id, and a
// partial array gives no count: a task resubmitted alone (`sbatch --array=2`) has
// SLURM_ARRAY_TASK_COUNT 1, and reading it would run the wrong shard of the wrong plan.
func ParseShard(spec string, pinnedCount int, getenv func(string) string) (Shard, error) {
	head, countStr, hasCount := strings.Cut(strings.TrimSpace(spec), "/")
	count := 0
	if hasCount {
		n, err := strconv.Atoi(countStr)
		if err != nil || n < 1 || n > MaxShards {
			return Shard{}, fmt.Errorf("--shard %q: the count after / must be 1..%d", spec, MaxShards)
		}
		count = n
	}
	if head != "auto" {
		i, err := strconv.Atoi(head)
		if err != nil || !hasCount {
			return Shard{}, fmt.Errorf("--shard %q: want i/n (e.g. 2/8), auto or auto/n", spec)
		}
		if i < 0 || i >= count {
			return Shard{}, fmt.Errorf("--shard %q: index must be 0..%d", spec, count-1)
		}
		return Shard{Index: i, Count: count}, nil
	}
	idxVar := "SLURM_ARRAY_TASK_ID"
	idxStr := getenv(idxVar)
	if idxStr == "" {
		idxVar = "JOB_COMPLETION_INDEX"
		idxStr = getenv(idxVar)
	}
	if idxStr == "" {
		return Shard{}, fmt.Errorf("--shard auto: neither SLURM_ARRAY_TASK_ID (a Slurm job array) nor JOB_COMPLETION_INDEX (a Kubernetes Indexed Job) is set; give --shard i/n")
	}
	i, err := strconv.Atoi(idxStr)
	if err != nil || i < 0 {
		return Shard{}, fmt.Errorf("--shard auto: %s=%q is not a task index", idxVar, idxStr)
	}
	if count == 0 {
		count = pinnedCount
	}
	if count == 0 && idxVar == "SLURM_ARRAY_TASK_ID" {
		n, errN := strconv.Atoi(getenv("SLURM_ARRAY_TASK_COUNT"))
		lo, errLo := strconv.Atoi(getenv("SLURM_ARRAY_TASK_MIN"))
		hi, errHi := strconv.Atoi(getenv("SLURM_ARRAY_TASK_MAX"))
		if errN != nil || errLo != nil || errHi != nil || lo != 0 || hi != n-1 {
			return Shard{}, fmt.Errorf("--shard auto: this array (tasks %s..%s, %s of them) is not the full 0..n-1 range, so it does not say the shard count (a resubmitted task is like this): give it with --shard auto/n or %s",
				getenv("SLURM_ARRAY_TASK_MIN"), getenv("SLURM_ARRAY_TASK_MAX"), getenv("SLURM_ARRAY_TASK_COUNT"), EnvName("shard.count"))
		}
		count = n
	}
	if count == 0 {
		return Shard{}, fmt.Errorf("--shard auto: %s gives the index but nothing gives the count: set %s to the Job's completions, or give --shard auto/n", idxVar, EnvName("shard.count"))
	}
	if count > MaxShards {
		return Shard{}, fmt.Errorf("--shard auto: count %d is above %d", count, MaxShards)
	}
	if i >= count {
		return Shard{}, fmt.Errorf("--shard auto: %s=%d is not below the shard count %d (task ids must run 0..n-1)", idxVar, i, count)
	}
	return Shard{Index: i, Count: count}, nil
}
