package main

import (
	"errors"
	"fmt"

	"github.com/extract-dev/extract/checkpoint"
	"github.com/extract-dev/extract/orchestrator"
	"github.com/spf13/cobra"
)

func runVerifyAll(cmd *cobra.Command, cf *configFlags, opt checkpoint.VerifyOptions) error {
	if opt.Repair {
		// Each shard repairs its own index; one command writing n indexes at once
		// would be a second coordinator.
		return usageError{errors.New("verify --all checks only; repair a shard with `extract verify --repair --shard i/n`")}
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
		return errors.New("verify --all found problems (listed above): `extract run --resume --shard i/n` redoes a shard's gaps; `extract verify --repair --shard i/n` fixes its index")
	}
	fmt.Fprintln(out, "ok: the union of the shards is the dataset, each sample exactly once")
	return nil
}
