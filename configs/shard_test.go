package configs

import (
	"path/filepath"
	"strings"
	"testing"
)

func envOf(kv map[string]string) func(string) string {
	return func(k string) string { return kv[k] }
}

func TestShardSpecsResolveFromTheFlagAndTheScheduler(t *testing.T) {
	slurmFull := map[string]string{"SLURM_ARRAY_TASK_ID": "2", "SLURM_ARRAY_TASK_COUNT": "4", "SLURM_ARRAY_TASK_MIN": "0", "SLURM_ARRAY_TASK_MAX": "3"}
	resubmitted := map[string]string{"SLURM_ARRAY_TASK_ID": "2", "SLURM_ARRAY_TASK_COUNT": "1", "SLURM_ARRAY_TASK_MIN": "2", "SLURM_ARRAY_TASK_MAX": "2"}
	k8s := map[string]string{"JOB_COMPLETION_INDEX": "5"}
	for _, tc := range []struct {
		spec   string
		pinned int
		env    map[string]string
		want   Shard
		errHas string
	}{
		{spec: "3/8", want: Shard{3, 8}},
		{spec: "8/8", errHas: "index must be 0..7"},
		{spec: "3", errHas: "want i/n"},
		{spec: "1/0", errHas: "count after /"},
		{spec: "auto", env: slurmFull, want: Shard{2, 4}},
		{spec: "auto", env: resubmitted, errHas: "not the full 0..n-1 range"},
		{spec: "auto/4", env: resubmitted, want: Shard{2, 4}},
		{spec: "auto", pinned: 4, env: resubmitted, want: Shard{2, 4}},
		{spec: "auto", env: k8s, errHas: "EXTRACT_SHARD_COUNT"},
		{spec: "auto", pinned: 8, env: k8s, want: Shard{5, 8}},
		{spec: "auto/4", env: k8s, errHas: "not below the shard count 4"},
		{spec: "auto", env: nil, errHas: "neither SLURM_ARRAY_TASK_ID"},
	} {
		got, err := ParseShard(tc.spec, tc.pinned, envOf(tc.env))
		if tc.errHas != "" {
			if err == nil || !strings.Contains(err.Error(), tc.errHas) {
				t.Errorf("ParseShard(%q, %d) = %v, %v; want an error with %q", tc.spec, tc.pinned, got, err, tc.errHas)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ParseShard(%q, %d) = %v, %v; want %v", tc.spec, tc.pinned, got, err, tc.want)
		}
	}
}

func TestAShardedConfigKeepsItsStateAndStagingInTheShardsSubdirs(t *testing.T) {
	path := writeConfig(t, minimal)
	t.Setenv("EXTRACT_SHARD_COUNT", "4")
	t.Setenv("EXTRACT_SHARD_INDEX", "1")
	c, err := Load(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Dir(path)
	if c.StateDir != filepath.Join(dir, "out", ".extract", "shard-1-of-4") || c.ShmDir != "/dev/shm/sglang_hs/shard-1-of-4" {
		t.Errorf("state_dir %s, shm_dir %s: want the shard-1-of-4 subdirs", c.StateDir, c.ShmDir)
	}
	if c.JobStateDir() != filepath.Join(dir, "out", ".extract") {
		t.Errorf("JobStateDir = %s", c.JobStateDir())
	}
	// The flag overrides the keys.
	c, err = LoadShard(path, nil, "3/4")
	if err != nil || c.Shard != (Shard{3, 4}) {
		t.Fatalf("LoadShard 3/4 = %v, %v", c, err)
	}
	t.Setenv("EXTRACT_SHARD_INDEX", "4")
	if _, err := Load(path, nil); err == nil || !strings.Contains(err.Error(), "shard.index") {
		t.Errorf("index 4 of 4 loaded: %v", err)
	}
}

func TestShardDirNamesReadBackExactly(t *testing.T) {
	for _, name := range []string{"shard-0-of-1", "shard-7-of-8"} {
		if i, n, ok := ParseShardDirName(name); !ok || ShardDirName(i, n) != name {
			t.Errorf("%s did not read back", name)
		}
	}
	for _, name := range []string{"shard-8-of-8", "shard-01-of-8", "shard-1-of-08", "shard-x-of-2", "index.db", "shard-1-of-"} {
		if _, _, ok := ParseShardDirName(name); ok {
			t.Errorf("%s read as a shard dir", name)
		}
	}
}
