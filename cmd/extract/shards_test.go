package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/extract-dev/extract/checkpoint"
)

// jobStatus is the part of `status --all --json` the shard tests read.
type jobStatus struct {
	State    string `json:"state"`
	Shards   int    `json:"shards"`
	Total    int    `json:"total"`
	Done     int    `json:"done"`
	Failed   int    `json:"failed"`
	Pending  int    `json:"pending"`
	Dead     []int  `json:"dead"`
	PerShard []struct {
		Shard int    `json:"shard"`
		State string `json:"state"`
		First int    `json:"first"`
		End   int    `json:"end"`
		Total int    `json:"total"`
		Done  int    `json:"done"`
	} `json:"per_shard"`
}

func (j *job) statusAll() jobStatus {
	j.t.Helper()
	r := j.run("status", "--all", "--json")
	var js jobStatus
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &js) != nil {
		j.t.Fatalf("status --all: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	return js
}

// shardEnv gives shard i its own simulator port: shards sharing a node (as here, and as
// Slurm packs small tasks) must not share a server.
func (j *job) shardEnv(t *testing.T) []string {
	return append(append([]string{}, j.env...), "EXTRACT_SERVER_PORT="+strconv.Itoa(freePort(t)))
}

// cleanShardStaging removes the shards' staging subdirs once they are empty, so that
// check() sees the staging dir as a run leaves it; a non-empty one is an error.
func (j *job) cleanShardStaging(n int) {
	for i := range n {
		dir := filepath.Join(j.shmDir, fmt.Sprintf("shard-%d-of-%d", i, n))
		if err := os.Remove(dir); err != nil && !os.IsNotExist(err) {
			j.t.Errorf("shard staging dir %s: %v", dir, err)
		}
	}
}

func (j *job) stopShardServers(n int) {
	for i := range n {
		stopRecordedServer(filepath.Join(j.state, fmt.Sprintf("shard-%d-of-%d", i, n)))
	}
}

func TestThreeShardsRunTogetherAndAddUpToTheDatasetExactlyOnce(t *testing.T) {
	const n, samples = 3, 90
	j := newJob(t, samples, 0)
	t.Cleanup(func() { j.stopShardServers(n) })
	var wg sync.WaitGroup
	results := make([]result, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cmd := j.command("run", "--resume", "--shard", fmt.Sprintf("%d/%d", i, n))
			cmd.Env = j.shardEnv(t)
			out, err := cmd.CombinedOutput()
			results[i] = result{code: cmd.ProcessState.ExitCode(), stderr: string(out)}
			_ = err
		}()
	}
	wg.Wait()
	for i, r := range results {
		if r.code != 0 {
			t.Fatalf("shard %d/%d: exit %d\n%s", i, n, r.code, r.stderr)
		}
	}
	js := j.statusAll()
	if js.State != "complete" || js.Shards != n || js.Total != samples || js.Done != samples || js.Pending != 0 || len(js.Dead) != 0 {
		t.Fatalf("status --all = %+v; want complete, %d of %d done across %d shards", js, samples, samples, n)
	}
	for i, r := range js.PerShard {
		if r.First != i*samples/n || r.End != (i+1)*samples/n || r.Done != r.End-r.First {
			t.Errorf("shard %d row = %+v; want [%d, %d) done", i, r, i*samples/n, (i+1)*samples/n)
		}
	}
	if r := j.run("verify", "--all"); r.code != 0 || !strings.Contains(r.stdout, "exactly once") {
		t.Fatalf("verify --all: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := j.run("verify", "--all", "--deep"); r.code != 0 {
		t.Fatalf("verify --all --deep: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	j.cleanShardStaging(n)
	if lost, corrupt, extra := j.check(); lost+corrupt+extra > 0 {
		t.Fatalf("lost %d, corrupt %d, extra %d", lost, corrupt, extra)
	}

	// Another split over this one would cut across its ranges.
	r := j.run("run", "--resume", "--shard", "0/4")
	if r.code != 2 || !strings.Contains(r.stderr, "plan of 3 shards") || !strings.Contains(r.stderr, "--fresh --shard i/4") {
		t.Fatalf("run --shard 0/4 over a 3-shard plan: exit %d, want 2 saying how to re-plan\n%s", r.code, r.stderr)
	}
	if r := j.run("run", "--resume"); r.code != 2 || !strings.Contains(r.stderr, "plan of 3 shards") {
		t.Fatalf("an unsharded run over a 3-shard plan: exit %d, want 2\n%s", r.code, r.stderr)
	}

	// A lost file is found, named with its shard, and the job is no longer whole.
	if err := os.Remove(checkpoint.OutputPath(j.out, 45)); err != nil {
		t.Fatal(err)
	}
	r = j.run("verify", "--all")
	if r.code != 1 || !strings.Contains(r.stdout, "sample 45 (shard 1/3): file missing") {
		t.Fatalf("verify --all with sample 45's file gone: exit %d, want 1 naming it\n%s%s", r.code, r.stdout, r.stderr)
	}
	// Its advice is true: the shard's repair sends sample 45 back to pending and adopts
	// none of the other shards' files, and the shard's run redoes it.
	if !strings.Contains(r.stderr, "`extract verify --repair --shard 1/3`, then `extract run --resume --shard 1/3`") {
		t.Fatalf("verify --all does not name shard 1's repair:\n%s", r.stderr)
	}
	r = j.mustRun("verify", "--repair", "--shard", "1/3")
	if !strings.Contains(r.stdout, "checked 30: 29 ok, 1 missing, 0 corrupt, 0 unindexed files, 0 temp files; 1 repaired") {
		t.Fatalf("verify --repair --shard 1/3 (the other shards' 60 files must not count):\n%s", r.stdout)
	}
	js = j.statusAll()
	if js.Done != samples-1 || js.PerShard[0].Done != 30 || js.PerShard[1].Done != 29 || js.PerShard[2].Done != 30 {
		t.Fatalf("after shard 1's repair: %+v; want only sample 45 back to pending", js)
	}
	cmd := j.command("run", "--resume", "--shard", "1/3")
	cmd.Env = j.shardEnv(t)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("run --resume --shard 1/3: %v\n%s", err, out)
	}
	if r := j.run("verify", "--all", "--deep"); r.code != 0 {
		t.Fatalf("verify --all after shard 1 redid sample 45: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}

	// A shard's lost index is rebuilt from its own range's files only, as a shard's.
	if err := os.Remove(filepath.Join(j.state, "shard-2-of-3", "index.db")); err != nil {
		t.Fatal(err)
	}
	r = j.mustRun("verify", "--repair", "--shard", "2/3")
	if !strings.Contains(r.stdout, "rebuilt from 30 files: 30 adopted, 0 refused") {
		t.Fatalf("rebuild of shard 2's index:\n%s", r.stdout)
	}
	if r := j.run("verify", "--all", "--deep"); r.code != 0 {
		t.Fatalf("verify --all after shard 2's rebuild: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
}

func TestShardAutoRefusesAResubmittedTaskThatDoesNotSayTheCount(t *testing.T) {
	j := newJob(t, 10, 0)
	j.env = append(j.env, "SLURM_ARRAY_TASK_ID=2", "SLURM_ARRAY_TASK_COUNT=1", "SLURM_ARRAY_TASK_MIN=2", "SLURM_ARRAY_TASK_MAX=2")
	r := j.run("run", "--resume", "--shard", "auto")
	if r.code != 2 || !strings.Contains(r.stderr, "EXTRACT_SHARD_COUNT") {
		t.Fatalf("auto in a partial array: exit %d, want 2 asking for the count\n%s", r.code, r.stderr)
	}
	// With the count pinned, the task id is the shard.
	j.env = append(j.env, "EXTRACT_SHARD_COUNT=4")
	if r := j.run("plan", "--shards", "4"); r.code != 0 || !strings.Contains(r.stdout, "2/4") {
		t.Fatalf("plan: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := j.run("run", "--resume", "--shard", "auto"); r.code != 0 {
		t.Fatalf("auto with EXTRACT_SHARD_COUNT=4: exit %d\n%s", r.code, r.stderr)
	}
	t.Cleanup(func() { j.stopShardServers(4) })
	if _, err := os.Stat(filepath.Join(j.state, "shard-2-of-4", "index.db")); err != nil {
		t.Fatalf("task 2 did not run shard 2 of 4: %v", err)
	}
}
