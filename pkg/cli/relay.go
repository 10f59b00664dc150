package cli

import (
	"log/slog"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/spf13/cobra"

	"github.com/tendril-net/tendril/pkg/health"
	"github.com/tendril-net/tendril/pkg/hubble/relay"
	"github.com/tendril-net/tendril/pkg/version"
)

// newRelayCommand runs the Hubble relay in the foreground: a long-running
// process of its own (a subcommand of this binary so the lab and users need
// no other executable), serving one Observer API over every node's.
func newRelayCommand(*Options) *cobra.Command {
	h := hive.New(
		job.Cell,
		cell.Provide(
			func() cell.Health { return health.NewRegistry().Scope("hubble-relay") },
			func() relay.Version { return relay.Version(version.Version) },
		),
		relay.Cell,
		relay.MetricsCell,
	)
	cmd := &cobra.Command{
		Use:   "relay",
		Short: "Run the Hubble relay: one Observer API (hubble, tendril observe) over every node of the cluster",
		Long: `Run the Hubble relay until interrupted. It finds the nodes through the Peer
service of a local agent (--peer-service), connects to each node's Hubble API
(TLS with --tls-hubble-server-ca-files and a client certificate, or
--disable-client-tls) and serves the Observer API merging them on
--listen-address (default ` + relay.DefaultListenAddress + `, where hubble looks by default).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), nil))
			return h.Run(log)
		},
	}
	h.RegisterFlags(cmd.Flags())
	return cmd
}
