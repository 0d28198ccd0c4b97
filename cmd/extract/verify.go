package main

import (
	"errors"
	"fmt"
	"io"

	"github.com/extract-dev/extract/checkpoint"
	"github.com/extract-dev/extract/orchestrator"
	"github.com/spf13/cobra"
)

func newVerifyCmd() *cobra.Command {
	var cf configFlags
	var opt checkpoint.VerifyOptions
	var asJSON bool
	var all bool
	cmd := &cobra.Command{
		Use:   "verify [--config F] [--shard i/n | --all] [--deep] [--repair] [--json]",
		Short: "Check output files against the index and the dataset; --deep reads every byte, --repair fixes or rebuilds the index",
		Long: `Check the output files against the index, the dataset and the config; --deep reads
every byte, --repair fixes the index or rebuilds it from the files; --all checks that
the shards add up to the dataset.
Exit codes: 0 sound; 1 problems found (--repair fixes them); 2 nothing to verify, bad
config or usage, or a repair refused; 75 a run holds the lock.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if all {
				return runVerifyAll(cmd, &cf, opt)
			}
			return runVerify(cmd, &cf, opt, asJSON)
		},
	}
	cf.register(cmd, "status-listen")
	cmd.Flags().BoolVar(&opt.Deep, "deep", false, "read every file: recompute its crc32c and compare its tokens with the dataset")
	cmd.Flags().BoolVar(&opt.Repair, "repair", false, "send missing or corrupt samples back to pending, adopt valid unindexed files, remove temp files; move a missing or damaged index aside and rebuild it from the files")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cmd.Flags().BoolVar(&all, "all", false, "check that the shards add up to the dataset: each sample done exactly once, by its owner, with its file")
	return cmd
}

// verifyJSON is `verify --json`: the counts of the text summary, the problems, and
// what a rebuild did.
type verifyJSON struct {
	Checked   int `json:"checked"`
	OK        int `json:"ok"`
	Missing   int `json:"missing"`
	Corrupt   int `json:"corrupt"`
	Orphans   int `json:"unindexed"`
	TempFiles int `json:"temp_files"`
	Repaired  int `json:"repaired"`
	// Unrepaired is what --repair found and could not fix (an entry it may not remove).
	Unrepaired int                   `json:"unrepaired"`
	Problems   []string              `json:"problems"`
	Unlisted   int                   `json:"unlisted"` // problems past the list's cap
	Mismatch   string                `json:"mismatch,omitempty"`
	Rebuild    *orchestrator.Rebuild `json:"rebuild,omitempty"`
}

func runVerify(cmd *cobra.Command, cf *configFlags, opt checkpoint.VerifyOptions, asJSON bool) error {
	cfg, err := cf.load(cmd)
	if err != nil {
		return err
	}
	res, err := orchestrator.Verify(cmd.Context(), cfg, opt)
	// A rebuild that failed half way still says what it did (the index moved aside).
	if err != nil && res.Rebuild == nil {
		return err
	}
	out := cmd.OutOrStdout()
	if asJSON {
		rep := res.VerifyReport
		if jerr := printJSON(out, verifyJSON{
			Checked: rep.Checked, OK: rep.OK, Missing: rep.Missing, Corrupt: rep.Corrupt,
			Orphans: rep.Orphans, TempFiles: rep.TempFiles, Repaired: rep.Repaired, Unrepaired: rep.Unrepaired,
			Problems: append([]string{}, rep.Problems...), Unlisted: rep.Unlisted, Mismatch: res.Mismatch, Rebuild: res.Rebuild,
		}); jerr != nil && err == nil {
			err = jerr
		}
	} else {
		printVerify(out, res, err)
	}
	if err != nil {
		return err
	}
	rep := res.VerifyReport
	if res.Mismatch != "" {
		return errors.New("verify: " + res.Mismatch + "; verify with the config the job ran with")
	}
	if rep.Unrepaired > 0 {
		return fmt.Errorf("verify --repair could not repair %d entries (listed above: each is in the way of an output and cannot be removed); remove them by hand, then `extract verify --repair` again", rep.Unrepaired)
	}
	bad := rep.Missing + rep.Corrupt + rep.Orphans + rep.TempFiles
	if bad > 0 && !opt.Repair {
		return fmt.Errorf("verify found problems; `%s` fixes the index (then `extract run --resume%s` redoes the samples)", repairCommand(opt, cf.shard), shardFlag(cf.shard))
	}
	return nil
}

// printVerify prints the problems and the counts; failed is the error a rebuild ended
// with, after which nothing was put in place and nothing counts as repaired.
func printVerify(out io.Writer, res orchestrator.VerifyResult, failed error) {
	rep := res.VerifyReport
	if res.Mismatch != "" {
		fmt.Fprintln(out, res.Mismatch)
	}
	for _, p := range rep.Problems {
		fmt.Fprintln(out, p)
	}
	printUnlisted(out, rep.Unlisted)
	if rb := res.Rebuild; rb != nil {
		fmt.Fprintf(out, "index.db was %s", rb.Why)
		if rb.MovedAside != "" {
			fmt.Fprintf(out, "; moved aside to %s", rb.MovedAside)
		}
		if failed != nil {
			fmt.Fprintf(out, "; the rebuild from %d files failed and no index was put in place: fix the cause, then `extract verify --repair` again\n", rb.Files)
			return
		}
		fmt.Fprintf(out, "; rebuilt from %d files: %d adopted, %d refused (attempt base %d)\n", rb.Files, rb.Adopted, rb.Refused, rb.AttemptBase)
	}
	fmt.Fprintf(out, "checked %d: %d ok, %d missing, %d corrupt, %d unindexed files, %d temp files; %d repaired",
		rep.Checked, rep.OK, rep.Missing, rep.Corrupt, rep.Orphans, rep.TempFiles, rep.Repaired)
	if rep.Unrepaired > 0 {
		fmt.Fprintf(out, ", %d could not be repaired", rep.Unrepaired)
	}
	fmt.Fprintln(out)
}

// repairCommand is the command that repairs what a verify with opt found: a problem only
// --deep sees (a crc32c, a token) needs --deep again, or the repair checks shallowly,
// finds nothing and says "0 repaired".
func repairCommand(opt checkpoint.VerifyOptions, shard string) string {
	c := "extract verify --repair"
	if opt.Deep {
		c = "extract verify --deep --repair"
	}
	return c + shardFlag(shard)
}

// shardFlag repeats the --shard the command was given, so that advice names the same shard.
func shardFlag(shard string) string {
	if shard == "" {
		return ""
	}
	return " --shard " + shard
}
