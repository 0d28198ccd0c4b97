package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/extract-dev/extract/configs"
	"github.com/extract-dev/extract/doctor"
	"github.com/extract-dev/extract/orchestrator"
	"github.com/spf13/cobra"
)

func newDoctorCmd() *cobra.Command {
	var cf configFlags
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "doctor [--config F] [--shard i/n] [--json]",
		Short: "Check whether a run could start here: GPUs and who holds them, storage, model, hook, staging, index",
		Long: `Check whether a run could start on this machine, each check ok, warn or fail with
its reason and what to do.
Exit codes: 0 a run could start (warnings allowed); 3 a check failed; 2 bad config or
usage.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := cf.load(cmd)
			if err != nil {
				return err
			}
			return runDoctor(cmd.Context(), cfg, doctorOptions{configFile: cf.file, json: asJSON}, cmd.OutOrStdout())
		},
	}
	cf.register(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// doctorOptions are the doctor command's choices besides the config.
type doctorOptions struct {
	configFile string // the --config file, "" for none
	json       bool
}

// runDoctor prints the triage of cfg to out; the error is exit 3 when a run could not start.
func runDoctor(ctx context.Context, cfg *configs.Config, opt doctorOptions, out io.Writer) error {
	// Where the binary lives matters to the cron line that resumes the job; an unknown
	// path is just not checked.
	exe, _ := os.Executable()
	rep, err := orchestrator.Doctor(ctx, cfg, doctor.Options{ConfigFile: opt.configFile, Executable: exe})
	if err != nil {
		return err
	}
	if opt.json {
		if err := printJSON(out, rep); err != nil {
			return err
		}
	} else {
		printDoctor(out, rep)
	}
	if failed := rep.Failed(); len(failed) > 0 {
		names := make([]string, len(failed))
		for i, c := range failed {
			names[i] = c.Name
		}
		return exitCodeError{code: exitPreflight, err: fmt.Errorf("a run could not start: %d check(s) failed (%s)", len(failed), strings.Join(names, ", "))}
	}
	return nil
}

func printDoctor(w io.Writer, rep doctor.Report) {
	width := 0
	for _, c := range rep.Checks {
		width = max(width, len(c.Name))
	}
	for _, c := range rep.Checks {
		fmt.Fprintf(w, "%-4s  %-*s  %s\n", strings.ToUpper(c.Status), width, c.Name, c.Reason)
		if c.Fix != "" && c.Status != doctor.CheckOK {
			fmt.Fprintf(w, "      %-*s  → %s\n", width, "", c.Fix)
		}
	}
	if rep.RunningPID > 0 {
		fmt.Fprintf(w, "a run is in progress (pid %d); `extract run` would leave it be and exit 0\n", rep.RunningPID)
	}
	switch {
	case !rep.OK:
		fmt.Fprintf(w, "a run would be refused (exit 3): %d check(s) failed\n", len(rep.Failed()))
	case rep.RunningPID == 0:
		fmt.Fprintln(w, "a run could start")
	}
}
