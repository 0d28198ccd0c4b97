package main

import (
	"errors"
	"fmt"
	"log/slog"

	"github.com/extract-dev/extract/orchestrator"
	"github.com/spf13/cobra"
)

// maxSkippedShown is how many skipped files the text summary names one by one.
const maxSkippedShown = 10

func newImportCmd() *cobra.Command {
	var cf configFlags
	var opt orchestrator.ImportOptions
	var asJSON, link bool
	cmd := &cobra.Command{
		Use:   "import --from DIR [--format auto|specforge|safetensors|modelopt|extract] [--link|--copy] [--shard i/n] [--json]",
		Short: "Adopt sample files another tool wrote: check each against the dataset and config, bring the good ones into the output, index them done",
		Long: `Adopt sample files another tool wrote: each is checked against the dataset and the
config; the good ones are linked, copied or converted into the output and indexed done,
the rest listed one line each with the reason and left alone.
Exit codes: 0 files imported (or all already done); 1 every file found was left alone;
2 no sample files found, bad config or usage; 75 a run holds the lock.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if opt.From == "" {
				return usageError{fmt.Errorf("--from DIR is required")}
			}
			if link && opt.Copy {
				return usageError{fmt.Errorf("--link and --copy exclude each other")}
			}
			cfg, err := cf.load(cmd)
			if err != nil {
				return err
			}
			opt.Progress = terminalProgress("import", "files", asJSON)
			// Each file left alone is one line of the report; a warning in the log as well
			// would say it twice.
			opt.Log = slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: slog.LevelError}))
			rep, err := orchestrator.Import(cmd.Context(), cfg, opt)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if asJSON {
				if err := printJSON(out, rep); err != nil {
					return err
				}
			} else {
				for _, r := range rep.Rejected {
					fmt.Fprintf(out, "left alone: sample %d: %s: %s\n", r.Sample, r.Path, r.Reason)
				}
				// Another shard's files are many and all alike: the first few, then a count
				// (--json lists them all).
				for i, r := range rep.Skipped {
					if i == maxSkippedShown {
						fmt.Fprintf(out, "skipped: and %d more files of other shards\n", len(rep.Skipped)-i)
						break
					}
					fmt.Fprintf(out, "skipped: sample %d: %s: %s\n", r.Sample, r.Path, r.Reason)
				}
				fmt.Fprintf(out, "found %d files: %d imported (%d linked, %d copied, %d converted), %d already done, %d left alone, %d of other shards skipped; %d of %d samples done\n",
					rep.Found, rep.Imported, rep.Linked, rep.Copied, rep.Converted, rep.AlreadyDone, len(rep.Rejected), len(rep.Skipped), rep.Done, rep.Total)
				if rep.Done < rep.Total && rep.Imported > 0 {
					fmt.Fprintln(out, "`extract run --resume` computes the rest")
				}
			}
			return importOutcome(rep, opt)
		},
	}
	cf.register(cmd, "status-listen")
	cmd.Flags().StringVar(&opt.From, "from", "", "directory of sample files (SpecForge's rows_*/data_<i>.ckpt[.gz], flat <i>.pt or <i>.safetensors, extract's own)")
	cmd.Flags().StringVar(&opt.Format, "format", "auto", "which files to consider: auto, specforge, safetensors, modelopt or extract")
	cmd.Flags().BoolVar(&link, "link", false, "hard-link files already in the job's format (the default; falls back to a copy across filesystems)")
	cmd.Flags().BoolVar(&opt.Copy, "copy", false, "copy instead of hard-linking")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the summary as JSON")
	return cmd
}

// importOutcome is the exit status of an import: finding nothing to import is not a
// success a script should go on from (a wrong --from or --format), and neither is a
// directory whose every file was refused.
func importOutcome(rep orchestrator.ImportReport, opt orchestrator.ImportOptions) error {
	switch {
	case rep.Found == len(rep.Skipped) && len(rep.Skipped) > 0:
		return usageError{fmt.Errorf("the %d sample files under %s are all of other shards than this one (--shard): nothing imported", rep.Found, opt.From)}
	case rep.Found == 0:
		return usageError{fmt.Errorf("no sample files under %s for --format %s (SpecForge's rows_*/data_<i>.ckpt[.gz], flat <i>.pt or <i>.safetensors, extract's own): nothing imported", opt.From, opt.Format)}
	case rep.Imported == 0 && rep.AlreadyDone == 0:
		return errors.New("nothing imported: every file found was left alone (listed above)")
	}
	return nil
}
