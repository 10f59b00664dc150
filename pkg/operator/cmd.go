package operator

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/klog/v2"
)

// NewCommand is tendril-operator's command line: the hive's flags plus
// --log-level; it runs until SIGINT or SIGTERM.
func NewCommand(stderr io.Writer) *cobra.Command {
	h := New()
	var logLevel string
	var stopTimeout time.Duration
	cmd := &cobra.Command{
		Use:           "tendril-operator",
		Short:         "Tendril's cluster-wide jobs: identity, endpoint and node GC, with leader election",
		SilenceUsage:  true,
		SilenceErrors: true,
		Args:          cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var level slog.Level
			if err := level.UnmarshalText([]byte(logLevel)); err != nil {
				return fmt.Errorf("log-level: %w", err)
			}
			log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
			// client-go (leader election, informers) logs through klog.
			klog.SetSlogLogger(log.With("module", "client-go"))
			if err := h.Populate(log); err != nil {
				return fmt.Errorf("build the operator: %w", err)
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			if err := h.Start(log, ctx); err != nil {
				stopCtx, cancel := context.WithTimeout(context.Background(), stopTimeout)
				defer cancel()
				_ = h.Stop(log, stopCtx)
				return fmt.Errorf("start: %w", err)
			}
			log.Info("tendril-operator started")
			<-ctx.Done()
			stopCtx, cancel := context.WithTimeout(context.Background(), stopTimeout)
			defer cancel()
			return h.Stop(log, stopCtx)
		},
	}
	h.RegisterFlags(cmd.Flags())
	cmd.Flags().StringVar(&logLevel, "log-level", "info", "Log level: debug, info, warn, error")
	cmd.Flags().DurationVar(&stopTimeout, "stop-timeout", 30*time.Second, "How long the stop may take")
	return cmd
}
