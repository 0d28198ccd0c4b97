// Command extract runs an EAGLE-3 hidden-state extraction job end to end: it supervises
// the SGLang server, moves its dumps to disk, and resumes exactly after any crash.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"

	"github.com/extract-dev/extract/configs"
	"github.com/extract-dev/extract/dataset"
	"github.com/extract-dev/extract/orchestrator"
	"github.com/spf13/cobra"
)

// Exit codes of the CLI contract.
const (
	exitOK        = 0
	exitFailed    = 1
	exitUsage     = 2
	exitPreflight = 3
	exitTempFail  = 75
)

// usageError marks a mistake on the command line (exit 2).
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func main() {
	survivePipeClose()
	// The first signal starts a graceful stop; a second one kills at once.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	go func() {
		<-ctx.Done()
		stop()
	}()
	root := newRootCmd()
	stopProfiles := startProfiles(os.Args)
	err := root.ExecuteContext(ctx)
	stopProfiles()
	if err != nil {
		fmt.Fprintln(os.Stderr, "extract:", err)
	}
	os.Exit(exitCode(err))
}

func exitCode(err error) int {
	var ue usageError
	var ec exitCodeError
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &ec):
		return ec.code
	case errors.As(err, &ue), errors.Is(err, configs.ErrInvalid), errors.Is(err, dataset.ErrBad), errors.Is(err, orchestrator.ErrRefused):
		return exitUsage
	case errors.Is(err, orchestrator.ErrPreflight):
		return exitPreflight
	case errors.Is(err, orchestrator.ErrTemporary):
		return exitTempFail
	}
	return exitFailed
}

// exitCodeError carries a specific exit code with its message.
type exitCodeError struct {
	code int
	err  error
}

func (e exitCodeError) Error() string { return e.err.Error() }
func (e exitCodeError) Unwrap() error { return e.err }

func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:           "extract",
		Short:         "Crash-safe hidden-state extraction for EAGLE-3 training",
		SilenceUsage:  true,
		SilenceErrors: true,
		Args:          unknownCommand,
		RunE:          func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
		Version:       versionLine(),
	}
	root.SetVersionTemplate("{{.Version}}\n")
	root.SuggestionsMinimumDistance = 2
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		return usageError{fmt.Errorf("%v (see `%s --help`)", err, c.CommandPath())}
	})
	root.AddCommand(newRunCmd(), newStatusCmd(), newDoctorCmd(), newStopCmd(), newVerifyCmd(), newSimulateCmd(), newImportCmd(), newExportCmd(), newPlanCmd(), newPrepareCmd(), newVocabCmd(), newReportCmd(), newGenerateCmd())
	return root
}

// unknownCommand refuses a word that names no command, suggesting the nearest ones:
// with Args set, cobra hands the root's unknown words to it instead of suggesting.
func unknownCommand(cmd *cobra.Command, args []string) error {
	if len(args) == 0 {
		return nil
	}
	msg := fmt.Sprintf("unknown command %q", args[0])
	if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
		msg += "; did you mean " + strings.Join(s, " or ") + "?"
	}
	return usageError{fmt.Errorf("%s (see `extract --help`)", msg)}
}

// noArgs refuses positional arguments as a usage error (exit 2).
func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usageError{fmt.Errorf("%s takes no arguments, got %q (see `%s --help`)", cmd.CommandPath(), args, cmd.CommandPath())}
	}
	return nil
}

// configFlags are the flags every command that reads the config shares.
type configFlags struct {
	file  string
	shard string
}

// register adds the config flags to cmd, but those named in omit: a command's help lists
// only the flags it acts on (plan splits the job, so it takes no --shard; only run and
// doctor use the status endpoint's address).
func (f *configFlags) register(cmd *cobra.Command, omit ...string) {
	fl := cmd.Flags()
	fl.StringVarP(&f.file, "config", "c", os.Getenv("EXTRACT_CONFIG"), "config file (YAML); env EXTRACT_CONFIG")
	fl.String("dataset", "", "dataset JSONL (config key dataset)")
	fl.String("output-dir", "", "output directory (config key output_dir)")
	fl.String("state-dir", "", "state directory (config key state_dir; default <output_dir>/.extract)")
	fl.String("shm-dir", "", "staging directory on tmpfs (config key shm_dir)")
	if !slices.Contains(omit, "status-listen") {
		fl.String("status-listen", "", "host:port of the live status and metrics endpoint (config key status.listen)")
	}
	if !slices.Contains(omit, "shard") {
		fl.StringVar(&f.shard, "shard", "", "this run's shard of a job split across nodes: i/n, or auto (Slurm array / Kubernetes Indexed Job), auto/n (config keys shard.index, shard.count)")
	}
}

func (f *configFlags) load(cmd *cobra.Command) (*configs.Config, error) {
	var bound []configs.Flag
	for key, name := range map[string]string{
		"dataset": "dataset", "output_dir": "output-dir", "state_dir": "state-dir",
		"shm_dir": "shm-dir", "status.listen": "status-listen",
	} {
		if fl := cmd.Flags().Lookup(name); fl != nil && fl.Changed {
			bound = append(bound, configs.Flag{Key: key, Flag: fl})
		}
	}
	return configs.LoadShard(f.file, bound, f.shard)
}
