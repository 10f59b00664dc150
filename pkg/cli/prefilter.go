package cli

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"text/tabwriter"

	"github.com/cilium/cilium/api/v1/models"
	"github.com/spf13/cobra"

	"github.com/tendril-net/tendril/pkg/prefilter"
)

// newPrefilterCommand reads and changes the XDP prefilter's deny list (as
// `cilium-dbg prefilter` does, with the drop counters too).
func newPrefilterCommand(opts *Options) *cobra.Command {
	cmd := &cobra.Command{Use: "prefilter", Short: "Inspect and change the XDP prefilter's deny list"}
	list := &cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List the denied CIDRs, the revision the maps hold and the packets dropped",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var st prefilter.Model
			if err := doGet(cmd.Context(), opts, "/prefilter", &st); err != nil {
				return err
			}
			if ok, err := opts.PrintStructured(cmd.OutOrStdout(), st); ok {
				return err
			}
			printPrefilter(cmd.OutOrStdout(), st)
			return nil
		},
	}
	change := func(use, short, method, verb string) *cobra.Command {
		var cidrs []string
		var revision int64
		c := &cobra.Command{
			Use:   use,
			Short: short,
			Args:  cobra.NoArgs,
			RunE: func(cmd *cobra.Command, _ []string) error {
				if len(cidrs) == 0 {
					return fmt.Errorf("no --cidr given")
				}
				cl, err := opts.Client()
				if err != nil {
					return err
				}
				spec := models.PrefilterSpec{Revision: revision, Deny: cidrs}
				var st prefilter.Model
				if err := cl.Do(cmd.Context(), method, "/prefilter", nil, nil, &spec, &st); err != nil {
					return fmt.Errorf("%s %s: %w", verb, strings.Join(cidrs, ", "), err)
				}
				rev := int64(0)
				if st.Spec != nil {
					rev = st.Spec.Revision
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%s %d CIDRs; the list is at revision %d\n", verb, len(cidrs), rev)
				return nil
			},
		}
		c.Flags().StringSliceVar(&cidrs, "cidr", nil, "CIDR to "+strings.ToLower(verb[:len(verb)-1])+" (repeat for several)")
		c.Flags().Int64Var(&revision, "revision", 0, "Revision the change applies to (0: whatever the list's is); a stale one is refused")
		return c
	}
	cmd.AddCommand(list,
		change("update", "Deny more CIDRs", http.MethodPatch, "Denied"),
		change("delete", "Stop denying CIDRs", http.MethodDelete, "Removed"))
	return cmd
}

// printPrefilter prints the revisions (asked and in the maps), the
// devices, the counters and one line per CIDR.
func printPrefilter(w io.Writer, st prefilter.Model) {
	var desired, realized int64
	if st.Spec != nil {
		desired = st.Spec.Revision
	}
	if st.Status != nil && st.Status.Realized != nil {
		realized = st.Status.Realized.Revision
	}
	fmt.Fprintf(w, "Revision: %d (in the maps: %d)\n", desired, realized)
	if len(st.Devices) > 0 {
		fmt.Fprintf(w, "Devices:  %s\n", strings.Join(st.Devices, ", "))
	}
	if d := st.Dropped; d != nil {
		fmt.Fprintf(w, "Dropped:  IPv4 %d packets (%d bytes), IPv6 %d packets (%d bytes)\n", d.IPv4Packets, d.IPv4Bytes, d.IPv6Packets, d.IPv6Bytes)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	defer tw.Flush()
	fmt.Fprintln(tw, "DENIED CIDR\tIN THE MAPS")
	inMaps := map[string]bool{}
	if st.Status != nil && st.Status.Realized != nil {
		for _, c := range st.Status.Realized.Deny {
			inMaps[c] = true
		}
	}
	if st.Spec != nil {
		for _, c := range st.Spec.Deny {
			yes := "yes"
			if !inMaps[c] {
				yes = "not yet"
			}
			fmt.Fprintf(tw, "%s\t%s\n", c, yes)
		}
	}
}
