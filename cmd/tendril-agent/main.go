// Command tendril-agent is Tendril's node agent.
package main

import (
	"fmt"
	"os"
)

func main() {
	if err := newCommand(os.Stderr).Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "tendril-agent:", err)
		os.Exit(1)
	}
}
