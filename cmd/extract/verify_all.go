package main

import (
	"errors"
	"fmt"

	"github.com/extract-dev/extract/checkpoint"
	"github.com/extract-dev/extract/orchestrator"
	"github.com/spf13/cobra"
)

// refuseShardRepair stops `verify --repair` on one shard: the other shards' files in the
// shared output dir look like this shard's orphans, and adopting them would mark samples
// done in two indexes. Until repair filters by the shard's range, it is refused.
func refuseShardRepair(cmd *cobra.Command, cf *configFlags, opt checkpoint.VerifyOptions) error {
	if !opt.Repair {
		return nil
	}
	cfg, err := cf.load(cmd)
	if err != nil {
		return err
	}
	if cfg.Shard.Sharded() {
		return usageError{fmt.Errorf("verify --repair on shard %s is refused: the other shards' outputs share %s and would be adopted into this shard's index; check the job with `extract verify --all`, and redo a shard's bad samples with `extract run --resume --shard %s`", cfg.Shard, cfg.OutputDir, cfg.Shard)}
	}
	return nil
}

func runVerifyAll(cmd *cobra.Command, cf *configFlags, opt checkpoint.VerifyOptions) error {
	if opt.Repair {
		// Each shard repairs its own index; one command writing n indexes at once
		// would be a second coordinator.
		return usageError{errors.New("verify --all checks only; a shard's missing or bad samples are redone by `extract run --resume --shard i/n` once its index no longer says them done")}
	}
	cfg, err := cf.load(cmd)
	if err != nil {
		return err
	}
	rep, err := orchestrator.VerifyAll(cmd.Context(), cfg, opt.Deep)
	if err != nil {
		return err
	}
	out := cmd.OutOrStdout()
	for _, p := range rep.Problems {
		fmt.Fprintln(out, p)
	}
	printUnlisted(out, rep.Unlisted)
	for _, r := range rep.PerShard {
		note := ""
		if r.Note != "" {
			note = " (" + r.Note + ")"
		}
		fmt.Fprintf(out, "shard %d/%d: samples %d-%d, %d done, %d missing, %d corrupt%s\n", r.Shard, rep.Shards, r.First, r.End, r.Done, r.Missing, r.Corrupt, note)
	}
	fmt.Fprintf(out, "%d shards, %d samples: %d done exactly once; %d gaps, %d overlaps, %d misplaced, %d missing, %d corrupt, %d orphan files, %d temp files, %d mismatched shards\n",
		rep.Shards, rep.Samples, rep.Done, rep.Gaps, rep.Overlaps, rep.Misplaced, rep.Missing, rep.Corrupt, rep.Orphans, rep.TempFiles, rep.Mismatched)
	if !rep.OK() {
		return errors.New("verify --all found problems (listed above): `extract run --resume --shard i/n` redoes a shard's gaps")
	}
	fmt.Fprintln(out, "ok: the union of the shards is the dataset, each sample exactly once")
	return nil
}
