package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/extract-dev/extract/configs"
	"github.com/extract-dev/extract/orchestrator/prepare"
	"github.com/spf13/cobra"
)

type prepareOptions struct {
	from, to string
	show     int
	asJSON   bool
}

func newPrepareCmd() *cobra.Command {
	var cf configFlags
	var opt prepareOptions
	cmd := &cobra.Command{
		Use:   "prepare [--from CONVERSATIONS] [--to DIR] [--show LINE] [--json]",
		Short: "Turn a conversation dataset into input_ids and exact assistant loss masks with the target's tokenizer; resumable",
		Long: `prepare tokenizes a conversation JSONL (ShareGPT, OpenAI messages, UltraChat) with the
target's own tokenizer and chat template (server.python; the simulator's contract for
server.kind simulator) into DIR/dataset.jsonl: {"input_ids", "loss_mask", "id", "line"}
per accepted conversation, the refused ones in DIR/refused.jsonl with the reason. Kill it
and run it again: it continues from its last durable chunk. --show LINE prints that
conversation with its loss spans marked and writes nothing.

--from defaults to the config's dataset, --to to <state_dir>/prepare (where extract run
keeps it). See docs/dataset.md.

Exit codes: 0 prepared; 1 failed; 2 bad config, a refused line under prepare.strict, no
conversation accepted, or DIR prepared from other inputs.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := loadForPrepare(cmd, &cf, opt)
			if err != nil {
				return err
			}
			return runPrepare(cmd.Context(), cfg, opt, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	cf.register(cmd)
	cmd.Flags().StringVar(&opt.from, "from", "", "conversation JSONL (default: the config's dataset)")
	cmd.Flags().StringVar(&opt.to, "to", "", "output directory (default: <state_dir>/prepare)")
	cmd.Flags().IntVar(&opt.show, "show", 0, "print conversation LINE (1-based) with its loss spans marked, write nothing")
	cmd.Flags().BoolVar(&opt.asJSON, "json", false, "print the summary as JSON")
	return cmd
}

// loadForPrepare loads the config with --from as its dataset. prepare needs no
// output_dir: without one, --to stands in for it, so a config-less call validates.
func loadForPrepare(cmd *cobra.Command, cf *configFlags, opt prepareOptions) (*configs.Config, error) {
	if opt.from != "" {
		if err := cmd.Flags().Set("dataset", opt.from); err != nil {
			return nil, err
		}
	}
	cfg, err := cf.load(cmd)
	if err != nil && opt.to != "" && errors.Is(err, configs.ErrInvalid) {
		if serr := cmd.Flags().Set("output-dir", opt.to); serr == nil {
			if cfg2, err2 := cf.load(cmd); err2 == nil {
				return cfg2, nil
			}
		}
	}
	return cfg, err
}

func runPrepare(ctx context.Context, cfg *configs.Config, opt prepareOptions, stdout, stderr io.Writer) error {
	level := slog.LevelInfo
	if cfg.Log.Level == "debug" {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	dir := opt.to
	if dir == "" {
		dir = prepare.Dir(cfg)
	}
	dir, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	o, err := prepare.OptionsFrom(cfg, cfg.Dataset, dir, log)
	if err != nil {
		return usageError{err}
	}
	workDir := filepath.Join(dir, ".worker")
	if opt.show > 0 {
		workDir, err = os.MkdirTemp("", "extract-prepare-show-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(workDir)
		cfg.Prepare.Workers = 1
	}
	tok, err := prepare.NewTokenizer(cfg, workDir, log)
	if err != nil {
		return exitCodeError{exitPreflight, err}
	}
	defer tok.Close()
	if opt.show > 0 {
		sh, err := prepare.Show(ctx, o, tok, opt.show)
		if err != nil {
			return classifyPrepare(err)
		}
		if opt.asJSON {
			return printJSON(stdout, sh)
		}
		sh.Render(stdout, writerIsTerminal(stdout))
		return nil
	}
	sum, err := prepare.Run(ctx, o, tok)
	if err != nil {
		return classifyPrepare(err)
	}
	if opt.asJSON {
		return printJSON(stdout, sum)
	}
	c := sum.Counts
	state := "prepared"
	if sum.AlreadyDone {
		state = "already prepared"
	}
	fmt.Fprintf(stdout, "%s %s: %d lines, %d conversations accepted (%d truncated), %d refused; %d tokens, %d in the loss\n",
		state, cfg.Dataset, c.Lines, c.Accepted, c.Truncated, c.RefusedTotal(), c.Tokens, c.Loss)
	for reason, n := range c.Refused {
		fmt.Fprintf(stdout, "  refused %-28s %d\n", reason, n)
	}
	fmt.Fprintf(stdout, "dataset: %s\nrefused: %s\n", sum.Dataset, sum.Refused)
	return nil
}

// classifyPrepare maps prepare's errors to the exit codes: its input and a changed
// prepare dir are the user's to fix (2).
func classifyPrepare(err error) error {
	if errors.Is(err, prepare.ErrBadInput) || errors.Is(err, prepare.ErrChanged) {
		return usageError{err}
	}
	return err
}

// writerIsTerminal says whether w is a terminal, for colour.
func writerIsTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && isTerminal(f)
}
