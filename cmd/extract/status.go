package main

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/extract-dev/extract/configs"
	"github.com/extract-dev/extract/orchestrator"
	"github.com/spf13/cobra"
)

func newStatusCmd() *cobra.Command {
	var cf configFlags
	var asJSON bool
	var watch time.Duration
	var all bool
	var sample int
	var sourceID string
	cmd := &cobra.Command{
		Use:   "status [--config F] [--shard i/n | --all] [--json] [--watch 2s] [--sample N | --source-id ID]",
		Short: "Show the job's progress: live from the running process, else from the index",
		Long: `Show the job's progress: live from the running process, else from the index (never
waiting on its lock). --all shows the whole job across its shards; --watch refreshes
until interrupted (on a terminal it redraws the screen; into a pipe it appends).
--sample N shows one sample: its state, attempts, output file and the id of the
conversation it came from; --source-id ID finds the samples of that conversation.
Exit codes: 0 shown; 2 bad config or usage, or no such sample; 75 the run holds the
index and did not answer (try again).`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			bySample, byID := cmd.Flags().Changed("sample"), cmd.Flags().Changed("source-id")
			if bySample || byID {
				if all || watch > 0 || (bySample && byID) || (bySample && sample < 0) || (byID && sourceID == "") {
					return usageError{fmt.Errorf("--sample N (N >= 0) or --source-id ID (not empty), alone: not with each other, --all or --watch")}
				}
				q := orchestrator.SampleQuery{Sample: sample, SourceID: sourceID}
				if byID {
					q.Sample = -1
				}
				return runStatusSamples(cmd, &cf, q, asJSON)
			}
			if all {
				return runStatusAll(cmd, &cf, asJSON, watch)
			}
			return runStatus(cmd, &cf, asJSON, watch)
		},
	}
	cf.register(cmd, "status-listen")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cmd.Flags().DurationVar(&watch, "watch", 0, "refresh every interval (e.g. 2s) until interrupted")
	cmd.Flags().BoolVar(&all, "all", false, "the whole job across every shard under the state dir (per-shard rows, dead shards)")
	cmd.Flags().IntVar(&sample, "sample", 0, "show this sample (its index in the dataset)")
	cmd.Flags().StringVar(&sourceID, "source-id", "", "show the samples of this conversation id (the dataset's \"id\")")
	return cmd
}

func runStatusSamples(cmd *cobra.Command, cf *configFlags, q orchestrator.SampleQuery, asJSON bool) error {
	cfg, err := cf.load(cmd)
	if err != nil {
		return err
	}
	ss, err := orchestrator.QuerySamples(cmd.Context(), cfg, q)
	if err != nil {
		return err
	}
	out := cmd.OutOrStdout()
	if asJSON {
		return printJSON(out, ss)
	}
	for i, s := range ss {
		if i > 0 {
			fmt.Fprintln(out)
		}
		src := "no source id"
		if s.SourceID != "" {
			src = "source id " + shown(s.SourceID)
		}
		from := "the index"
		if s.Source == "live" {
			from = "the running job"
		}
		fmt.Fprintf(out, "sample:    %d (%s; from %s)\n", s.Sample, src, from)
		fmt.Fprintf(out, "state:     %s", s.State)
		if s.Attempt > 0 {
			fmt.Fprintf(out, " (attempt %d, rid %s)", s.Attempt, s.RID)
		}
		fmt.Fprintln(out)
		if s.File != "" {
			imported := ""
			if s.Imported {
				imported = ", imported"
			}
			fmt.Fprintf(out, "file:      %s (%s, %d tokens, crc32c %s%s)\n", s.File, configs.ByteSize(s.Bytes), s.Tokens, s.CRC32C, imported)
		}
		if s.Error != "" {
			fmt.Fprintf(out, "error:     %s\n", shown(s.Error))
		}
		if s.Updated != nil {
			fmt.Fprintf(out, "updated:   %s\n", s.Updated.Format(time.RFC3339))
		}
	}
	return nil
}

