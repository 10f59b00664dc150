package cli

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/cilium/cilium/api/v1/models"
	"github.com/spf13/cobra"
)

func newEndpointCommand(opts *Options) *cobra.Command {
	cmd := &cobra.Command{Use: "endpoint", Aliases: []string{"ep", "endpoints"}, Short: "Inspect the agent's endpoints"}
	list := &cobra.Command{
		Use:   "list",
		Short: "List endpoints",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := opts.Client()
			if err != nil {
				return err
			}
			eps, err := c.EndpointList(cmd.Context())
			if err != nil {
				return err
			}
			if ok, err := opts.PrintStructured(cmd.OutOrStdout(), eps); ok {
				return err
			}
			printEndpointTable(cmd.OutOrStdout(), eps)
			return nil
		},
	}
	get := &cobra.Command{
		Use:   "get ID",
		Short: "Show one endpoint (ID forms: N, container-id:X, cni-attachment-id:X, pod-name:NS/NAME)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := opts.Client()
			if err != nil {
				return err
			}
			ep, err := c.EndpointGet(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if ok, err := opts.PrintStructured(cmd.OutOrStdout(), ep); ok {
				return err
			}
			printEndpointDetail(cmd.OutOrStdout(), ep)
			return nil
		},
	}
	logCmd := &cobra.Command{
		Use:   "log ID",
		Short: "Show an endpoint's state changes",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var log models.EndpointStatusLog
			if err := doGet(cmd.Context(), opts, "/endpoint/"+escapeID(args[0])+"/log", &log); err != nil {
				return err
			}
			if ok, err := opts.PrintStructured(cmd.OutOrStdout(), log); ok {
				return err
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 0, 2, ' ', 0)
			defer tw.Flush()
			fmt.Fprintln(tw, "TIMESTAMP\tSTATE\tCODE\tMESSAGE")
			for _, l := range log {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", l.Timestamp, l.State, l.Code, l.Message)
			}
			return nil
		},
	}
	labels := &cobra.Command{
		Use:   "labels ID",
		Short: "Show an endpoint's labels",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var lc models.LabelConfiguration
			if err := doGet(cmd.Context(), opts, "/endpoint/"+escapeID(args[0])+"/labels", &lc); err != nil {
				return err
			}
			if ok, err := opts.PrintStructured(cmd.OutOrStdout(), &lc); ok {
				return err
			}
			if lc.Status != nil {
				for _, l := range lc.Status.SecurityRelevant {
					fmt.Fprintln(cmd.OutOrStdout(), l)
				}
			}
			return nil
		},
	}
	cmd.AddCommand(list, get, logCmd, labels)
	return cmd
}

func escapeID(id string) string { return strings.ReplaceAll(id, "/", "%2F") }

func doGet(ctx context.Context, opts *Options, path string, out any) error {
	c, err := opts.Client()
	if err != nil {
		return err
	}
	return c.Do(ctx, http.MethodGet, path, nil, nil, nil, out)
}

func endpointAddrs(ep *models.Endpoint) (string, string) {
	if ep.Status == nil || ep.Status.Networking == nil {
		return "", ""
	}
	var v4, v6 []string
	for _, a := range ep.Status.Networking.Addressing {
		if a.IPV4 != "" {
			v4 = append(v4, a.IPV4)
		}
		if a.IPV6 != "" {
			v6 = append(v6, a.IPV6)
		}
	}
	return strings.Join(v4, ","), strings.Join(v6, ",")
}

// healthEndpointLabel is the label of a node's health endpoint
// (Cilium's reserved:health).
const healthEndpointLabel = "reserved:health"

func printEndpointTable(w io.Writer, eps []*models.Endpoint) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	defer tw.Flush()
	fmt.Fprintln(tw, "ENDPOINT\tPOD\tIDENTITY\tIPv4\tIPv6\tINTERFACE\tSTATE\tPOLICY REV")
	for _, ep := range eps {
		v4, v6 := endpointAddrs(ep)
		pod, identity, state, iface := "", int64(0), "", ""
		if st := ep.Status; st != nil {
			if st.ExternalIdentifiers != nil {
				pod = st.ExternalIdentifiers.PodName
			}
			if st.Identity != nil {
				identity = st.Identity.ID
				if pod == "" && slices.Contains(st.Identity.Labels, healthEndpointLabel) {
					// The node's health endpoint: no pod, but not nothing.
					pod = "(health endpoint)"
				}
			}
			if st.State != nil {
				state = string(*st.State)
			}
			if st.Networking != nil {
				iface = st.Networking.InterfaceName
			}
		}
		fmt.Fprintf(tw, "%d\t%s\t%d\t%s\t%s\t%s\t%s\t%s\n", ep.ID, pod, identity, v4, v6, iface, state, policyRevisionColumn(ep))
	}
}

