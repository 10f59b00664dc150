// Command tendril-agent is Tendril's node agent.
package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/tendril-net/tendril/pkg/datapath/wireguard"
)

func main() {
	// startgc's init has raised the garbage collector's target for the
	// process's start; the agent gives it back once ready (newCommand
	// passes startgc.Done as the agent's Ready hook).
	var cmd *cobra.Command
	if len(os.Args) > 1 && os.Args[1] == wireguard.ServeSubcommand {
		// Not a subcommand of the agent's command: the agent's --help
		// and flags stay its own, and the device's process builds no
		// agent.
		cmd = wireguardDeviceCommand()
		cmd.SetArgs(os.Args[2:])
	} else {
		cmd = newCommand(os.Stderr)
	}
	if err := cmd.Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "tendril-agent:", err)
		os.Exit(1)
	}
}
