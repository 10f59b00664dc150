package cli

import (
	"fmt"
	"net/url"
	"strings"
	"text/tabwriter"

	"github.com/cilium/cilium/api/v1/models"
	"github.com/spf13/cobra"
)

func newIdentityCommand(opts *Options) *cobra.Command {
	cmd := &cobra.Command{Use: "identity", Aliases: []string{"identities", "id"}, Short: "Inspect security identities"}
	list := &cobra.Command{
		Use:   "list",
		Short: "List identities (reserved and allocated); --endpoints: those of local endpoints with reference counts",
		Args:  cobra.NoArgs,
	}
	endpoints := list.Flags().Bool("endpoints", false, "Only identities used by local endpoints, with reference counts")
	list.RunE = func(cmd *cobra.Command, _ []string) error {
		if *endpoints {
			var out []*models.IdentityEndpoints
			if err := doGet(cmd.Context(), opts, "/identity/endpoints", &out); err != nil {
				return err
			}
			if ok, err := opts.PrintStructured(cmd.OutOrStdout(), out); ok {
				return err
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 0, 2, ' ', 0)
			defer tw.Flush()
			fmt.Fprintln(tw, "ID\tREFS\tLABELS")
			for _, e := range out {
				fmt.Fprintf(tw, "%d\t%d\t%s\n", e.Identity.ID, e.RefCount, strings.Join(e.Identity.Labels, " "))
			}
			return nil
		}
		var out []*models.Identity
		if err := doGet(cmd.Context(), opts, "/identity", &out); err != nil {
			return err
		}
		if ok, err := opts.PrintStructured(cmd.OutOrStdout(), out); ok {
			return err
		}
		tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 0, 2, ' ', 0)
		defer tw.Flush()
		fmt.Fprintln(tw, "ID\tLABELS")
		for _, id := range out {
			fmt.Fprintf(tw, "%d\t%s\n", id.ID, strings.Join(id.Labels, " "))
		}
		return nil
	}
	get := &cobra.Command{
		Use:   "get ID",
		Short: "Show one identity",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var id models.Identity
			if err := doGet(cmd.Context(), opts, "/identity/"+url.PathEscape(args[0]), &id); err != nil {
				return err
			}
			if ok, err := opts.PrintStructured(cmd.OutOrStdout(), id); ok {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "ID:      %d\nLabels:  %s\nSHA256:  %s\n", id.ID, strings.Join(id.Labels, " "), id.LabelsSHA256)
			return nil
		},
	}
	cmd.AddCommand(list, get)
	return cmd
}

func newIPCommand(opts *Options) *cobra.Command {
	cmd := &cobra.Command{Use: "ip", Short: "Inspect the ipcache (IP prefix → identity)"}
	list := &cobra.Command{Use: "list", Short: "List ipcache entries", Args: cobra.NoArgs}
	cidr := list.Flags().String("cidr", "", "Only entries inside this prefix")
	list.RunE = func(cmd *cobra.Command, _ []string) error {
		path := "/ip"
		if *cidr != "" {
			path += "?cidr=" + url.QueryEscape(*cidr)
		}
		var out []*models.IPListEntry
		if err := doGet(cmd.Context(), opts, path, &out); err != nil {
			return err
		}
		if ok, err := opts.PrintStructured(cmd.OutOrStdout(), out); ok {
			return err
		}
		tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 0, 2, ' ', 0)
		defer tw.Flush()
		fmt.Fprintln(tw, "PREFIX\tIDENTITY\tSOURCE\tHOST IP\tOWNER")
		for _, e := range out {
			owner, source := "", ""
			if e.Metadata != nil {
				source = e.Metadata.Source
				if e.Metadata.Name != "" {
					owner = e.Metadata.Namespace + "/" + e.Metadata.Name
				}
			}
			fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\n", *e.Cidr, *e.Identity, source, e.HostIP, owner)
		}
		return nil
	}
	cmd.AddCommand(list)
	return cmd
}
