package main

import (
	"context"
	"errors"
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
		Long: `Stop the running job gracefully (SIGTERM): no new samples, drain the in-flight ones,
commit, stop the server; then wait for it to let go of its lock.
Exit codes: 0 stopped, or no run going; 75 still draining at --timeout (it goes on
stopping by itself); 1 the run could not be signalled; 2 bad config or usage.`,
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
	pid, err := orchestrator.StopRun(ctx, cfg)
	if errors.Is(err, context.DeadlineExceeded) && cmd.Context().Err() == nil {
		// Not a failure: the run got the signal and is committing what it has in flight.
		return exitCodeError{code: exitTempFail, err: fmt.Errorf("run pid %d is still draining after --timeout %s; it stops by itself once its in-flight samples are committed (`extract status` shows it)", pid, timeout)}
	}
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
