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

// newCommand returns the tendril-agent command: its flags are the agent's
// cells' (each cell owns its own); it resolves them (flags > TENDRIL_* >
// config dir > defaults), builds the agent from them and runs it until
// SIGINT or SIGTERM.
func newCommand(stderr io.Writer) *cobra.Command {
	a := agent.New()
	cmd := &cobra.Command{
		Use:           "tendril-agent",
		Short:         "Tendril node agent: eBPF networking, security and observability",
		Version:       version.String(),
		SilenceUsage:  true,
		SilenceErrors: true,
		Args:          cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			fs := cmd.Flags()
			configDir, err := fs.GetString("config-dir")
			if err != nil {
				return err
			}
			if !fs.Changed("config-dir") {
				if v, ok := os.LookupEnv(option.EnvName("config-dir")); ok {
					configDir = v
				}
			}
			// The environment and the config directory set the flags the
			// command line did not, before the cells read them.
			sources, err := option.Resolver{ConfigDir: configDir}.Resolve(fs)
			if err != nil {
				return fmt.Errorf("invalid configuration: %w", err)
			}
			// The log options are read before the hive is built: it logs.
			format, err := fs.GetString("log-format")
			if err != nil {
				return err
			}
			debug, err := fs.GetBool("debug")
			if err != nil {
				return err
			}
			log, level, err := logging.New(stderr, format, debug)
			if err != nil {
				return fmt.Errorf("invalid configuration: %w", err)
			}
			if err := a.Populate(agent.Deps{Log: log, LogLevel: level, Flags: fs, Sources: sources, Ready: startgc.Done}); err != nil {
				return fmt.Errorf("invalid configuration: %w", err)
			}
			ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			return a.Run(ctx, 4*time.Second)
		},
	}
	a.RegisterFlags(cmd.Flags())
	return cmd
}
