// Command tendril-agent is Tendril's node agent.
package main

import (
	"fmt"
	"os"

	"github.com/tendril-net/tendril/pkg/agent"
)

func main() {
	if err := agent.NewCommand(os.Stderr).Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "tendril-agent:", err)
		os.Exit(1)
	}
}
