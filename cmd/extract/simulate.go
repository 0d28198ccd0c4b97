package main

import (
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/extract-dev/extract/sglang/simulator"
)

// newSimulateCmd is the hidden command that server.kind=simulator launches: the
// simulator as its own process, so supervision is exercised exactly as for SGLang.
func newSimulateCmd() *cobra.Command {
	var cfg simulator.Config
	cmd := &cobra.Command{
		Use:          "simulate",
		Short:        "Serve a simulated SGLang server with the dump hook (for tests and demos)",
		Hidden:       true,
		Args:         cobra.NoArgs,
		SilenceUsage: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return simulator.Run(ctx, cfg, slog.New(slog.NewJSONHandler(os.Stderr, nil)))
		},
	}
	cfg.BindFlags(cmd.Flags())
	return cmd
}
