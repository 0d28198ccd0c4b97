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
		Use:   "stop [--config F] [--shard i/n] [--timeout 5m]",
		Short: "Stop the running job gracefully: finish in-flight samples, commit, stop the server",
		Long: `Stop the running job gracefully: finish in-flight samples, commit, stop the server.

Only a run that is provably the one holding the lock is signalled: same host, same
boot, same pid namespace, and the start time the lock records (through a pidfd, so a
reused pid is never hit). Otherwise stop says where the run is and how to stop it there.

Exit codes: 0 stopped, or no run going; 75 still draining at --timeout (it goes on
stopping by itself); 1 the run is elsewhere (another host, boot or pid namespace) or
could not be signalled; 2 bad config or usage.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runStop(cmd, &cf, timeout)
		},
	}
	cf.register(cmd, "status-listen")
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
	h, stopped, err := orchestrator.StopRun(ctx, cfg)
	if err != nil {
		return err
	}
	switch {
	case h.PID == 0:
		fmt.Fprintln(cmd.OutOrStdout(), "no run is going")
	case !stopped:
		fmt.Fprintf(cmd.OutOrStdout(), "no run is going; %s holds the lock and ends by itself\n", h)
	default:
		fmt.Fprintf(cmd.OutOrStdout(), "stopped run pid %d; continue with `extract run --resume`\n", h.PID)
	}
	return nil
}
