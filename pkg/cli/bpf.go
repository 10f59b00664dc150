package cli

import (
	"fmt"
	"net/netip"
	"os"
	"sort"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/tendril-net/tendril/pkg/datapath/maps"
)

// openPinnedMaps opens the datapath's pinned maps under root read-only.
func openPinnedMaps(root string) (*maps.Maps, func(), error) {
	m, err := maps.OpenPinned(root, true)
	if err != nil {
		return nil, nil, err
	}
	return m, m.Close, nil
}

func newBPFCommand(opts *Options) *cobra.Command {
	root := os.Getenv("TENDRIL_BPF_ROOT")
	if root == "" {
		root = "/sys/fs/bpf/tendril"
	}
	cmd := &cobra.Command{Use: "bpf", Short: "Read the datapath's pinned BPF maps directly (works while the agent is down)"}
	cmd.PersistentFlags().StringVar(&root, "bpf-root", root, "The agent's --bpf-root (env TENDRIL_BPF_ROOT)")
	listCmd := func(name, short string, print func(*maps.Maps, *tabwriter.Writer) (any, error)) *cobra.Command {
		c := &cobra.Command{Use: name, Short: short}
		c.AddCommand(&cobra.Command{
			Use:   "list",
			Short: short,
			Args:  cobra.NoArgs,
			RunE: func(cmd *cobra.Command, _ []string) error {
				m, closeAll, err := openPinnedMaps(root)
				if err != nil {
					return err
				}
				defer closeAll()
				tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 0, 2, ' ', 0)
				if opts.Output != "table" {
					tw = tabwriter.NewWriter(new(discard), 0, 0, 0, ' ', 0)
				}
				data, err := print(m, tw)
				if err != nil {
					return err
				}
				if ok, err := opts.PrintStructured(cmd.OutOrStdout(), data); ok {
					return err
				}
				return tw.Flush()
			},
		})
		return c
	}
	cmd.AddCommand(newBPFLBCommand(opts, &root))
	cmd.AddCommand(newBPFNATCommand(opts, &root))
	cmd.AddCommand(
		listCmd("endpoint", "List the endpoints map", func(m *maps.Maps, tw *tabwriter.Writer) (any, error) {
			eps, err := m.EndpointMap().List()
			if err != nil {
				return nil, err
			}
			sort.Slice(eps, func(i, j int) bool { return eps[i].ID < eps[j].ID })
			fmt.Fprintln(tw, "ENDPOINT\tIFINDEX\tIPV4\tIPV6\tIDENTITY\tENFORCE\tDIRECT")
			for _, e := range eps {
				fmt.Fprintf(tw, "%d\t%d\t%s\t%s\t%d\t%s\t%v\n", e.ID, e.IfIndex, addrOrDash(e.IPv4), addrOrDash(e.IPv6), e.Identity,
					enforceString(e.Flags), e.Flags&maps.FlagDeliverDirect != 0)
			}
			return eps, nil
		}),
		listCmd("ipcache", "List the ipcache map (prefix → identity)", func(m *maps.Maps, tw *tabwriter.Writer) (any, error) {
			entries, err := m.IPCacheMap().Dump()
			if err != nil {
				return nil, err
			}
			keys := make([]string, 0, len(entries))
			byKey := map[string]maps.IPCacheEntry{}
			for p, v := range entries {
				keys = append(keys, p.String())
				byKey[p.String()] = v
			}
			sort.Strings(keys)
			fmt.Fprintln(tw, "PREFIX\tIDENTITY\tTUNNEL")
			out := map[string]uint32{}
			for _, k := range keys {
				v := byKey[k]
				tunnel := ""
				if v.TunnelIP.IsValid() {
					tunnel = v.TunnelIP.String()
				}
				fmt.Fprintf(tw, "%s\t%d\t%s\n", k, v.Identity, tunnel)
				out[k] = v.Identity
			}
			return out, nil
		}),
		listCmd("policy-cidr", "List the prefixes policy rules name (prefix → identity of in-cluster addresses inside it)", func(m *maps.Maps, tw *tabwriter.Writer) (any, error) {
			entries, err := m.PolicyCIDRMap().Dump()
			if err != nil {
				return nil, err
			}
			keys := make([]string, 0, len(entries))
			out := map[string]uint32{}
			for p, id := range entries {
				keys = append(keys, p.String())
				out[p.String()] = id
			}
			sort.Strings(keys)
			fmt.Fprintln(tw, "PREFIX\tIDENTITY")
			for _, k := range keys {
				fmt.Fprintf(tw, "%s\t%d\n", k, out[k])
			}
			return out, nil
		}),
		listCmd("policy", "List the policy map", func(m *maps.Maps, tw *tabwriter.Writer) (any, error) {
			entries, err := m.PolicyMap().DumpEndpoint(0)
			if err != nil {
				return nil, err
			}
			var rows []string
			for k, v := range entries {
				verdict := "allow"
				if v.Deny {
					verdict = "deny"
				}
				rows = append(rows, fmt.Sprintf("%s\t%s\t%d", k.String(), verdict, v.Cookie))
			}
			sort.Strings(rows)
			fmt.Fprintln(tw, "KEY\tVERDICT\tRULE")
			for _, r := range rows {
				fmt.Fprintln(tw, r)
			}
			return rows, nil
		}),
		listCmd("ct", "List the conntrack tables (one entry per flow, for both directions and both local endpoints)", func(m *maps.Maps, tw *tabwriter.Writer) (any, error) {
			entries, err := m.CTMap().List()
			if err != nil {
				return nil, err
			}
			now := maps.MonotonicNow()
			fmt.Fprintln(tw, "PROTO\tSOURCE\tDESTINATION\tSRC-ENDPOINT\tDST-ENDPOINT\tREPLY\tCLOSING\tEXPIRES")
			for _, e := range entries {
				expires := "expired"
				if e.Expires > now {
					expires = time.Duration(e.Expires - now).Round(time.Second).String()
				}
				fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%v\t%v\t%s\n", e.Proto, netip.AddrPortFrom(e.Src, e.SrcPort), netip.AddrPortFrom(e.Dst, e.DstPort),
					endpointOrDash(e.SrcEndpoint), endpointOrDash(e.DstEndpoint), e.SeenReply(), e.Closing(), expires)
			}
			return entries, nil
		}),
		listCmd("metrics", "List the datapath's counters by reason and direction", func(m *maps.Maps, tw *tabwriter.Writer) (any, error) {
			rows, err := m.MetricsMap().Dump()
			if err != nil {
				return nil, err
			}
			fmt.Fprintln(tw, "REASON\tDIRECTION\tPACKETS\tBYTES")
			type row struct {
				Reason, Direction string
				Packets, Bytes    uint64
			}
			var out []row
			for _, r := range rows {
				fmt.Fprintf(tw, "%s\t%s\t%d\t%d\n", maps.ReasonName(r.Reason), maps.DirectionName(r.Direction), r.Packets, r.Bytes)
				out = append(out, row{maps.ReasonName(r.Reason), maps.DirectionName(r.Direction), r.Packets, r.Bytes})
			}
			return out, nil
		}),
	)
	return cmd
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

func endpointOrDash(id uint16) string {
	if id == 0 {
		return "-"
	}
	return fmt.Sprint(id)
}

func addrOrDash(a netip.Addr) string {
	if !a.IsValid() {
		return "-"
	}
	return a.String()
}

func enforceString(flags uint8) string {
	switch {
	case flags&maps.FlagEnforceIngress != 0 && flags&maps.FlagEnforceEgress != 0:
		return "both"
	case flags&maps.FlagEnforceIngress != 0:
		return "ingress"
	case flags&maps.FlagEnforceEgress != 0:
		return "egress"
	}
	return "none"
}
