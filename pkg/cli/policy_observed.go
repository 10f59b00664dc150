package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	flowpb "github.com/cilium/cilium/api/v1/flow"
	"github.com/cilium/cilium/api/v1/models"
	observerpb "github.com/cilium/cilium/api/v1/observer"
	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/timestamppb"
	"sigs.k8s.io/yaml"

	"github.com/tendril-net/tendril/pkg/hubble"
	"github.com/tendril-net/tendril/pkg/policy/api"
	"github.com/tendril-net/tendril/pkg/policy/observed"
)

// flowSource is where the policy commands read observed flows: one or
// more Hubble APIs (each node's socket, or the relay), since a moment.
type flowSource struct {
	servers []string
	since   string
}

func (s *flowSource) flags(cmd *cobra.Command) {
	def := os.Getenv("TENDRIL_HUBBLE_SERVER")
	if def == "" {
		def = "unix://" + hubble.DefaultSocketPath
	}
	cmd.Flags().StringSliceVar(&s.servers, "server", []string{def}, "Hubble API(s) to read flows from: unix://PATH or host:port, repeatable (each node's, or the relay) ($TENDRIL_HUBBLE_SERVER)")
	cmd.Flags().StringVar(&s.since, "since", "1h", "Time window: flows since this long ago (e.g. 10m) or an RFC 3339 time")
}

// connections reads every flow in the window from each server and reduces
// them to connections.
func (s *flowSource) connections(ctx context.Context) ([]observed.Connection, int, error) {
	since, err := parseTime(s.since, time.Now())
	if err != nil {
		return nil, 0, fmt.Errorf("--since: %w", err)
	}
	var flows []*flowpb.Flow
	for _, srv := range s.servers {
		got, err := readFlows(ctx, srv, since)
		if err != nil {
			return nil, 0, err
		}
		flows = append(flows, got...)
	}
	slices.SortStableFunc(flows, func(a, b *flowpb.Flow) int { return a.GetTime().AsTime().Compare(b.GetTime().AsTime()) })
	return observed.Connections(flows), len(flows), nil
}

func readFlows(ctx context.Context, server string, since time.Time) ([]*flowpb.Flow, error) {
	conn, err := grpc.NewClient(dialTarget(server), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", server, err)
	}
	defer conn.Close()
	stream, err := observerpb.NewObserverClient(conn).GetFlows(ctx, &observerpb.GetFlowsRequest{Since: timestamppb.New(since)})
	if err != nil {
		return nil, fmt.Errorf("get flows from %s: %w", server, err)
	}
	var out []*flowpb.Flow
	for {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("get flows from %s: %w", server, err)
		}
		if f := resp.GetFlow(); f != nil {
			out = append(out, f)
		}
	}
}

func newPolicySuggestCommand() *cobra.Command {
	var src flowSource
	var opts observed.SuggestOptions
	var selector []string
	cmd := &cobra.Command{
		Use:   "suggest --namespace NS [--selector KEY=VALUE...]",
		Short: "Write NetworkPolicies that admit exactly the traffic observed (by labels, ports and protocols)",
		Long: `Reads the flows of the time window from the Hubble API(s) and writes, for each workload of
the namespace (pods grouped by their labels, without per-pod ones such as pod-template-hash),
a NetworkPolicy selecting it with both policy types that admits exactly the observed
connections to and from it: pods by their labels (and their namespace's name), the world and
other nodes by their addresses. Connections that were dropped are left out unless
--include-dropped. Apply the output with kubectl apply -f.`,
		Args:              cobra.NoArgs,
		PersistentPreRunE: func(*cobra.Command, []string) error { return nil },
		RunE: func(cmd *cobra.Command, _ []string) error {
			sel, err := parseSelector(selector)
			if err != nil {
				return err
			}
			opts.Selector = sel
			conns, nflows, err := src.connections(cmd.Context())
			if err != nil {
				return err
			}
			sugg, err := observed.Suggest(conns, opts)
			if err != nil {
				return err
			}
			if len(sugg) == 0 {
				return fmt.Errorf("no connection of a workload of namespace %q in %d flows of the window: nothing to suggest", opts.Namespace, nflows)
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "# Suggested from %d flows (%d connections) since %s by tendril policy suggest.\n", nflows, len(conns), src.since)
			for _, s := range sugg {
				b, err := yaml.Marshal(s.Policy)
				if err != nil {
					return err
				}
				fmt.Fprintf(out, "---\n# %d observed connections\n%s", s.Connections, stripStatus(b))
			}
			return nil
		},
	}
	src.flags(cmd)
	cmd.Flags().StringVarP(&opts.Namespace, "namespace", "n", "", "Namespace whose workloads get policies (required)")
	cmd.Flags().StringSliceVar(&selector, "selector", nil, "Only workloads whose pods carry these labels (KEY=VALUE, repeatable)")
	cmd.Flags().BoolVar(&opts.IncludeDropped, "include-dropped", false, "Admit connections that were dropped too")
	return cmd
}

