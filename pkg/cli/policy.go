package cli

import (
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/cilium/cilium/api/v1/models"
	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"

	"github.com/tendril-net/tendril/api/v1/ext"
	"github.com/tendril-net/tendril/pkg/policy"
	"github.com/tendril-net/tendril/pkg/policy/api"
)

func newPolicyCommand(opts *Options) *cobra.Command {
	cmd := &cobra.Command{Use: "policy", Short: "Manage and inspect network policy"}
	var replace bool
	imp := &cobra.Command{
		Use:   "import FILE|-",
		Short: "Import policy rules (JSON or YAML: a rule or a list of rules)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var data []byte
			var err error
			if args[0] == "-" {
				data, err = io.ReadAll(cmd.InOrStdin())
			} else {
				data, err = os.ReadFile(args[0])
			}
			if err != nil {
				return err
			}
			if j, err := yaml.YAMLToJSON(data); err == nil {
				data = j
			}
			c, err := opts.Client()
			if err != nil {
				return err
			}
			q := url.Values{}
			if replace {
				q.Set("replace", "true")
			}
			var out models.Policy
			if err := c.Do(cmd.Context(), http.MethodPut, "/policy", q, nil, string(data), &out); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "Revision: %d\n", out.Revision)
			return nil
		},
	}
	imp.Flags().BoolVar(&replace, "replace", false, "Replace rules that carry the same labels")
	get := &cobra.Command{
		Use:   "get [LABEL...]",
		Short: "Show the rules (those with all given labels: key=value of any source, or source:key=value)",
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := opts.Client()
			if err != nil {
				return err
			}
			body, err := selectLabelsBody(args)
			if err != nil {
				return err
			}
			var out models.Policy
			if err := c.Do(cmd.Context(), http.MethodGet, "/policy", nil, nil, body, &out); err != nil {
				return err
			}
			if ok, err := opts.PrintStructured(cmd.OutOrStdout(), &out); ok {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), out.Policy)
			fmt.Fprintf(cmd.OutOrStdout(), "Revision: %d\n", out.Revision)
			return nil
		},
	}
	var all bool
	del := &cobra.Command{
		Use:   "delete [LABEL...] | --all",
		Short: "Delete the rules with all given labels (key=value of any source, or source:key=value)",
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 && !all {
				return fmt.Errorf("give labels, or --all to delete every rule")
			}
			c, err := opts.Client()
			if err != nil {
				return err
			}
			body, err := selectLabelsBody(args)
			if err != nil {
				return err
			}
			var out models.Policy
			if err := c.Do(cmd.Context(), http.MethodDelete, "/policy", nil, nil, body, &out); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "Revision: %d\n", out.Revision)
			return nil
		},
	}
	del.Flags().BoolVar(&all, "all", false, "Delete every rule")
	selectors := &cobra.Command{
		Use:   "selectors",
		Short: "List the rules' peer selectors and the identities they select",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var out models.SelectorCache
			if err := doGet(cmd.Context(), opts, "/policy/selectors", &out); err != nil {
				return err
			}
			if ok, err := opts.PrintStructured(cmd.OutOrStdout(), out); ok {
				return err
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 0, 2, ' ', 0)
			defer tw.Flush()
			fmt.Fprintln(tw, "SELECTOR\tIDENTITIES\tUSERS")
			for _, s := range out {
				fmt.Fprintf(tw, "%s\t%v\t%d\n", s.Selector, s.Identities, s.Users)
			}
			return nil
		},
	}
	var src, dst, dport string
	trace := &cobra.Command{
		Use:   "trace --src LABELS --dst LABELS --dport PORT[/PROTO]",
		Short: "Explain whether src may reach dst and which rules decide",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if src == "" || dst == "" {
				return fmt.Errorf("--src and --dst are required (comma-separated labels, e.g. k8s:app=web)")
			}
			portStr, proto, _ := strings.Cut(dport, "/")
			port := 0
			if portStr != "" {
				var err error
				if port, err = strconv.Atoi(portStr); err != nil || port < 0 || port > 65535 {
					return fmt.Errorf("--dport %q: want PORT[/PROTO]", dport)
				}
			}
			c, err := opts.Client()
			if err != nil {
				return err
			}
			req := ext.TraceRequest{Src: splitLabels(src), Dst: splitLabels(dst), Port: uint16(port), Proto: proto}
			var out policy.TraceResult
			if err := c.Do(cmd.Context(), http.MethodPost, "/policy/trace", nil, nil, req, &out); err != nil {
				return err
			}
			if ok, err := opts.PrintStructured(cmd.OutOrStdout(), &out); ok {
				return err
			}
			for _, l := range out.Lines {
				fmt.Fprintln(cmd.OutOrStdout(), l)
			}
			if !out.Allowed {
				return &ExitError{Code: 1}
			}
			return nil
		},
	}
	trace.Flags().StringVar(&src, "src", "", "Source labels, comma-separated")
	trace.Flags().StringVar(&dst, "dst", "", "Destination labels, comma-separated")
	trace.Flags().StringVar(&dport, "dport", "", "Destination port and protocol, e.g. 80/TCP")
	cmd.AddCommand(imp, get, del, selectors, trace, newPolicySuggestCommand(), newPolicyWhatIfCommand(opts))
	return cmd
}

// selectLabelsBody is the Labels body of GET and DELETE /v1/policy: the
// labels as given, once they parse as the agent will parse them; no
// labels, no body.
func selectLabelsBody(args []string) (any, error) {
	if len(args) == 0 {
		return nil, nil
	}
	if _, err := api.ParseSelectLabels(args); err != nil {
		return nil, err
	}
	return args, nil
}

func splitLabels(s string) []string {
	var out []string
	for _, l := range strings.Split(s, ",") {
		if l = strings.TrimSpace(l); l != "" {
			out = append(out, l)
		}
	}
	return out
}
