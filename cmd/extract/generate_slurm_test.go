package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Four Slurm array tasks of `extract generate --shard auto`, one cancelled mid-way and
// resubmitted: status --all and verify --all see the generate stage of every shard, and
// the shards' outputs in shard order are the contract's file, each conversation once.
func TestASlurmArrayOfFourGenerateShardsAddsUpToTheConversationsExactlyOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("starts Slurm daemons")
	}
	s := startSlurm(t)
	const n = 4
	g := genContract{seed: 13, replyTokens: 40, maxNew: 64, maxAttempts: 3}
	j, _, want := newGenerateJob(t, 160, g)
	j.env = append(j.env, "EXTRACT_SERVER_SIMULATOR_DECODE_DELAY=4ms", "EXTRACT_GENERATE_MAX_INFLIGHT=2")
	t.Cleanup(func() { j.stopShardServers(n) })
	sbatch := s.arraySubmitter(j, n, "SHARD_COMMAND=generate")
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	jobID := sbatch("0-3")
	// Cancel a task once its shard has committed conversations: mid-way.
	victim, victimShard := "", -1
	for victim == "" {
		if ctx.Err() != nil {
			t.Fatalf("no task got under way: %v", s.tasks())
		}
		for id, st := range s.tasks() {
			i, err := strconv.Atoi(strings.TrimPrefix(id, jobID+"_"))
			if st != "RUNNING" || err != nil {
				continue
			}
			b, err := os.ReadFile(filepath.Join(j.state, fmt.Sprintf("shard-%d-of-%d", i, n), "generate", "status.json"))
			var gs struct {
				State       string
				Done, Total int
			}
			if err == nil && json.Unmarshal(b, &gs) == nil && gs.State == "running" && gs.Done > 0 && gs.Done < gs.Total {
				victim, victimShard = id, i
				break
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	if out, err := s.cmd("scancel", victim).CombinedOutput(); err != nil {
		t.Fatalf("scancel %s: %v\n%s", victim, err, out)
	}
	t.Logf("cancelled %s (shard %d/%d) mid-way", victim, victimShard, n)
	s.waitEmpty(ctx)
	if r := j.run("verify", "--all"); r.code == 0 {
		t.Fatalf("verify --all passed with shard %d cancelled mid-way:\n%s", victimShard, r.stdout)
	}
	sbatch(strconv.Itoa(victimShard), "--export=ALL,EXTRACT_SHARD_COUNT="+strconv.Itoa(n))
	s.waitEmpty(ctx)

	r := j.run("status", "--all", "--json")
	var js struct {
		Generate *struct {
			State                        string
			Total, Done, Dropped, Failed int
			Pending                      int
		}
	}
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &js) != nil || js.Generate == nil {
		t.Fatalf("status --all: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if gs := js.Generate; gs.State != "complete" || gs.Total != 160 || gs.Done != len(want) || gs.Pending != 0 {
		logs, _ := filepath.Glob(filepath.Join(j.dir, "slurm-*.out"))
		for _, l := range logs {
			b, _ := os.ReadFile(l)
			t.Logf("%s:\n%s", filepath.Base(l), tail(b))
		}
		t.Fatalf("status --all generate = %+v; want complete, 160 lines, %d done", *gs, len(want))
	}
	if r := j.run("verify", "--all"); r.code != 0 {
		t.Fatalf("verify --all: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	var got []genLine
	for i := range n {
		got = append(got, readGenerated(t, filepath.Join(j.state, fmt.Sprintf("shard-%d-of-%d", i, n), "generate", "generated.jsonl"))...)
	}
	checkGenerated(t, got, want)
}
