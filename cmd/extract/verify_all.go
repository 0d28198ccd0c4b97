package main

import (
	"errors"
	"fmt"
	"strings"

	"github.com/extract-dev/extract/checkpoint"
	"github.com/extract-dev/extract/orchestrator"
	"github.com/spf13/cobra"
)

func runVerifyAll(cmd *cobra.Command, cf *configFlags, opt checkpoint.VerifyOptions) error {
	if opt.Repair {
		// Each shard repairs its own index; one command writing n indexes at once
		// would be a second coordinator.
		return usageError{errors.New("verify --all checks only; each shard repairs its own index: `extract verify --repair --shard i/n`, then `extract run --resume --shard i/n` redoes what it sent back")}
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
	for i, g := range rep.Generate {
		fmt.Fprintf(out, "generate %d: lines %d-%d, %d done, %d dropped, %d failed, %d pending; output %d lines, %d problems\n", i, g.Lo, g.Hi, g.Done, g.Dropped, g.Failed, g.Pending, g.OutputLines, len(g.Problems))
	}
	if rep.GenerateOnly {
		if !rep.OK() {
			return errors.New("verify --all found problems in the generate stage (listed above): `extract generate --resume --shard i/n` finishes a shard's pending conversations")
		}
		fmt.Fprintln(out, "ok: the shards' generate indexes cover the conversation file, each conversation exactly once, and each output holds its index's conversations in order")
		return nil
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
		return errors.New(allAdvice(rep, opt.Deep))
	}
	fmt.Fprintln(out, "ok: the union of the shards is the dataset, each sample exactly once")
	return nil
}

// allAdvice says how to mend what verify --all found, shard by shard: a missing or
// corrupt file has a done record, which only the shard's `verify --repair` (with --deep
// when only --deep saw it) sends back to pending; then the shard's run redoes it, as it
// does a gap.
func allAdvice(rep orchestrator.VerifyAllReport, deep bool) string {
	repair := "verify --repair"
	if deep {
		repair = "verify --deep --repair"
	}
	var lines []string
	for _, r := range rep.PerShard {
		shard := fmt.Sprintf("%d/%d", r.Shard, rep.Shards)
		if r.Missing+r.Corrupt > 0 {
			lines = append(lines, fmt.Sprintf("shard %s: `extract %s --shard %s`, then `extract run --resume --shard %s`", shard, repair, shard, shard))
		}
	}
	msg := "verify --all found problems (listed above)"
	if len(lines) > 0 {
		msg += "; to redo the missing and corrupt samples:\n  " + strings.Join(lines, "\n  ")
	}
	return msg + "\nfor the rest: `extract " + repair + " --shard i/n` adopts a shard's sound unindexed files and removes its temp files, and `extract run --resume --shard i/n` redoes its gaps"
}
