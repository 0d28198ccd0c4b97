package main

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/extract-dev/extract/configs"
	"github.com/extract-dev/extract/orchestrator"
	"github.com/spf13/cobra"
)

func runStatusAll(cmd *cobra.Command, cf *configFlags, asJSON bool, watch time.Duration) error {
	cfg, err := cf.load(cmd)
	if err != nil {
		return err
	}
	return watchLoop(cmd.Context(), cmd.OutOrStdout(), watch, asJSON, func(out io.Writer) error {
		js, err := orchestrator.QueryStatusAll(cmd.Context(), cfg)
		if err != nil {
			return err
		}
		if asJSON {
			return printJSON(out, js)
		}
		printStatusAll(out, js)
		return nil
	})
}

func printStatusAll(w io.Writer, js orchestrator.JobStatus) {
	pct := 0.0
	if js.Total > 0 {
		pct = 100 * float64(js.Done) / float64(js.Total)
	}
	eta := "unknown"
	if js.ETASeconds >= 0 {
		eta = (time.Duration(js.ETASeconds) * time.Second).String()
	}
	fmt.Fprintf(w, "job:       %s, %d shards (%s)\n", js.State, js.Shards, js.StateDir)
	fmt.Fprintf(w, "progress:  %d / %d samples (%.1f%%), %d failed, %d pending\n", js.Done, js.Total, pct, js.Failed, js.Pending)
	fmt.Fprintf(w, "written:   %s\n", configs.ByteSize(js.BytesWritten))
	fmt.Fprintf(w, "rate:      %.2f samples/s; ETA %s\n", js.SamplesPerSecond, eta)
	if len(js.Dead) > 0 {
		fmt.Fprintf(w, "dead:      shards %v (no live process, not complete): resubmit them\n", js.Dead)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "shard\tstate\trange\tdone\tfailed\tpending\twritten\trate/s\tpid\tsource")
	for _, r := range js.PerShard {
		state := r.State
		if r.Dead {
			state += " (dead)"
		}
		if r.Error != "" {
			state += ": " + r.Error
		}
		pid := ""
		if r.PID > 0 {
			pid = fmt.Sprint(r.PID)
			if r.Host != "" {
				pid += "@" + r.Host
			}
		}
		fmt.Fprintf(tw, "%d/%d\t%s\t%d-%d\t%d/%d\t%d\t%d\t%s\t%.2f\t%s\t%s\n", r.Shard, js.Shards, state, r.First, r.End,
			r.Done, r.Total, r.Failed, r.Pending, configs.ByteSize(r.BytesWritten), r.SamplesPerSecond, pid, r.Source)
	}
	if err := tw.Flush(); err != nil {
		fmt.Fprintf(w, "(the shard table could not be written: %v)\n", err)
	}
	if js.Generate != nil {
		fmt.Fprintf(w, "%s\n", generateLine(*js.Generate))
		for _, r := range js.PerShard {
			if r.Generate != nil {
				fmt.Fprintf(w, "  shard %d/%d %s\n", r.Shard, js.Shards, generateLine(*r.Generate))
			}
		}
	}
	fmt.Fprintf(w, "output:    %s\n", js.OutputDir)
}
