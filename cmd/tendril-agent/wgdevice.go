package main

import (
	"log/slog"
	"os"

	"github.com/spf13/cobra"

	"github.com/tendril-net/tendril/pkg/datapath/wireguard"
)

// wireguardDeviceCommand is the hidden subcommand the agent starts, in a
// process and session of its own, to run the userspace WireGuard device
// (--enable-wireguard where the kernel has no WireGuard module): it
// outlives the agent, which finds it again by its control socket.
func wireguardDeviceCommand() *cobra.Command {
	var name string
	var mtu int
	cmd := &cobra.Command{
		Use:          wireguard.ServeSubcommand,
		Short:        "Run the userspace WireGuard device (started by the agent)",
		SilenceUsage: true,
		Args:         cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			return wireguard.Serve(name, mtu, slog.New(slog.NewTextHandler(os.Stderr, nil)))
		},
	}
	cmd.Flags().StringVar(&name, "name", wireguard.DefaultDevice, "Device name")
	cmd.Flags().IntVar(&mtu, "mtu", 1500-wireguard.Overhead, "Device MTU (the agent sets its own)")
	return cmd
}
