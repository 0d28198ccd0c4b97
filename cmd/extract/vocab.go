package main

import (
	"fmt"

	"github.com/extract-dev/extract/orchestrator"
	"github.com/spf13/cobra"
)

func newVocabCmd() *cobra.Command {
	var cf configFlags
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "vocab [--json]",
		Short: "Write the draft vocabulary (<output_dir>/vocab_mapping/vocab_mapping.pt, SpecForge's d2t/t2d) from the done samples",
		Long: `vocab counts the loss-masked tokens of the samples done so far (a finished or a partial
job) and writes <output_dir>/vocab_mapping/vocab_mapping.pt ({"d2t": int64 [vocab.draft_size],
"t2d": bool [target vocabulary]}, as SpecForge's prepare_hidden_states.py) and token_freq.pt
(the raw counts, {token id: count}). A conversation job writes it at its end by itself.

Exit codes: 0 written; 1 failed; 2 no index, or a dataset that is not the index's;
75 a run holds the lock.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := cf.load(cmd)
			if err != nil {
				return err
			}
			rep, err := orchestrator.Vocab(cmd.Context(), cfg)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(cmd.OutOrStdout(), rep)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote %s: %d draft tokens of %d, from %d loss tokens (%d distinct) of %d done samples\n",
				rep.Path, rep.DraftSize, rep.TargetSize, rep.Tokens, rep.Seen, rep.Samples)
			return nil
		},
	}
	cf.register(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the report as JSON")
	return cmd
}
