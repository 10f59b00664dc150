// Package cli implements the tendril command line: a client of the agent's
// REST API (status, config, endpoint, identity, policy, bpf...) and the lab.
package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"

	"github.com/tendril-net/tendril/pkg/client"
	"github.com/tendril-net/tendril/pkg/version"
)

// Options are the global flags.
type Options struct {
	Host   string
	Output string
}

// ExitError makes the command exit with Code after printing nothing more.
type ExitError struct {
	Code int
	Msg  string
}

func (e *ExitError) Error() string { return e.Msg }

// NewRootCommand returns the tendril command with every subcommand.
func NewRootCommand() *cobra.Command {
	opts := &Options{}
	root := &cobra.Command{
		Use:           "tendril",
		Short:         "Tendril: eBPF networking, security and observability for Kubernetes",
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			switch opts.Output {
			case "table", "json", "yaml":
				return nil
			}
			return fmt.Errorf("-o %q: must be table, json or yaml", opts.Output)
		},
	}
	root.PersistentFlags().StringVarP(&opts.Host, "host", "H", "", "Agent API: unix://PATH (default $TENDRIL_SOCK or "+client.DefaultSocket+")")
	root.PersistentFlags().StringVarP(&opts.Output, "output", "o", "table", "Output format: table, json or yaml")
	root.AddCommand(
		newStatusCommand(opts),
		newConfigCommand(opts),
		newVersionCommand(opts),
	)
	for _, add := range extraCommands {
		root.AddCommand(add(opts))
	}
	return root
}

// extraCommands are the subcommands of the later capabilities; each file that
// adds one lists its constructor here through addCommand in an init-free way:
// see commands.go.
var extraCommands = commandConstructors()

// Client returns an API client for the global -H flag.
func (o *Options) Client() (*client.Client, error) {
	return client.New(o.Host)
}

// PrintStructured prints v as JSON or YAML; it reports false for table
// output, which the caller renders itself.
func (o *Options) PrintStructured(w io.Writer, v any) (bool, error) {
	switch o.Output {
	case "json":
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return true, enc.Encode(v)
	case "yaml":
		data, err := yaml.Marshal(v)
		if err != nil {
			return true, err
		}
		_, err = w.Write(data)
		return true, err
	}
	return false, nil
}

func newVersionCommand(opts *Options) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the client's version and, if reachable, the agent's",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			out := map[string]string{"client": version.String()}
			if c, err := opts.Client(); err == nil {
				if st, err := fetchStatus(cmd.Context(), c, false); err == nil && st.Tendril != nil {
					out["agent"] = st.Tendril.Version
				}
			}
			if ok, err := opts.PrintStructured(cmd.OutOrStdout(), out); ok {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "Client: %s\n", out["client"])
			if v, ok := out["agent"]; ok {
				fmt.Fprintf(cmd.OutOrStdout(), "Agent:  %s\n", v)
			}
			return nil
		},
	}
}

// Main runs the CLI and returns the process exit code.
func Main() int {
	err := NewRootCommand().Execute()
	if err == nil {
		return 0
	}
	if e, ok := err.(*ExitError); ok {
		if e.Msg != "" {
			fmt.Fprintln(os.Stderr, e.Msg)
		}
		return e.Code
	}
	fmt.Fprintln(os.Stderr, "Error:", err)
	return 1
}
