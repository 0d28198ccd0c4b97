package main

import (
	"errors"
	"fmt"

	"github.com/extract-dev/extract/orchestrator"
	"github.com/spf13/cobra"
)

func newExportCmd() *cobra.Command {
	var cf configFlags
	var opt orchestrator.ExportOptions
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "export --format safetensors|specforge|specforge+gzip|modelopt --to DIR [--config F] [--shard i/n] [--json]",
		Short: "Convert the done samples into another trainer's format under DIR; resumable",
		Long: `Convert the done samples (of a finished or a partial job) into another trainer's
format under DIR; run it again to finish or refresh it.
Exit codes: 0 exported; 1 some samples failed; 2 bad config or usage; 75 a run holds
the lock.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if opt.To == "" || opt.Format == "" {
				return usageError{fmt.Errorf("--format and --to are required")}
			}
			cfg, err := cf.load(cmd)
			if err != nil {
				return err
			}
			opt.Progress = terminalProgress("export", "samples", asJSON)
			rep, err := orchestrator.Export(cmd.Context(), cfg, opt)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if asJSON {
				if err := printJSON(out, rep); err != nil {
					return err
				}
			} else {
				for _, p := range rep.Problems {
					fmt.Fprintln(out, p)
				}
				printUnlisted(out, rep.Failed-len(rep.Problems))
				fmt.Fprintf(out, "exported %d samples (%d bytes) to %s, %d already there, %d failed\n", rep.Exported, rep.Bytes, opt.To, rep.Skipped, rep.Failed)
			}
			if rep.Failed > 0 {
				return errors.New("export: some samples failed; fix their files (extract verify --deep) and run export again")
			}
			return nil
		},
	}
	cf.register(cmd, "status-listen")
	cmd.Flags().StringVar(&opt.Format, "format", "", "target format: safetensors, specforge, specforge+gzip or modelopt")
	cmd.Flags().StringVar(&opt.To, "to", "", "target directory (not inside the output dir)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the summary as JSON")
	return cmd
}
