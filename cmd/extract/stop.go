package main

import (
	"context"
	"fmt"
	"time"

	"github.com/extract-dev/extract/orchestrator"
	"github.com/spf13/cobra"
)

func newStopCmd() *cobra.Command {
	var cf configFlags
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "stop [--config F] [--timeout 5m]",
		Short: "Stop the running job gracefully: finish in-flight samples, commit, stop the server",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runStop(cmd, &cf, timeout)
		},
	}
	cf.register(cmd)
	cmd.Flags().DurationVar(&timeout, "timeout", 5*time.Minute, "how long to wait for the run to drain")
	return cmd
}

func runStop(cmd *cobra.Command, cf *configFlags, timeout time.Duration) error {
	cfg, err := cf.load(cmd)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
	defer cancel()
	pid, err := orchestrator.StopRun(ctx, cfg)
	if err != nil {
		return err
	}
	if pid == 0 {
		fmt.Fprintln(cmd.OutOrStdout(), "no run is going")
		return nil
	}
	fmt.Fprintf(cmd.OutOrStdout(), "stopped run pid %d; continue with `extract run --resume`\n", pid)
	return nil
}
