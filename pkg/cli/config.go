package cli

import (
	"fmt"
	"net/http"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/cilium/cilium/api/v1/models"
	"github.com/spf13/cobra"
)

func newConfigCommand(opts *Options) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "config",
		Short: "Show or change the agent's configuration",
	}
	get := &cobra.Command{
		Use:   "get",
		Short: "Show the effective configuration",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := opts.Client()
			if err != nil {
				return err
			}
			var cfg models.DaemonConfiguration
			if err := c.Do(cmd.Context(), http.MethodGet, "/config", nil, nil, nil, &cfg); err != nil {
				return err
			}
			if ok, err := opts.PrintStructured(cmd.OutOrStdout(), &cfg); ok {
				return err
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 0, 2, ' ', 0)
			defer tw.Flush()
			var keys []string
			if cfg.Status != nil {
				for k := range cfg.Status.DaemonConfigurationMap {
					keys = append(keys, k)
				}
			}
			sort.Strings(keys)
			fmt.Fprintln(tw, "KEY\tVALUE")
			for _, k := range keys {
				fmt.Fprintf(tw, "%s\t%v\n", k, cfg.Status.DaemonConfigurationMap[k])
			}
			return nil
		},
	}
	set := &cobra.Command{
		Use:   "set KEY=VALUE...",
		Short: "Change runtime options (policy-enforcement=default|always|never, debug=true|false)",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			spec := models.DaemonConfigurationSpec{Options: models.ConfigurationMap{}}
			for _, arg := range args {
				k, v, ok := strings.Cut(arg, "=")
				if !ok || k == "" {
					return fmt.Errorf("%q: want KEY=VALUE", arg)
				}
				if strings.EqualFold(k, "policy-enforcement") {
					spec.PolicyEnforcement = v
					continue
				}
				spec.Options[k] = v
			}
			c, err := opts.Client()
			if err != nil {
				return err
			}
			if err := c.Do(cmd.Context(), http.MethodPatch, "/config", nil, nil, &spec, nil); err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), "Configuration updated")
			return nil
		},
	}
	cmd.AddCommand(get, set)
	return cmd
}
