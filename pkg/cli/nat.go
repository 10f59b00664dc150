package cli

import (
	"fmt"
	"net/netip"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/tendril-net/tendril/pkg/agent/hostdev"
	"github.com/tendril-net/tendril/pkg/datapath/maps"
)

// natRow is one masqueraded flow as `bpf nat list` prints it.
type natRow struct {
	Proto  string `json:"proto"`
	Pod    string `json:"pod"`
	Remote string `json:"remote"`
	Node   string `json:"node"`
	Age    string `json:"age"`
	Orphan bool   `json:"orphan,omitempty"`
	// Service: a node port flow to another node's backend (Pod is the
	// outside client, Remote the backend).
	Service bool `json:"service,omitempty"`
}

// newBPFNATCommand lists the masquerade NAT table from its pin (works
// while the agent is down).
func newBPFNATCommand(opts *Options, root *string) *cobra.Command {
	cmd := &cobra.Command{Use: "nat", Short: "List the masquerade NAT table"}
	cmd.AddCommand(&cobra.Command{
		Use:   "list",
		Short: "List masqueraded flows: the pod's tuple, the destination, the node address and port it leaves with",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			m, err := maps.OpenPinnedNAT(*root, true)
			if err != nil {
				return err
			}
			defer m.Close()
			list, err := m.NATMap().List()
			if err != nil {
				return err
			}
			hostdev.SortMappings(list)
			now := maps.MonotonicNow()
			rows := make([]natRow, 0, len(list))
			for _, n := range list {
				age := "-"
				if now > n.Created {
					age = time.Duration(now - n.Created).Round(time.Second).String()
				}
				rows = append(rows, natRow{Proto: hostdev.ProtoName(n.Proto), Pod: netip.AddrPortFrom(n.Pod, n.PodPort).String(),
					Remote: netip.AddrPortFrom(n.Remote, n.RemotePort).String(), Node: netip.AddrPortFrom(n.Node, n.NodePort).String(), Age: age, Orphan: n.Orphan, Service: n.Service})
			}
			if ok, err := opts.PrintStructured(cmd.OutOrStdout(), rows); ok {
				return err
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 0, 2, ' ', 0)
			defer tw.Flush()
			fmt.Fprintln(tw, "PROTO\tPOD\tDESTINATION\tLEAVES AS\tAGE")
			for _, r := range rows {
				node := r.Node
				if r.Orphan {
					node += " (one direction only)"
				}
				if r.Service {
					node += " (service from outside: client -> remote backend)"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", r.Proto, r.Pod, r.Remote, node, r.Age)
			}
			return nil
		},
	})
	return cmd
}
