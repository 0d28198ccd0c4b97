package main

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"

	"github.com/extract-dev/extract/dataset"
	"github.com/extract-dev/extract/orchestrator"
	"github.com/spf13/cobra"
)

func newRunCmd() *cobra.Command {
	var cf configFlags
	var opt orchestrator.RunOptions
	cmd := &cobra.Command{
		Use:   "run [--config F] [--resume | --fresh] [--shard i/n|auto]",
		Short: "Run the extraction job (or continue it with --resume)",
		Long: `Run the extraction job.
Exit codes: 0 finished, already complete, or another run holds the lock; 1 failed;
2 bad config, dataset or usage; 3 preflight refused; 75 temporary failure worth a retry
(cron).`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runRun(cmd, &cf, opt)
		},
	}
	cf.register(cmd)
	cmd.Flags().BoolVar(&opt.Resume, "resume", false, "continue the job recorded in the index (starts it when there is none)")
	cmd.Flags().BoolVar(&opt.Fresh, "fresh", false, "discard the index's progress and start over")
	return cmd
}

func runRun(cmd *cobra.Command, cf *configFlags, opt orchestrator.RunOptions) error {
	cfg, err := cf.load(cmd)
	if err != nil {
		return err
	}
	// On a terminal a progress bar shows rate and ETA; elsewhere (cron, systemd) the
	// periodic progress log lines do.
	stderr := cmd.ErrOrStderr()
	finishBar := func() {}
	if f, ok := stderr.(*os.File); ok && isTerminal(f) {
		bar, stop := newTerminalBar(f)
		stderr, opt.OnStatus, finishBar = bar, bar.update, stop
		defer stop()
	}
	log, closeLog, err := newLogger(cfg, stderr)
	if err != nil {
		return err
	}
	defer closeLog()
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find own executable: %w", err)
	}
	opt.Executable, opt.Log, opt.ConfigFile = exe, log, cf.file
	res, err := orchestrator.Run(cmd.Context(), cfg, opt)
	finishBar() // the outcome below gets a line of its own, not the bar's
	out := cmd.OutOrStdout()
	rejected := rejectedSummary(res)
	if err != nil && rejected != "" {
		log.Warn("dumps rejected", "summary", rejected)
	}
	if err != nil {
		if errors.Is(err, dataset.ErrBad) || errors.Is(err, orchestrator.ErrRefused) || errors.Is(err, orchestrator.ErrPreflight) {
			return err // said in full on stderr; the preflight's checks are in the log already
		}
		log.Error("run ended with an error", "err", err, "done", res.Done, "total", res.Total)
		return err
	}
	if rejected != "" {
		defer fmt.Fprintln(out, rejected)
	}
	switch res.Outcome {
	case orchestrator.AlreadyRunning:
		fmt.Fprintf(out, "another extract run is already running (pid %d); nothing to do\n", res.HolderPID)
	case orchestrator.AlreadyComplete:
		fmt.Fprintf(out, "job already complete: %d samples in %s\n", res.Done, res.OutputDir)
	case orchestrator.Stopped:
		fmt.Fprintf(out, "stopped: %d of %d samples done; continue with `extract run --resume`\n", res.Done, res.Total)
		return exitCodeError{code: exitTempFail, err: errors.New("stopped before the job finished")}
	case orchestrator.Finished:
		fmt.Fprintf(out, "done: %d samples, %d bytes in %s (%s)\n", res.Done, res.Bytes, res.OutputDir, res.Elapsed.Round(1e6))
	}
	return nil
}

// rejectedSummary is one line on the dumps the run did not accept, or "" when there
// were none: they cost GPU time and may be a server's or a second writer's fault, so a
// run that finished must not leave them to a metric nobody reads.
func rejectedSummary(res orchestrator.Result) string {
	var n int64
	var parts []string
	for _, reason := range slices.Sorted(maps.Keys(res.Rejected)) {
		if k := res.Rejected[reason]; k > 0 {
			n += k
			parts = append(parts, fmt.Sprintf("%s %d", reason, k))
		}
	}
	if n == 0 {
		return ""
	}
	line := fmt.Sprintf("%d dumps rejected this run (%s)", n, strings.Join(parts, ", "))
	if res.Rejected["malformed"] > 0 {
		line += "; the malformed ones are kept in " + res.QuarantineDir + " for inspection"
	}
	return line + "; `extract status --json` shows the counts"
}
