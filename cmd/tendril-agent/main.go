// Command tendril-agent is Tendril's node agent.
package main

import (
	"fmt"
	"os"
)

func main() {
	// startgc's init has raised the garbage collector's target for the
	// process's start; the agent gives it back once ready (newCommand
	// passes startgc.Done as the agent's Ready hook).
	if err := newCommand(os.Stderr).Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "tendril-agent:", err)
		os.Exit(1)
	}
}
