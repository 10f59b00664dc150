// Command tendril-cni is Tendril's CNI plugin (spec 1.1). The container
// runtime runs it in the node's network namespace; it forwards the command
// to the agent over the agent's socket, which does the work, and prints the
// agent's answer. The logic is in pkg/cni/plugin.
package main

import (
	"os"

	"github.com/tendril-net/tendril/pkg/cni/plugin"
	"github.com/tendril-net/tendril/pkg/version"
)

func main() {
	os.Exit(plugin.Main(plugin.OS(), "CNI plugin tendril-cni "+version.String()))
}