func printEndpointDetail(w io.Writer, ep *models.Endpoint) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	defer tw.Flush()
	v4, v6 := endpointAddrs(ep)
	fmt.Fprintf(tw, "ID:\t%d\n", ep.ID)
	st := ep.Status
	if st == nil {
		return
	}
	if st.State != nil {
		fmt.Fprintf(tw, "State:\t%s\n", *st.State)
	}
	if ids := st.ExternalIdentifiers; ids != nil {
		fmt.Fprintf(tw, "Pod:\t%s\n", ids.PodName)
		fmt.Fprintf(tw, "Container:\t%s\n", ids.ContainerID)
		fmt.Fprintf(tw, "CNI attachment:\t%s\n", ids.CniAttachmentID)
	}
	fmt.Fprintf(tw, "IPv4:\t%s\n", v4)
	fmt.Fprintf(tw, "IPv6:\t%s\n", v6)
	if n := st.Networking; n != nil {
		fmt.Fprintf(tw, "Host interface:\t%s (index %d, mac %s)\n", n.InterfaceName, n.InterfaceIndex, n.HostMac)
		fmt.Fprintf(tw, "Pod interface:\t%s (mac %s)\n", n.ContainerInterfaceName, n.Mac)
	}
	if st.Identity != nil {
		fmt.Fprintf(tw, "Identity:\t%d\n", st.Identity.ID)
		fmt.Fprintf(tw, "Labels:\t%s\n", strings.Join(st.Identity.Labels, " "))
	}
	if h := st.Health; h != nil {
		fmt.Fprintf(tw, "Health:\t%s (bpf %s, policy %s)\n", h.OverallHealth, h.Bpf, h.Policy)
	}
	if st.Policy != nil {
		fmt.Fprintf(tw, "Policy revision:\t%s\n", policyRevisionColumn(ep))
		if p := st.Policy.Realized; p != nil {
			fmt.Fprintf(tw, "Policy enforcement:\t%s (revision %d)\n", p.PolicyEnabled, p.PolicyRevision)
			fmt.Fprintf(tw, "Ingress allowed identities:\t%v\n", p.AllowedIngressIdentities)
			fmt.Fprintf(tw, "Ingress denied identities:\t%v\n", p.DeniedIngressIdentities)
			fmt.Fprintf(tw, "Egress allowed identities:\t%v\n", p.AllowedEgressIdentities)
			fmt.Fprintf(tw, "Egress denied identities:\t%v\n", p.DeniedEgressIdentities)
		}
	}
	if o := ep.Spec; o != nil {
		for k, v := range o.Options {
			fmt.Fprintf(tw, "Option %s:\t%s\n", k, v)
		}
	}
}

func newIPAMCommand(opts *Options) *cobra.Command {
	return &cobra.Command{
		Use:   "ipam",
		Short: "Show the node's address pools and allocations",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			st, err := fetchStatusFull(cmd.Context(), opts)
			if err != nil {
				return err
			}
			if ok, err := opts.PrintStructured(cmd.OutOrStdout(), st.Ipam); ok {
				return err
			}
			if st.Ipam == nil {
				return fmt.Errorf("agent reports no IPAM status")
			}
			fmt.Fprintf(cmd.OutOrStdout(), "Pools: %s\n", st.Ipam.Status)
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 0, 2, ' ', 0)
			defer tw.Flush()
			fmt.Fprintln(tw, "ADDRESS\tOWNER")
			for _, ip := range append(append([]string{}, st.Ipam.IPV4...), st.Ipam.IPV6...) {
				fmt.Fprintf(tw, "%s\t%s\n", ip, st.Ipam.Allocations[ip])
			}
			return nil
		},
	}
}

// policyRevisionColumn is the endpoint's realized policy revision against
// the one it must realize ("5/5"), with the last regeneration error while
// it has one ("4/5 (error: ...)"); "-" when the agent realizes no policy.
func policyRevisionColumn(ep *models.Endpoint) string {
	st := ep.Status
	if st == nil || st.Policy == nil || st.Policy.Realized == nil || st.Policy.Spec == nil {
		return "-"
	}
	realized, desired := st.Policy.Realized.PolicyRevision, st.Policy.Spec.PolicyRevision
	if realized == 0 && desired == 0 {
		return "-"
	}
	col := fmt.Sprintf("%d/%d", realized, desired)
	if msg := regenerationError(st); msg != "" {
		col += " (error: " + msg + ")"
	}
	return col
}

// regenerationError is the last failure of the endpoint's regeneration
// controller, empty when its last regeneration succeeded.
func regenerationError(st *models.EndpointStatus) string {
	for _, c := range st.Controllers {
		if c == nil || c.Status == nil || !strings.HasPrefix(c.Name, "endpoint-regeneration") {
			continue
		}
		if c.Status.ConsecutiveFailureCount > 0 {
			return strings.ReplaceAll(c.Status.LastFailureMsg, "\n", " ")
		}
	}
	return ""
}
