package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/extract-dev/extract/orchestrator"
	"github.com/spf13/cobra"
)

func newDoctorCmd() *cobra.Command {
	var cf configFlags
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "doctor [--config F] [--json]",
		Short: "Check whether a run could start here: GPUs and who holds them, storage, model, hook, staging, index",
		Long: `Check whether a run could start on this machine, each check ok, warn or fail with
its reason and what to do. Exit 0 when a run could start (warnings allowed), 3 when a
check failed, 2 on a bad config.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := cf.load(cmd)
			if err != nil {
				return err
			}
			rep, err := orchestrator.Doctor(cmd.Context(), cfg, orchestrator.DoctorOptions{})
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if asJSON {
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				if err := enc.Encode(rep); err != nil {
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
		},
	}
	cf.register(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func printDoctor(w io.Writer, rep orchestrator.DoctorReport) {
	width := 0
	for _, c := range rep.Checks {
		width = max(width, len(c.Name))
	}
	for _, c := range rep.Checks {
		fmt.Fprintf(w, "%-4s  %-*s  %s\n", strings.ToUpper(c.Status), width, c.Name, c.Reason)
		if c.Fix != "" && c.Status != orchestrator.CheckOK {
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