func runStatus(cmd *cobra.Command, cf *configFlags, asJSON bool, watch time.Duration) error {
	cfg, err := cf.load(cmd)
	if err != nil {
		return err
	}
	// watchLoop renders each snapshot into a buffer: whether a sparkline fits is the
	// terminal's question, asked once of the real output.
	sparkline := watch > 0 && isTerminalWriter(cmd.OutOrStdout())
	return watchLoop(cmd.Context(), cmd.OutOrStdout(), watch, asJSON, func(out io.Writer) error {
		st, err := orchestrator.QueryStatus(cmd.Context(), cfg)
		if err != nil {
			return err
		}
		st.Generate = orchestrator.GenerateStatus(cfg.StateDir)
		if asJSON {
			return printJSON(out, st)
		}
		printStatus(out, st)
		if sparkline {
			printSparkline(out, cfg)
		}
		return nil
	})
}

func printStatus(w io.Writer, st orchestrator.Status) {
	pct := 0.0
	if st.Total > 0 {
		pct = 100 * float64(st.Done) / float64(st.Total)
	}
	fmt.Fprintf(w, "state:     %s (%s", st.State, st.Source)
	if st.PID > 0 {
		fmt.Fprintf(w, ", pid %d", st.PID)
	}
	fmt.Fprintln(w, ")")
	fmt.Fprintf(w, "progress:  %d / %d samples (%.1f%%), %d failed, %d pending, %d in flight\n", st.Done, st.Total, pct, st.Failed, st.Pending, st.Inflight)
	if st.Imported > 0 {
		fmt.Fprintf(w, "imported:  %d of the done samples (extract import), %d computed\n", st.Imported, st.Done-st.Imported)
	}
	fmt.Fprintf(w, "written:   %s\n", configs.ByteSize(st.BytesWritten))
	if st.State == "running" {
		eta := "unknown"
		if st.ETASeconds >= 0 {
			eta = (time.Duration(st.ETASeconds) * time.Second).String()
		}
		fmt.Fprintf(w, "rate:      %.2f samples/s, %.0f tokens/s, %s/s; ETA %s\n", st.SamplesPerSecond, st.TokensPerSecond, configs.ByteSize(st.BytesPerSecond), eta)
		if len(st.Servers) > 1 {
			for _, s := range st.Servers {
				fmt.Fprintf(w, "replica %d: %s (pid %d, port %d, adopted %v, restarts %d), %d in flight (%d tokens)\n", s.Replica, s.State, s.PID, s.Port, s.Adopted, s.Restarts, s.Inflight, s.InflightTokens)
			}
		} else {
			fmt.Fprintf(w, "server:    %s (pid %d, adopted %v, restarts %d)\n", st.Server.State, st.Server.PID, st.Server.Adopted, st.Server.Restarts)
		}
	}
	for _, g := range st.GPUs {
		util := "?"
		if g.UtilizationPct >= 0 {
			util = fmt.Sprintf("%d%%", g.UtilizationPct)
		}
		fmt.Fprintf(w, "gpu %d:     %s, %s of %s used, %s busy, %d processes\n", g.Index, g.Name,
			configs.ByteSize(g.MemoryUsedBytes), configs.ByteSize(g.MemoryTotalBytes), util, g.Processes)
	}
	if len(st.Paused) > 0 {
		fmt.Fprintf(w, "paused:    %s\n", strings.Join(st.Paused, "; "))
	}
	for reason, n := range st.Rejected {
		fmt.Fprintf(w, "rejected:  %d %s\n", n, reason)
	}
	if st.Generate != nil {
		fmt.Fprintln(w, generateLine(*st.Generate))
	}
	fmt.Fprintf(w, "output:    %s\n", st.OutputDir)
}

// shown is text from the dataset or a dump as a terminal may print it: quoted where it
// holds a newline, an escape or another unprintable rune, which would forge a line.
func shown(s string) string {
	for _, r := range s {
		if !strconv.IsPrint(r) {
			return strconv.Quote(s)
		}
	}
	return s
}
