package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"

	"github.com/cilium/cilium/api/v1/models"
	"github.com/spf13/cobra"
	"golang.org/x/sync/errgroup"

	"github.com/tendril-net/tendril/pkg/client"
	"github.com/tendril-net/tendril/pkg/policy/api"
	"github.com/tendril-net/tendril/pkg/ui"
)

// DefaultUIListen is where `tendril ui` serves by default: loopback only,
// since the page shows every flow of the cluster and has no login.
const DefaultUIListen = "127.0.0.1:12000"

func newUICommand(*Options) *cobra.Command {
	var relay, listen, agent string
	var history, allowedHosts []string
	var capacity int
	var relayTLS ui.RelayTLS
	cmd := &cobra.Command{
		Use:   "ui",
		Short: "Serve the web UI: service map, live flows and policy view over the relay's Observer API",
		Long: `Serve a web UI over the Observer API of the relay (or one node): a service map per
namespace (workloads, Services, the world and the host, with the observed traffic's
protocol, port, rate and verdict; drops in red with the policy that dropped them), a flow
table with hubble observe's filters, following live or over a time range, and a policy view
(the policies acting on a workload with their verdicts, the policy suggested from its flows,
and what-if for a pasted policy). It keeps the last --capacity flows; --history-file
makes flow export files searchable for older ones. Its assets are in the
binary: it needs nothing from the Internet. A relay serving TLS (its
--tls-relay-server-cert-file) is reached with --tls-relay-server-ca-files, and with
--tls-client-cert-file and --tls-client-key-file when it requires a client certificate
(mTLS); any of the TLS flags turns TLS on. --agent names an agent's API whose rules in
force what-if compares with (without it: with no rules).`,
		Args:              cobra.NoArgs,
		PersistentPreRunE: func(*cobra.Command, []string) error { return nil },
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			log := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), nil))
			cfg := ui.Config{Relay: relay, Capacity: capacity, HistoryFiles: history, AllowedHosts: allowedHosts}
			if relayTLS.Enabled() {
				tc, err := relayTLS.Config(relay)
				if err != nil {
					return fmt.Errorf("TLS to the relay: %w", err)
				}
				cfg.RelayTLS = tc
			}
			if agent != "" {
				c, err := client.New(agent)
				if err != nil {
					return fmt.Errorf("--agent %s: %w", agent, err)
				}
				cfg.RulesSource = agent
				cfg.Rules = func(ctx context.Context) (api.Rules, error) {
					var pol models.Policy
					if err := c.Do(ctx, http.MethodGet, "/policy", nil, nil, nil, &pol); err != nil {
						return nil, err
					}
					var rules api.Rules
					if err := json.Unmarshal([]byte(pol.Policy), &rules); err != nil {
						return nil, fmt.Errorf("the agent's rules: %w", err)
					}
					return rules, nil
				}
			}
			l, err := net.Listen("tcp", listen)
			if err != nil {
				return fmt.Errorf("--listen %s: %w", listen, err)
			}
			s := ui.New(cfg, log)
			tlsNote := ""
			if cfg.RelayTLS != nil {
				tlsNote = " over TLS"
			}
			fmt.Fprintf(cmd.OutOrStdout(), "Tendril UI on http://%s (flows from %s%s)\n", l.Addr(), relay, tlsNote)
			g, gctx := errgroup.WithContext(ctx)
			g.Go(func() error { return s.ReadRelay(gctx) })
			g.Go(func() error { return s.Serve(gctx, l) })
			if err := g.Wait(); err != nil && !errors.Is(err, context.Canceled) {
				return err
			}
			return nil
		},
	}
	def := os.Getenv("TENDRIL_HUBBLE_SERVER")
	if def == "" {
		def = "localhost:4245"
	}
	f := cmd.Flags()
	f.StringVar(&relay, "relay", def, "Observer API to read flows from: the relay's host:port or unix://PATH ($TENDRIL_HUBBLE_SERVER)")
	f.StringVar(&listen, "listen", DefaultUIListen, "Address to serve the UI on (host:port)")
	f.StringVar(&agent, "agent", "", "An agent's API (unix://PATH) whose rules in force what-if compares with")
	f.IntVar(&capacity, "capacity", ui.DefaultCapacity, "How many recent flows the UI keeps")
	f.StringSliceVar(&allowedHosts, "allowed-host", nil, "Host names the page may be reached by besides addresses and localhost (behind a proxy or an ingress); others are refused (repeatable)")
	// The relay's own names for client TLS (--tls-client-cert-file,
	// --tls-client-key-file; --tls-hubble-server-ca-files there is the
	// nodes' CAs, here the relay's), as hubble-ui's TLS_RELAY_* settings.
	f.StringSliceVar(&relayTLS.CAFiles, "tls-relay-server-ca-files", nil, "PEM CAs of the relay's server certificate (turns TLS on; without it, but with another TLS flag: the system's roots)")
	f.StringVar(&relayTLS.CertFile, "tls-client-cert-file", "", "PEM certificate the UI presents to the relay (for a relay with --tls-relay-client-ca-files: mTLS)")
	f.StringVar(&relayTLS.KeyFile, "tls-client-key-file", "", "PEM key of --tls-client-cert-file")
	f.StringVar(&relayTLS.ServerName, "tls-relay-server-name", "", "Name the relay's certificate must carry (default: the host of --relay)")
	f.StringSliceVar(&history, "history-file", nil, "Flow export files (an agent's --hubble-export-file-path; its rotated FILE.N are read too) the page searches for history beyond the ring (repeatable)")
	return cmd
}
