package cli

import (
	"encoding/json"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/tendril-net/tendril/pkg/dbinspect"
)

// newStateDBCommand inspects the agent's statedb tables (as `cilium-dbg
// statedb` does): the tables with their reconciliation counts, and a
// table's objects with their status.
func newStateDBCommand(opts *Options) *cobra.Command {
	cmd := &cobra.Command{Use: "statedb", Short: "Inspect the agent's statedb tables and their reconciliation status"}
	list := &cobra.Command{
		Use:   "list",
		Short: "List the tables: objects, revision, initialization, objects not yet realized",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var tables []dbinspect.TableInfo
			if err := doGet(cmd.Context(), opts, "/statedb/tables", &tables); err != nil {
				return err
			}
			if ok, err := opts.PrintStructured(cmd.OutOrStdout(), tables); ok {
				return err
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 0, 2, ' ', 0)
			defer tw.Flush()
			fmt.Fprintln(tw, "TABLE\tOBJECTS\tREVISION\tINITIALIZED\tPENDING\tFAILING")
			for _, t := range tables {
				init := "yes"
				if !t.Initialized {
					init = "waiting for " + strings.Join(t.PendingInitializers, ", ")
				}
				pending, failing := "-", "-"
				if t.Reconciled {
					pending, failing = strconv.Itoa(t.Pending), strconv.Itoa(t.Errors)
				}
				fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\t%s\n", t.Name, t.Objects, t.Revision, init, pending, failing)
			}
			return nil
		},
	}
	dump := &cobra.Command{
		Use:   "dump TABLE",
		Short: "Print a table's objects with their reconciliation status (-o json: statedb's JSON dump)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			table := url.PathEscape(args[0])
			if opts.Output == "json" || opts.Output == "yaml" {
				// statedb's own dump: {"table": [objects...]}.
				var raw map[string][]json.RawMessage
				if err := doGet(cmd.Context(), opts, "/statedb/dump/"+table, &raw); err != nil {
					return err
				}
				objs, ok := raw[args[0]]
				if !ok {
					return fmt.Errorf("no statedb table %q", args[0])
				}
				var out []any
				for _, o := range objs {
					var v any
					if err := json.Unmarshal(o, &v); err != nil {
						return fmt.Errorf("decode an object of %s: %w", args[0], err)
					}
					out = append(out, v)
				}
				_, err := opts.PrintStructured(cmd.OutOrStdout(), out)
				return err
			}
			var rows dbinspect.Rows
			if err := doGet(cmd.Context(), opts, "/statedb/rows/"+table, &rows); err != nil {
				return err
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 0, 2, ' ', 0)
			defer tw.Flush()
			fmt.Fprintln(tw, strings.ToUpper(strings.Join(rows.Header, "\t")))
			for _, r := range rows.Rows {
				fmt.Fprintln(tw, strings.Join(r, "\t"))
			}
			return nil
		},
	}
	cmd.AddCommand(list, dump)
	return cmd
}
