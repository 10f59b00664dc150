package cli

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/cilium/cilium/api/v1/models"
	"github.com/spf13/cobra"

	"github.com/tendril-net/tendril/pkg/client"
)

// newFQDNCommand is `tendril fqdn cache list|clean`: the names the node's
// DNS proxy learned (the v1 API's /fqdn/cache).
func newFQDNCommand(opts *Options) *cobra.Command {
	cmd := &cobra.Command{Use: "fqdn", Short: "Inspect the names the DNS proxy learned for toFQDNs policy"}
	cache := &cobra.Command{Use: "cache", Short: "The FQDN cache: names, addresses and expiry per endpoint"}
	list := &cobra.Command{Use: "list", Short: "List the learned names", Args: cobra.NoArgs}
	endpoint := list.Flags().String("endpoint", "", "Only this endpoint's names ([cilium-local:]ID)")
	pattern := list.Flags().StringP("matchpattern", "p", "", "Only names matching this toFQDNs matchPattern")
	cidr := list.Flags().String("cidr", "", "Only addresses inside this prefix")
	list.RunE = func(cmd *cobra.Command, _ []string) error {
		path := "/fqdn/cache"
		if *endpoint != "" {
			path += "/" + url.PathEscape(*endpoint)
		}
		q := url.Values{}
		if *pattern != "" {
			q.Set("matchpattern", *pattern)
		}
		if *cidr != "" {
			q.Set("cidr", *cidr)
		}
		if len(q) > 0 {
			path += "?" + q.Encode()
		}
		var out []*models.DNSLookup
		if err := doGet(cmd.Context(), opts, path, &out); err != nil && !client.IsNotFound(err) {
			return err
		}
		if ok, err := opts.PrintStructured(cmd.OutOrStdout(), out); ok {
			return err
		}
		tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 0, 2, ' ', 0)
		defer tw.Flush()
		fmt.Fprintln(tw, "ENDPOINT\tFQDN\tTTL\tEXPIRES\tIPS")
		for _, l := range out {
			fmt.Fprintf(tw, "%d\t%s\t%d\t%s\t%s\n", l.EndpointID, l.Fqdn, l.TTL, time.Time(l.ExpirationTime).UTC().Format(time.RFC3339), strings.Join(l.Ips, ","))
		}
		return nil
	}
	clean := &cobra.Command{Use: "clean", Short: "Forget learned names (all, or those matching -p); their addresses leave policy", Args: cobra.NoArgs}
	cleanPattern := clean.Flags().StringP("matchpattern", "p", "", "Only names matching this toFQDNs matchPattern")
	clean.RunE = func(cmd *cobra.Command, _ []string) error {
		c, err := opts.Client()
		if err != nil {
			return err
		}
		path := "/fqdn/cache"
		if *cleanPattern != "" {
			path += "?matchpattern=" + url.QueryEscape(*cleanPattern)
		}
		if err := c.Do(cmd.Context(), http.MethodDelete, path, nil, nil, nil, nil); err != nil {
			return err
		}
		fmt.Fprintln(cmd.OutOrStdout(), "FQDN cache cleaned")
		return nil
	}
	cache.AddCommand(list, clean)
	cmd.AddCommand(cache)
	return cmd
}
