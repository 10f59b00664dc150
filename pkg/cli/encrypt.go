package cli

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/tendril-net/tendril/api/v1/ext"
)

// encryptionSection is the title of the wireguard cell's status section
// (pkg/agent/wireguard).
const encryptionSection = "Encryption"

func newEncryptCommand(opts *Options) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "encrypt",
		Short: "Transparent encryption between nodes (WireGuard)",
	}
	cmd.AddCommand(&cobra.Command{
		Use:   "status",
		Short: "Show the node's WireGuard device: its key, and per peer the endpoint, allowed IPs, last handshake and bytes each way",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := context.WithTimeout(cmd.Context(), 10*time.Second)
			defer cancel()
			st, err := fetchStatusFull(ctx, opts)
			if err != nil {
				return err
			}
			sec, on := encryptionOf(st)
			if ok, err := opts.PrintStructured(cmd.OutOrStdout(), sec); ok {
				return err
			}
			printEncryption(cmd.OutOrStdout(), sec, on)
			return nil
		},
	})
	cmd.AddCommand(&cobra.Command{
		Use:   "rotate-key",
		Short: "Give this node a new WireGuard key: set on its device and published in its TendrilNode; the peers take it and handshake again, connections are kept",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := opts.Client()
			if err != nil {
				return err
			}
			var out struct {
				PublicKey string `json:"publicKey"`
			}
			if err := c.Do(cmd.Context(), http.MethodPost, "/encrypt/rotate-key", nil, nil, nil, &out); err != nil {
				return err
			}
			if ok, err := opts.PrintStructured(cmd.OutOrStdout(), &out); ok {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "New public key: %s\n", out.PublicKey)
			return nil
		},
	})
	return cmd
}

// encryptionOf is the status's Encryption section; false when the agent
// has none (encryption off).
func encryptionOf(st *ext.StatusResponse) (ext.Section, bool) {
	if st.Tendril != nil {
		for _, s := range st.Tendril.Sections {
			if s.Title == encryptionSection {
				return s, true
			}
		}
	}
	return ext.Section{Title: encryptionSection}, false
}

func printEncryption(w io.Writer, sec ext.Section, on bool) {
	if !on {
		fmt.Fprintln(w, "Encryption: off (the agent runs without --enable-wireguard)")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	defer tw.Flush()
	for _, l := range sec.Lines {
		fmt.Fprintf(tw, "%s:\t%s\n", l.Key, l.Value)
	}
}
