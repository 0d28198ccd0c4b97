package main

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/extract-dev/extract/checkpoint"
	"github.com/extract-dev/extract/configs"
	"github.com/extract-dev/extract/orchestrator"
	"github.com/extract-dev/extract/shm"
)

// cmdShards measures `extract status --all` over a job of -shards shards of -per samples
// each, all done: the indexes are written through the checkpoint API as the shards'
// runs would leave them (one bbolt file per shard, records and counters, the plan in
// meta), then the CLI is timed end to end, process start included.
func cmdShards(args []string) error {
	fs := flag.NewFlagSet("shards", flag.ExitOnError)
	var c commonFlags
	c.register(fs)
	shards := fs.Int("shards", 8, "shards in the plan")
	per := fs.Int("per", 1_000_000, "samples per shard")
	runs := fs.Int("runs", 11, "timed runs of status --all")
	keep := fs.Bool("keep", false, "keep the indexes (a later run with the same flags reuses them)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := c.check(true); err != nil {
		return err
	}
	dir := filepath.Join(c.out, fmt.Sprintf("shards-%dx%d", *shards, *per))
	if !*keep {
		defer func() { logErr("os.RemoveAll(dir)", os.RemoveAll(dir)) }()
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	// The dataset is named, not read: status --all takes the sizes from the indexes.
	cfgPath := filepath.Join(dir, "job.yaml")
	yaml := fmt.Sprintf("dataset: %s\noutput_dir: %s\nshm_dir: /dev/shm/extract-bench-shards\nserver:\n  kind: simulator\n",
		filepath.Join(dir, "data.jsonl"), filepath.Join(dir, "out"))
	if err := os.WriteFile(cfgPath, []byte(yaml), 0o644); err != nil {
		return err
	}
	cfg, err := configs.Load(cfgPath, nil)
	if err != nil {
		return err
	}
	total := *shards * *per
	start := time.Now()
	for i := range *shards {
		if err := synthShard(cfg, i, *shards, total); err != nil {
			return fmt.Errorf("shard %d: %w", i, err)
		}
	}
	fmt.Printf("built %d shard indexes of %d samples in %s\n", *shards, *per, time.Since(start).Round(time.Millisecond))

	var times []time.Duration
	for range *runs {
		t0 := time.Now()
		out, err := exec.Command(c.extract, "status", "--all", "--json", "--config", cfgPath).CombinedOutput()
		took := time.Since(t0)
		if err != nil {
			return fmt.Errorf("status --all: %v\n%s", err, out)
		}
		times = append(times, took)
	}
	slices.Sort(times)
	median := times[len(times)/2]
	return emit(c.results, result{
		Fig: "7", Name: fmt.Sprintf("status --all, %d shards × %d samples (median of %d)", *shards, *per, *runs),
		Value: float64(median.Microseconds()) / 1000, Unit: "ms", Target: "< 200 ms", Met: met(median < 200*time.Millisecond),
		Note: fmt.Sprintf("min %s, max %s", times[0].Round(time.Millisecond), times[len(times)-1].Round(time.Millisecond)),
	})
}

// synthShard writes shard i of n's index with its whole range done, unless a complete
// one is there already.
func synthShard(cfg *configs.Config, i, n, total int) error {
	stateDir := filepath.Join(cfg.StateDir, configs.ShardDirName(i, n))
	if err := os.MkdirAll(stateDir, 0o755); err != nil {
		return err
	}
	lo, hi := orchestrator.ShardRange(total, i, n)
	ix, err := checkpoint.Open(filepath.Join(stateDir, "index.db"), checkpoint.OpenOptions{Timeout: 5 * time.Second})
	if err != nil {
		return err
	}
	defer func() { logErr("ix.Close()", ix.Close()) }()
	if c, err := ix.Counters(); err == nil && c.Done == hi-lo {
		return nil
	}
	err = ix.Reset(checkpoint.Meta{
		DatasetFingerprint: "bench", DatasetPath: cfg.Dataset, ConfigFingerprint: cfg.Fingerprint(),
		Total: total, Created: time.Now().UTC(), ShardIndex: i, ShardCount: n,
	})
	if err != nil {
		return err
	}
	// Many committers, as the movers are: CommitDone groups them into large txns.
	var g errgroup.Group
	g.SetLimit(2048)
	now := time.Now().UTC()
	for s := lo; s < hi; s++ {
		g.Go(func() error {
			return ix.CommitDone(checkpoint.Record{
				Sample: s, State: checkpoint.StateDone, Attempt: 1, RID: shm.RID{Sample: s, Attempt: 1}.String(),
				Bytes: 32 * 8216, CRC32C: uint32(s), Tokens: 32, Updated: now,
			})
		})
	}
	return g.Wait()
}
