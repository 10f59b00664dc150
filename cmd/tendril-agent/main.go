// Command tendril-agent is Tendril's node agent.
package main

import (
	"fmt"
	"os"

	"github.com/tendril-net/tendril/pkg/agent"
	"github.com/tendril-net/tendril/pkg/startgc"
)

func main() {
	// startgc's init has raised the garbage collector's target for the
	// process's start; the agent gives it back once ready.
	if err := agent.NewCommand(os.Stderr, startgc.Done).Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "tendril-agent:", err)
		os.Exit(1)
	}
}
