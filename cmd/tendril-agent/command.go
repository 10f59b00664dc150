package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/tendril-net/tendril/pkg/agent"
	"github.com/tendril-net/tendril/pkg/logging"
	"github.com/tendril-net/tendril/pkg/option"
	"github.com/tendril-net/tendril/pkg/startgc"
	"github.com/tendril-net/tendril/pkg/version"
)

// newCommand returns the tendril-agent command: it resolves the config
// (flags > TENDRIL_* > config dir > defaults), builds the agent and runs it
// until SIGINT or SIGTERM.
func newCommand(stderr io.Writer) *cobra.Command {
	cfg := agent.DefaultConfig()
	cmd := &cobra.Command{
		Use:           "tendril-agent",
		Short:         "Tendril node agent: eBPF networking, security and observability",
		Version:       version.String(),
		SilenceUsage:  true,
		SilenceErrors: true,
		Args:          cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			fs := cmd.Flags()
			if !fs.Changed("config-dir") {
				if v, ok := os.LookupEnv(option.EnvName("config-dir")); ok {
					cfg.ConfigDir = v
				}
			}
			sources, err := option.Resolver{ConfigDir: cfg.ConfigDir}.Resolve(fs)
			if err != nil {
				return fmt.Errorf("invalid configuration: %w", err)
			}
			log, level, err := logging.New(stderr, cfg.LogFormat, cfg.Debug)
			if err != nil {
				return fmt.Errorf("invalid configuration: %w", err)
			}
			a, err := agent.New(cfg, agent.Deps{Log: log, LogLevel: level, Flags: fs, Sources: sources, Ready: startgc.Done})
			if err != nil {
				return fmt.Errorf("invalid configuration: %w", err)
			}
			ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			return a.Run(ctx, 4*time.Second)
		},
	}
	cfg.Flags(cmd.Flags())
	return cmd
}
