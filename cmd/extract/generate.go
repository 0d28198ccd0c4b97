package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/extract-dev/extract/orchestrator"
	"github.com/extract-dev/extract/orchestrator/generate"
)

type generateFlags struct {
	from, to      string
	resume, fresh bool
	report        bool
	worst         int
	asJSON        bool
}

func newGenerateCmd() *cobra.Command {
	var cf configFlags
	var f generateFlags
	cmd := &cobra.Command{
		Use:   "generate --from CONVERSATIONS --to OUT.jsonl [--config F] [--resume | --fresh] [--report]",
		Short: "Regenerate every assistant turn with the target on the supervised servers; resumable",
		Long: `generate drops the assistant turns of each conversation and regenerates them in order
with the target, each conditioned on the regenerated history, on the servers extract
launches and supervises (server.kind, server.replicas, --shard). OUT.jsonl has one line
per conversation in input order: id, messages (OpenAI form), input_ids (the template's
prompt ids and the ids the server generated) and loss_mask. Each finished conversation
is recorded in state_dir/generate/index.db before it counts; kill it and run it again
with --resume: only what is missing is sent. --report prints the counts, the validation
flags and the worst lines. See docs/generate.md.

--from defaults to the config's dataset, --to to generate.to (default
<state_dir>/generate/generated.jsonl); with --shard and --to, each shard writes
OUT.shard-<i>-of-<n>.jsonl.

Exit codes: 0 generated; 1 failed; 2 bad config, input or a changed index; 75 stopped
or servers down (worth a retry).`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			opt := prepareOptions{from: f.from, to: f.to}
			if f.to != "" {
				opt.to = filepath.Dir(f.to) // stands in for output_dir without a config
			}
			cfg, err := loadForPrepare(cmd, &cf, opt)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if f.report {
				rep, err := generate.ReadReport(orchestrator.GenerateDir(cfg), f.worst)
				if err != nil {
					return err
				}
				if f.asJSON {
					return printJSON(out, rep)
				}
				printGenerateReport(out, rep)
				return nil
			}
			stderr := cmd.ErrOrStderr()
			log, closeLog, err := newLogger(cfg, stderr)
			if err != nil {
				return err
			}
			defer closeLog()
			exe, err := os.Executable()
			if err != nil {
				return fmt.Errorf("find own executable: %w", err)
			}
			gopt := orchestrator.GenerateOptions{From: f.from, To: f.to, Resume: f.resume, Fresh: f.fresh, Executable: exe, Log: log}
			if tty, ok := stderr.(*os.File); ok && isTerminal(tty) {
				gopt.OnStatus = func(s generate.Status) { fmt.Fprintf(tty, "\r\x1b[K%s", generateBar(s)) }
				defer fmt.Fprint(tty, "\r\x1b[K")
			}
			sum, err := orchestrator.Generate(cmd.Context(), cfg, gopt)
			if err != nil {
				return err
			}
			if f.asJSON {
				return printJSON(out, sum)
			}
			state := "generated"
			if sum.AlreadyDone {
				state = "already generated"
			}
			fmt.Fprintf(out, "%s %s: %d conversations, %d done, %d dropped, %d failed; %d tokens generated (%s)\n",
				state, sum.Output, sum.Total, sum.Done, sum.Dropped, sum.Failed, sum.Generated, sum.Elapsed.Round(time.Millisecond))
			if sum.Dropped+sum.Failed > 0 {
				fmt.Fprintln(out, "see `extract generate --report` for the reasons")
			}
			return nil
		},
	}
	cf.register(cmd)
	cmd.Flags().StringVar(&f.from, "from", "", "conversation JSONL (default: the config's dataset)")
	cmd.Flags().StringVar(&f.to, "to", "", "the regenerated JSONL (default: generate.to)")
	cmd.Flags().BoolVar(&f.resume, "resume", false, "continue the generate recorded in the index")
	cmd.Flags().BoolVar(&f.fresh, "fresh", false, "forget the index's records and generate everything again")
	cmd.Flags().BoolVar(&f.report, "report", false, "print the counts, flags and worst lines from the index; generate nothing")
	cmd.Flags().IntVar(&f.worst, "worst", 20, "lines --report lists")
	cmd.Flags().BoolVar(&f.asJSON, "json", false, "print the summary or report as JSON")
	return cmd
}

// generateBar is the TTY line: counts, tokens generated per second, ETA.
func generateBar(s generate.Status) string {
	fin := s.Total - s.Pending
	eta := "-"
	if s.ETASeconds > 0 {
		eta = (time.Duration(s.ETASeconds) * time.Second).String()
	}
	return fmt.Sprintf("generate %d/%d (%d dropped, %d failed) %.0f tok/s %.1f conv/s ETA %s", fin, s.Total, s.Dropped, s.Failed, s.TokensPerSecond, s.ConversationsPerSecond, eta)
}

// generateLine is the generate stage in status: counts, rate, ETA.
func generateLine(s generate.Status) string {
	line := fmt.Sprintf("generate:  %s, %d / %d conversations done, %d dropped, %d failed, %d pending; %d tokens generated",
		s.State, s.Done, s.Total, s.Dropped, s.Failed, s.Pending, s.GeneratedTokens)
	if s.State == "running" {
		line += fmt.Sprintf("; %.0f tokens/s, %.2f conversations/s", s.TokensPerSecond, s.ConversationsPerSecond)
	}
	return line
}

func printGenerateReport(w io.Writer, r generate.Report) {
	fmt.Fprintf(w, "generate: %d conversations: %d done, %d dropped, %d failed, %d pending; %d tokens generated in %d requests\n",
		r.Total, r.Done, r.Dropped, r.Failed, r.Pending, r.Generated, r.Requests)
	if r.Output != "" {
		fmt.Fprintf(w, "output: %s\n", r.Output)
	}
	for _, f := range []string{"empty", "length", "think", "only_stop"} {
		fmt.Fprintf(w, "  flag %-10s %d\n", f, r.Flags[f])
	}
	if len(r.Worst) > 0 {
		fmt.Fprintln(w, "worst lines:")
	}
	for _, l := range r.Worst {
		fmt.Fprintf(w, "  line %d id %q %s flags %v %s\n", l.Line, l.ID, l.State, l.Flags, l.Reason)
	}
}
