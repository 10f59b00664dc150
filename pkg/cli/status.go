package cli

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/cilium/cilium/api/v1/models"
	"github.com/spf13/cobra"

	"github.com/tendril-net/tendril/api/v1/ext"
	"github.com/tendril-net/tendril/pkg/client"
)

func fetchStatus(ctx context.Context, c *client.Client, brief bool) (*ext.StatusResponse, error) {
	var st ext.StatusResponse
	h := http.Header{}
	if brief {
		h.Set("brief", "true")
	}
	if err := c.Do(ctx, http.MethodGet, "/healthz", nil, h, nil, &st); err != nil {
		return nil, err
	}
	return &st, nil
}

func newStatusCommand(opts *Options) *cobra.Command {
	var brief bool
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show the agent's status (--brief: one line, non-zero exit unless healthy)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := opts.Client()
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 10*time.Second)
			defer cancel()
			st, err := fetchStatus(ctx, c, brief)
			if err != nil {
				if brief {
					return &ExitError{Code: 1, Msg: fmt.Sprintf("unreachable: %v", err)}
				}
				return err
			}
			healthy := st.Cilium != nil && st.Cilium.State == models.StatusStateOk
			if brief {
				line := "Ok"
				if !healthy {
					state, msg := "unknown", ""
					if st.Cilium != nil {
						state, msg = st.Cilium.State, st.Cilium.Msg
					}
					return &ExitError{Code: 1, Msg: strings.TrimSpace(state + " " + msg)}
				}
				fmt.Fprintln(cmd.OutOrStdout(), line)
				return nil
			}
			if ok, err := opts.PrintStructured(cmd.OutOrStdout(), st); ok {
				return err
			}
			printStatus(cmd.OutOrStdout(), st)
			if !healthy {
				return &ExitError{Code: 1}
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&brief, "brief", false, "Print one line; exit non-zero unless the agent is healthy")
	return cmd
}

func stateOf(s *models.Status) string {
	if s == nil {
		return "unknown"
	}
	if s.Msg != "" {
		return s.State + "   " + s.Msg
	}
	return s.State
}

func printStatus(w io.Writer, st *ext.StatusResponse) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	defer tw.Flush()
	fmt.Fprintf(tw, "KVStore:\t%s\n", stateOf(st.Kvstore))
	if st.Kubernetes != nil {
		k := st.Kubernetes.State
		if st.Kubernetes.Msg != "" {
			k += "   " + st.Kubernetes.Msg
		}
		fmt.Fprintf(tw, "Kubernetes:\t%s\n", k)
	}
	fmt.Fprintf(tw, "Tendril:\t%s\n", stateOf(st.Cilium))
	t := st.Tendril
	if t == nil {
		return
	}
	fmt.Fprintf(tw, "Version:\t%s\n", t.Version)
	fmt.Fprintf(tw, "Node:\t%s\n", t.NodeName)
	if !t.Started.IsZero() {
		fmt.Fprintf(tw, "Uptime:\t%s\n", time.Since(t.Started).Round(time.Second))
	}
	if st.DatapathMode != "" {
		fmt.Fprintf(tw, "Datapath mode:\t%s (attach: %s)\n", st.DatapathMode, st.AttachMode)
	}
	for _, sec := range t.Sections {
		fmt.Fprintf(tw, "%s:\t\n", sec.Title)
		for _, l := range sec.Lines {
			fmt.Fprintf(tw, "  %s\t%s\n", l.Key, l.Value)
		}
	}
	ok := 0
	for _, m := range t.Modules {
		if m.Level == "Ok" {
			ok++
		}
	}
	fmt.Fprintf(tw, "Modules:\t%d/%d healthy\n", ok, len(t.Modules))
	for _, m := range t.Modules {
		fmt.Fprintf(tw, "  %s\t%s\t%s\tsince %s\n", m.Module, m.Level, m.Message, m.Since.Format(time.RFC3339))
	}
	fmt.Fprintf(tw, "Bootstrap:\t%s\n", t.Bootstrap.Total.Round(time.Microsecond))
	for _, s := range t.Bootstrap.Steps {
		line := s.Duration.Round(time.Microsecond).String()
		if s.Error != "" {
			line += "   error: " + s.Error
		}
		fmt.Fprintf(tw, "  %s\t%s\n", s.Name, line)
	}
}

func fetchStatusFull(ctx context.Context, opts *Options) (*ext.StatusResponse, error) {
	c, err := opts.Client()
	if err != nil {
		return nil, err
	}
	return fetchStatus(ctx, c, false)
}
