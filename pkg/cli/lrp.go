package cli

import (
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/cilium/cilium/api/v1/models"
	"github.com/spf13/cobra"
)

// newLRPCommand reads the local redirect policies the agent applies (as
// `cilium-dbg lrp list` does).
func newLRPCommand(opts *Options) *cobra.Command {
	cmd := &cobra.Command{Use: "lrp", Short: "Inspect the local redirect policies this node applies"}
	list := &cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List local redirect policies with the frontends they redirect and their local backends",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var out []*models.LRPSpec
			if err := doGet(cmd.Context(), opts, "/lrp", &out); err != nil {
				return err
			}
			if ok, err := opts.PrintStructured(cmd.OutOrStdout(), out); ok {
				return err
			}
			printLRPs(cmd.OutOrStdout(), out)
			return nil
		},
	}
	cmd.AddCommand(list)
	return cmd
}

// printLRPs prints one line per policy and one per frontend it redirects
// now (none: no local backend, the traffic goes where it would without
// the policy).
func printLRPs(w io.Writer, lrps []*models.LRPSpec) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	defer tw.Flush()
	fmt.Fprintln(tw, "NAMESPACE\tNAME\tFRONTEND TYPE\tSERVICE\tREDIRECTED")
	for _, l := range lrps {
		svc := l.ServiceID
		if svc == "" {
			svc = "-"
		}
		if len(l.FrontendMappings) == 0 {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", l.Namespace, l.Name, l.FrontendType, svc, "(no local backend: not redirected)")
			continue
		}
		for i, m := range l.FrontendMappings {
			line := mappingString(m)
			if i == 0 {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", l.Namespace, l.Name, l.FrontendType, svc, line)
			} else {
				fmt.Fprintf(tw, "\t\t\t\t%s\n", line)
			}
		}
	}
}

func mappingString(m *models.FrontendMapping) string {
	var b strings.Builder
	if m.FrontendAddress != nil {
		b.WriteString(net.JoinHostPort(m.FrontendAddress.IP, strconv.Itoa(int(m.FrontendAddress.Port))) + "/" + m.FrontendAddress.Protocol)
	}
	b.WriteString(" ->")
	for _, be := range m.Backends {
		if be.BackendAddress == nil || be.BackendAddress.IP == nil {
			continue
		}
		fmt.Fprintf(&b, " %s(%s)", net.JoinHostPort(*be.BackendAddress.IP, strconv.Itoa(int(be.BackendAddress.Port))), be.PodID)
	}
	return b.String()
}
