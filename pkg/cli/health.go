package cli

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/tendril-net/tendril/pkg/agent/nodehealth"
)

// newHealthCommand prints the agent's view of the other nodes (as
// `cilium-health status` does): per node and address, whether the last
// ICMP echo and HTTP GET /hello probes were answered, and their round
// trip.
func newHealthCommand(opts *Options) *cobra.Command {
	return &cobra.Command{
		Use:   "health",
		Short: "Show whether this node reaches every other node (ICMP and HTTP probes per address, with latency)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var h nodehealth.HealthResponse
			if err := doGet(cmd.Context(), opts, "/health", &h); err != nil {
				return err
			}
			if ok, err := opts.PrintStructured(cmd.OutOrStdout(), h); ok {
				return err
			}
			printHealth(cmd.OutOrStdout(), h)
			return nil
		},
	}
}

// printHealth prints the summary line and one row per node and address;
// the errors of failed probes go in the last column.
func printHealth(w io.Writer, h nodehealth.HealthResponse) {
	reachable := 0
	for _, n := range h.Nodes {
		if n.Reachable {
			reachable++
		}
	}
	fmt.Fprintf(w, "Node health from %s (probed every %s): %d/%d nodes reachable\n\n", h.Self, h.Interval, reachable, len(h.Nodes))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	defer tw.Flush()
	fmt.Fprintln(tw, "NODE\tADDRESS\tICMP\tHTTP\tLATENCY (ICMP/HTTP)\tERROR")
	nodes := h.Nodes
	if h.Local != nil {
		// This node's own health endpoint, probed from the node.
		local := *h.Local
		local.Name += " (local)"
		nodes = append([]nodehealth.NodeHealth{local}, nodes...)
	}
	for _, n := range nodes {
		if !n.Probed {
			fmt.Fprintf(tw, "%s\t-\t-\t-\t-\tnot probed yet\n", n.Name)
			continue
		}
		if len(n.Addresses) == 0 {
			fmt.Fprintf(tw, "%s\t-\t-\t-\t-\tno address\n", n.Name)
		}
		for _, a := range n.Addresses {
			var errs []string
			for _, r := range []struct {
				name string
				res  nodehealth.Result
			}{{"icmp", a.ICMP}, {"http", a.HTTP}} {
				if !r.res.Reachable {
					errs = append(errs, r.name+": "+r.res.Error)
				}
			}
			addr := a.IP.String()
			if a.HealthEndpoint {
				addr += " (endpoint)"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s/%s\t%s\n", n.Name, addr, reach(a.ICMP), reach(a.HTTP),
				latency(a.ICMP), latency(a.HTTP), strings.Join(errs, "; "))
		}
	}
}

func reach(r nodehealth.Result) string {
	if r.Reachable {
		return "ok"
	}
	return "unreachable"
}

func latency(r nodehealth.Result) string {
	if !r.Reachable {
		return "-"
	}
	return r.Latency.Round(time.Microsecond).String()
}
