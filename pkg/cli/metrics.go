package cli

import (
	"fmt"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/cilium/cilium/api/v1/models"
	"github.com/spf13/cobra"
)

func newMetricsCommand(opts *Options) *cobra.Command {
	cmd := &cobra.Command{Use: "metrics", Short: "Read the agent's metrics over its API"}
	var match string
	list := &cobra.Command{
		Use:   "list",
		Short: "List the agent's metrics (name, labels, value), as cilium-dbg metrics list",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var out []*models.Metric
			if err := doGet(cmd.Context(), opts, "/metrics/", &out); err != nil {
				return err
			}
			if match != "" {
				kept := out[:0]
				for _, m := range out {
					if strings.Contains(m.Name, match) {
						kept = append(kept, m)
					}
				}
				out = kept
			}
			if ok, err := opts.PrintStructured(cmd.OutOrStdout(), out); ok {
				return err
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 0, 2, ' ', 0)
			defer tw.Flush()
			fmt.Fprintln(tw, "METRIC\tLABELS\tVALUE")
			for _, m := range out {
				keys := make([]string, 0, len(m.Labels))
				for k := range m.Labels {
					keys = append(keys, k)
				}
				sort.Strings(keys)
				var ls []string
				for _, k := range keys {
					ls = append(ls, k+"="+m.Labels[k])
				}
				fmt.Fprintf(tw, "%s\t%s\t%g\n", m.Name, strings.Join(ls, " "), m.Value)
			}
			return nil
		},
	}
	list.Flags().StringVar(&match, "match", "", "Only metrics whose name contains this")
	cmd.AddCommand(list)
	return cmd
}