// stripStatus drops the empty status and creationTimestamp the API types
// marshal.
func stripStatus(b []byte) []byte {
	var lines []string
	for _, l := range strings.Split(string(b), "\n") {
		if l == "status: {}" || strings.TrimSpace(l) == "creationTimestamp: null" {
			continue
		}
		lines = append(lines, l)
	}
	return []byte(strings.Join(lines, "\n"))
}

func parseSelector(kvs []string) (map[string]string, error) {
	out := map[string]string{}
	for _, kv := range kvs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("--selector %q: want KEY=VALUE", kv)
		}
		out[k] = v
	}
	return out, nil
}

func newPolicyWhatIfCommand(opts *Options) *cobra.Command {
	var src flowSource
	var file, output string
	cmd := &cobra.Command{
		Use:   "whatif -f FILE",
		Short: "List the observed connections whose verdict candidate policies would change",
		Long: `Evaluates candidate policies (NetworkPolicy, TendrilNetworkPolicy and
TendrilClusterwideNetworkPolicy objects in FILE, YAML or JSON, several documents allowed) on
top of the rules the agent enforces now (each candidate in place of the current version of
the same object) against the connections observed in the time window, and lists those whose
verdict changes, grouped by source and destination workload.`,
		Args:              cobra.NoArgs,
		PersistentPreRunE: func(*cobra.Command, []string) error { return nil },
		RunE: func(cmd *cobra.Command, _ []string) error {
			if file == "" {
				return fmt.Errorf("-f FILE is required")
			}
			data, err := os.ReadFile(file)
			if err != nil {
				return err
			}
			cands, err := observed.ParseCandidates(data)
			if err != nil {
				return fmt.Errorf("%s: %w", file, err)
			}
			c, err := opts.Client()
			if err != nil {
				return err
			}
			var pol models.Policy
			if err := c.Do(cmd.Context(), http.MethodGet, "/policy", nil, nil, nil, &pol); err != nil {
				return fmt.Errorf("read the agent's current rules: %w", err)
			}
			var current api.Rules
			if err := json.Unmarshal([]byte(pol.Policy), &current); err != nil {
				return fmt.Errorf("the agent's current rules: %w", err)
			}
			conns, nflows, err := src.connections(cmd.Context())
			if err != nil {
				return err
			}
			changes, err := observed.WhatIf(current, cands, conns)
			if err != nil {
				return err
			}
			return printChanges(cmd.OutOrStdout(), output, changes, len(conns), nflows)
		},
	}
	src.flags(cmd)
	cmd.Flags().StringVarP(&file, "file", "f", "", "Candidate policies (YAML or JSON)")
	cmd.Flags().StringVarP(&output, "output", "o", "table", "Output: table, or json (every changed connection)")
	return cmd
}

func verdictWord(allowed bool) string {
	if allowed {
		return "allowed"
	}
	return "denied"
}

func printChanges(out io.Writer, format string, changes []observed.Change, nconns, nflows int) error {
	if format == "json" {
		type row struct {
			Source, Destination string
			SourceIP, DestIP    string
			Protocol            uint8
			Port                uint16
			Now, WithCandidates string
			Flows               int
		}
		rows := []row{}
		for _, c := range changes {
			rows = append(rows, row{c.Src.Workload(), c.Dst.Workload(), c.Src.IP.String(), c.Dst.IP.String(), c.Proto, c.Port, verdictWord(c.Before), verdictWord(c.After), c.Flows})
		}
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return enc.Encode(rows)
	}
	if format != "table" {
		return fmt.Errorf("-o %q: want table or json", format)
	}
	fmt.Fprintf(out, "%d of %d observed connections (%d flows) change verdict.\n", len(changes), nconns, nflows)
	if len(changes) == 0 {
		return nil
	}
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SOURCE\tDESTINATION\tPORTS\tCONNECTIONS\tNOW\tWITH CANDIDATES")
	for _, g := range observed.GroupChanges(changes) {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\n", g.Src, g.Dst, strings.Join(g.Ports, ","), g.Connections, verdictWord(g.Before), verdictWord(g.After))
	}
	return tw.Flush()
}
