package main

import (
	"fmt"
	"text/tabwriter"

	"github.com/extract-dev/extract/configs"
	"github.com/extract-dev/extract/orchestrator"
	"github.com/spf13/cobra"
)

func newPlanCmd() *cobra.Command {
	var cf configFlags
	var shards int
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "plan --shards n [--config F] [--json]",
		Short: "Print how the job splits in n shards: each shard's samples, tokens and estimated bytes",
		Long: `Print how the job splits in n shards. Shard i of n owns the contiguous samples
[floor(i*N/n), floor((i+1)*N/n)) of a dataset of N samples; run it with
` + "`extract run --resume --shard i/n`" + ` (or --shard auto in a Slurm array or a Kubernetes
Indexed Job). Nothing is written.
Exit codes: 0 printed; 2 bad config, dataset or usage.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if shards < 1 {
				return usageError{fmt.Errorf("plan needs --shards n (n ≥ 1)")}
			}
			cfg, err := cf.load(cmd)
			if err != nil {
				return err
			}
			rows, err := orchestrator.Plan(cfg, shards)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if asJSON {
				return printJSON(out, rows)
			}
			tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', tabwriter.AlignRight)
			fmt.Fprintln(tw, "shard\tfirst\tend\tsamples\ttokens\test. bytes\tstate dir\t")
			var samples int
			var tokens, bytes int64
			for _, r := range rows {
				fmt.Fprintf(tw, "%d/%d\t%d\t%d\t%d\t%d\t%s\t%s\t\n", r.Shard, shards, r.First, r.End, r.Samples, r.Tokens, configs.ByteSize(r.Bytes), r.Dir)
				samples += r.Samples
				tokens += r.Tokens
				bytes += r.Bytes
			}
			fmt.Fprintf(tw, "total\t\t\t%d\t%d\t%s\t\t\n", samples, tokens, configs.ByteSize(bytes))
			return tw.Flush()
		},
	}
	cf.register(cmd, "shard", "status-listen")
	cmd.Flags().IntVar(&shards, "shards", 0, "number of shards (e.g. the Slurm array's size)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}
