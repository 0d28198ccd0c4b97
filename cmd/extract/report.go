package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/extract-dev/extract/configs"
	"github.com/extract-dev/extract/internal/atomicfile"
	"github.com/extract-dev/extract/internal/report"
	"github.com/extract-dev/extract/orchestrator"
	"github.com/spf13/cobra"
)

// reportOptions are the report command's choices.
type reportOptions struct {
	all bool
	out string // "" writes HTML to stdout
}

func newReportCmd() *cobra.Command {
	var cf configFlags
	var opt reportOptions
	cmd := &cobra.Command{
		Use:   "report [--config F] [--all] [--out F.html|F.png]",
		Short: "Draw the job's history: progress and ETA, rate per replica, restarts, pauses, failures, disk against its reserve",
		Long: `Draw the job's history, kept by every run in <state_dir>/history.log, with the
facts status gives: one self-contained HTML page (inline SVG; it fetches nothing) or a
PNG. Without --out the page goes to stdout. With --all, every shard of the plan under
the state dir, added up. A running job's status endpoint serves the same page at
/report and /report.png.

Exit codes: 0 written; 1 failed; 2 bad usage (an --out that is neither .html nor .png).`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if _, err := reportWriter(opt.out); err != nil {
				return err
			}
			cfg, err := cf.load(cmd)
			if err != nil {
				return err
			}
			return runReport(cmd.Context(), cfg, opt, cmd.OutOrStdout())
		},
	}
	cf.register(cmd)
	cmd.Flags().BoolVar(&opt.all, "all", false, "the whole job across every shard under the state dir")
	cmd.Flags().StringVarP(&opt.out, "out", "o", "", "write to this file: .html (or .htm) for the page, .png for the picture")
	return cmd
}

func runReport(ctx context.Context, cfg *configs.Config, opt reportOptions, stdout io.Writer) error {
	write, err := reportWriter(opt.out)
	if err != nil {
		return err
	}
	in, err := orchestrator.ReportInput(ctx, cfg, opt.all)
	if err != nil {
		return err
	}
	var b bytes.Buffer
	if err := write(&b, in); err != nil {
		return fmt.Errorf("draw the report: %w", err)
	}
	if opt.out == "" {
		_, err := stdout.Write(b.Bytes())
		return err
	}
	return atomicfile.WriteFile(opt.out, b.Bytes(), 0o644)
}

// reportWriter is the format --out names by its extension: HTML without one.
func reportWriter(out string) (func(io.Writer, report.Input) error, error) {
	switch ext := strings.ToLower(filepath.Ext(out)); {
	case out == "", ext == ".html", ext == ".htm":
		return report.WriteHTML, nil
	case ext == ".png":
		return report.WritePNG, nil
	}
	return nil, usageError{fmt.Errorf("--out %s: want a .html or a .png file", out)}
}

// sparkSpan and sparkWidth are what `status --watch` draws: the last minutes' rate.
const (
	sparkSpan  = 10 * time.Minute
	sparkWidth = 60
)

// printSparkline writes the job's rate over the last minutes as one line of blocks,
// from its history; nothing when there is none yet.
func printSparkline(w io.Writer, cfg *configs.Config) {
	rates, hi, span := orchestrator.RecentRates(cfg, sparkSpan, sparkWidth)
	if span <= 0 {
		return
	}
	fmt.Fprintf(w, "rate, last %s: %s (peak %.2f samples/s)\n", span.Round(time.Second), report.Sparkline(rates), hi)
}

// isTerminalWriter says whether w is a terminal: the sparkline is for a person watching.
func isTerminalWriter(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && isTerminal(f)
}
