package cli

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"text/tabwriter"

	"github.com/cilium/ebpf"
	"github.com/spf13/cobra"

	"github.com/tendril-net/tendril/pkg/datapath/maps"
)

// openPinnedMaps opens the datapath's pinned maps under root read-only.
func openPinnedMaps(root string) (*maps.Maps, func(), error) {
	open := func(name string) (*ebpf.Map, error) {
		m, err := ebpf.LoadPinnedMap(filepath.Join(root, name), &ebpf.LoadPinOptions{ReadOnly: true})
		if err != nil {
			return nil, fmt.Errorf("open pinned map %s (is the agent's --bpf-root %s?): %w", name, root, err)
		}
		return m, nil
	}
	var opened []*ebpf.Map
	closeAll := func() {
		for _, m := range opened {
			m.Close()
		}
	}
	m := &maps.Maps{}
	for name, dst := range map[string]**ebpf.Map{
		"tdr_endpoints_v1": &m.Endpoints, "tdr_ipcache_v1": &m.IPCache, "tdr_policy_v1": &m.Policy,
		"tdr_ct_v1": &m.CT, "tdr_metrics_v2": &m.Metrics,
	} {
		mp, err := open(name)
		if err != nil {
			closeAll()
			return nil, nil, err
		}
		opened = append(opened, mp)
		*dst = mp
	}
	return m, closeAll, nil
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
	cmd.AddCommand(
		listCmd("endpoint", "List the endpoints map", func(m *maps.Maps, tw *tabwriter.Writer) (any, error) {
			eps, err := m.DumpEndpoints()
			if err != nil {
				return nil, err
			}
			sort.Slice(eps, func(i, j int) bool {
				return eps[i].ID < eps[j].ID || (eps[i].ID == eps[j].ID && eps[i].IP.Less(eps[j].IP))
			})
			fmt.Fprintln(tw, "IP\tENDPOINT\tIFINDEX\tIDENTITY\tENFORCE")
			for _, e := range eps {
				fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%s\n", e.IP, e.ID, e.IfIndex, e.Identity, enforceString(e.Flags))
			}
			return eps, nil
		}),
		listCmd("ipcache", "List the ipcache map (prefix → identity)", func(m *maps.Maps, tw *tabwriter.Writer) (any, error) {
			entries, err := m.DumpIPCache()
			if err != nil {
				return nil, err
			}
			keys := make([]string, 0, len(entries))
			byKey := map[string]maps.IPCacheValue{}
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
		listCmd("policy", "List the policy map", func(m *maps.Maps, tw *tabwriter.Writer) (any, error) {
			entries, err := m.DumpPolicy(0)
			if err != nil {
				return nil, err
			}
			var rows []string
			for k, v := range entries {
				verdict := "allow"
				if v.Deny {
					verdict = "deny"
				}
				rows = append(rows, fmt.Sprintf("%s\t%s\t%d", formatPolicyKey(k), verdict, v.Cookie))
			}
			sort.Strings(rows)
			fmt.Fprintln(tw, "KEY\tVERDICT\tRULE")
			for _, r := range rows {
				fmt.Fprintln(tw, r)
			}
			return rows, nil
		}),
		listCmd("ct", "List the conntrack table", func(m *maps.Maps, tw *tabwriter.Writer) (any, error) {
			entries, err := m.DumpCT()
			if err != nil {
				return nil, err
			}
			fmt.Fprintln(tw, "ENDPOINT\tDIR\tPROTO\tSOURCE\tDESTINATION\tPACKETS\tBYTES\tREPLY\tCLOSING")
			for _, e := range entries {
				fmt.Fprintf(tw, "%d\t%s\t%d\t%s:%d\t%s:%d\t%d\t%d\t%v\t%v\n", e.EndpointID, maps.DirectionName(e.Direction), e.Proto, e.Src, e.SrcPort, e.Dst, e.DstPort, e.Packets, e.Bytes, e.SeenReply, e.Closing)
			}
			return entries, nil
		}),
		listCmd("metrics", "List the datapath's counters by reason and direction", func(m *maps.Maps, tw *tabwriter.Writer) (any, error) {
			rows, err := m.DumpMetrics()
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

func formatPolicyKey(k maps.PolicyKey) string {
	id := "any"
	if k.Identity != 0 {
		id = fmt.Sprint(k.Identity)
	}
	port := "any"
	switch {
	case k.Proto == 0:
		return fmt.Sprintf("ep=%d %s identity=%s proto=any", k.EndpointID, maps.DirectionName(k.Direction), id)
	case k.PortPrefixLen == 16:
		port = fmt.Sprint(k.Port)
	case k.PortPrefixLen > 0:
		port = fmt.Sprintf("%d-%d", k.Port, uint32(k.Port)+(uint32(1)<<(16-k.PortPrefixLen))-1)
	}
	return fmt.Sprintf("ep=%d %s identity=%s proto=%d port=%s", k.EndpointID, maps.DirectionName(k.Direction), id, k.Proto, port)
}
