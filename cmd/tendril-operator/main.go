// Command tendril-operator runs Tendril's cluster-wide jobs (see
// docs/operator.md).
package main

import (
	"fmt"
	"os"

	"github.com/tendril-net/tendril/pkg/operator"
)

func main() {
	if err := operator.NewCommand(os.Stderr).Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "tendril-operator:", err)
		os.Exit(1)
	}
}
