package main

import (
	"errors"
	"fmt"

	"github.com/extract-dev/extract/checkpoint"
	"github.com/extract-dev/extract/orchestrator"
	"github.com/spf13/cobra"
)

func newVerifyCmd() *cobra.Command {
	var cf configFlags
	var opt checkpoint.VerifyOptions
	var all bool
	cmd := &cobra.Command{
		Use:   "verify [--config F] [--deep] [--repair]",
		Short: "Check output files against the index; --deep recomputes checksums, --repair fixes the index",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if all {
				return runVerifyAll(cmd, &cf, opt)
			}
			if err := refuseShardRepair(cmd, &cf, opt); err != nil {
				return err
			}
			return runVerify(cmd, &cf, opt)
		},
	}
	cf.register(cmd)
	cmd.Flags().BoolVar(&opt.Deep, "deep", false, "read every file and recompute its crc32c")
	cmd.Flags().BoolVar(&all, "all", false, "check that the shards add up to the dataset: each sample done exactly once, by its owner, with its file")
	cmd.Flags().BoolVar(&opt.Repair, "repair", false, "send missing or corrupt samples back to pending, adopt valid unindexed files, remove temp files")
	return cmd
}

func runVerify(cmd *cobra.Command, cf *configFlags, opt checkpoint.VerifyOptions) error {
	cfg, err := cf.load(cmd)
	if err != nil {
		return err
	}
	rep, err := orchestrator.Verify(cmd.Context(), cfg, opt)
	if err != nil {
		return err
	}
	out := cmd.OutOrStdout()
	for _, p := range rep.Problems {
		fmt.Fprintln(out, p)
	}
	fmt.Fprintf(out, "checked %d: %d ok, %d missing, %d corrupt, %d unindexed files, %d temp files; %d repaired\n",
		rep.Checked, rep.OK, rep.Missing, rep.Corrupt, rep.Orphans, rep.TempFiles, rep.Repaired)
	bad := rep.Missing + rep.Corrupt + rep.Orphans + rep.TempFiles
	if bad > 0 && !opt.Repair {
		return errors.New("verify found problems; `extract verify --repair` fixes the index (then `extract run --resume` redoes the samples)")
	}
	return nil
}
