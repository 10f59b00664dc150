package cli

import (
	"encoding/base64"
	"fmt"
	"io"
	"net/url"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/cilium/cilium/api/v1/models"
	gobgp "github.com/osrg/gobgp/v3/pkg/packet/bgp"
	"github.com/spf13/cobra"
)

// newBGPCommand reads the agent's BGP control plane (as `cilium-dbg bgp`
// does): the sessions, and the routes of a table.
func newBGPCommand(opts *Options) *cobra.Command {
	cmd := &cobra.Command{Use: "bgp", Short: "Show the BGP control plane's sessions and routes"}
	cmd.AddCommand(&cobra.Command{
		Use:   "peers",
		Short: "List the BGP sessions: state, uptime, ASNs, routes received and advertised",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var peers []*models.BgpPeer
			if err := doGet(cmd.Context(), opts, "/bgp/peers", &peers); err != nil {
				return err
			}
			if ok, err := opts.PrintStructured(cmd.OutOrStdout(), peers); ok {
				return err
			}
			printBGPPeers(cmd.OutOrStdout(), peers)
			return nil
		},
	})
	cmd.AddCommand(&cobra.Command{
		Use:   "routes [available|advertised] [ipv4|ipv6] [unicast] [neighbor ADDRESS]",
		Short: "List the routes of the speaker's table: available (the loc-rib, default) or advertised to a neighbor",
		Long: "List BGP routes, as cilium-dbg bgp routes: `available` is the loc-rib (what the node announces, and what it learned), " +
			"`advertised` what it sends to one neighbor (`neighbor ADDRESS` required). The family defaults to ipv4 unicast.",
		RunE: func(cmd *cobra.Command, args []string) error {
			q, err := bgpRouteQuery(args)
			if err != nil {
				return err
			}
			c, err := opts.Client()
			if err != nil {
				return err
			}
			var routes []*models.BgpRoute
			if err := c.Do(cmd.Context(), "GET", "/bgp/routes", q, nil, nil, &routes); err != nil {
				return err
			}
			if ok, err := opts.PrintStructured(cmd.OutOrStdout(), routes); ok {
				return err
			}
			return printBGPRoutes(cmd.OutOrStdout(), routes)
		},
	})
	return cmd
}

// bgpRouteQuery reads `routes`' arguments into GET /v1/bgp/routes's
// parameters.
func bgpRouteQuery(args []string) (url.Values, error) {
	q := url.Values{"table_type": {"loc-rib"}, "afi": {"ipv4"}, "safi": {"unicast"}}
	for i := 0; i < len(args); i++ {
		switch a := args[i]; a {
		case "available":
			q.Set("table_type", "loc-rib")
		case "advertised":
			q.Set("table_type", "adj-rib-out")
		case "ipv4", "ipv6":
			q.Set("afi", a)
		case "unicast":
			q.Set("safi", a)
		case "neighbor", "peer":
			if i+1 >= len(args) {
				return nil, fmt.Errorf("%s: needs an address", a)
			}
			i++
			q.Set("neighbor", args[i])
		default:
			return nil, fmt.Errorf("unknown argument %q: want available|advertised, ipv4|ipv6, unicast, neighbor ADDRESS", a)
		}
	}
	if q.Get("table_type") == "adj-rib-out" && q.Get("neighbor") == "" {
		return nil, fmt.Errorf("advertised: needs neighbor ADDRESS")
	}
	return q, nil
}

func printBGPPeers(w io.Writer, peers []*models.BgpPeer) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	defer tw.Flush()
	fmt.Fprintln(tw, "LOCAL AS\tPEER AS\tPEER ADDRESS\tSESSION\tUPTIME\tFAMILY\tRECEIVED\tADVERTISED")
	for _, p := range peers {
		uptime := "-"
		if p.UptimeNanoseconds > 0 {
			uptime = time.Duration(p.UptimeNanoseconds).Round(time.Second).String()
		}
		addr := fmt.Sprintf("%s:%d", p.PeerAddress, p.PeerPort)
		if len(p.Families) == 0 {
			fmt.Fprintf(tw, "%d\t%d\t%s\t%s\t%s\t-\t-\t-\n", p.LocalAsn, p.PeerAsn, addr, p.SessionState, uptime)
		}
		for _, f := range p.Families {
			fmt.Fprintf(tw, "%d\t%d\t%s\t%s\t%s\t%s/%s\t%d\t%d\n", p.LocalAsn, p.PeerAsn, addr, p.SessionState, uptime, f.Afi, f.Safi, f.Received, f.Advertised)
		}
	}
}

func printBGPRoutes(w io.Writer, routes []*models.BgpRoute) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	defer tw.Flush()
	fmt.Fprintln(tw, "ROUTER AS\tPREFIX\tNEXT HOP\tAGE\tBEST\tATTRIBUTES")
	for _, r := range routes {
		for _, p := range r.Paths {
			nh, attrs, err := decodeAttrs(p.PathAttributes)
			if err != nil {
				return fmt.Errorf("route %s: %w", r.Prefix, err)
			}
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%t\t%s\n", r.RouterAsn, r.Prefix, nh,
				time.Duration(p.AgeNanoseconds).Round(time.Second), p.Best, strings.Join(attrs, " "))
		}
	}
	return nil
}

// decodeAttrs reads the path attributes' wire format: the next hop, and
// every attribute as gobgp prints it.
func decodeAttrs(as []*models.BgpPathAttribute) (string, []string, error) {
	nh := "-"
	var out []string
	for _, a := range as {
		b, err := base64.StdEncoding.DecodeString(a.Base64)
		if err != nil {
			return "", nil, fmt.Errorf("attribute: %w", err)
		}
		attr, err := gobgp.GetPathAttribute(b)
		if err != nil {
			return "", nil, fmt.Errorf("attribute: %w", err)
		}
		if err := attr.DecodeFromBytes(b); err != nil {
			return "", nil, fmt.Errorf("attribute: %w", err)
		}
		switch v := attr.(type) {
		case *gobgp.PathAttributeNextHop:
			nh = v.Value.String()
		case *gobgp.PathAttributeMpReachNLRI:
			nh = v.Nexthop.String()
		}
		out = append(out, attr.String())
	}
	return nh, out, nil
}
