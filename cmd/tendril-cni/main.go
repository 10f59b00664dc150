// Command tendril-cni is Tendril's CNI plugin (spec 1.1). The container
// runtime runs it in the node's network namespace; it asks the agent for
// addresses and an endpoint over the agent's socket. The logic is in pkg/cni.
package main

import (
	"github.com/containernetworking/cni/pkg/skel"

	"github.com/tendril-net/tendril/pkg/cni"
	"github.com/tendril-net/tendril/pkg/version"
)

func main() {
	p := cni.New(cni.DefaultConfig(), nil)
	skel.PluginMainFuncs(p.Funcs(), cni.PluginInfo(), "CNI plugin tendril-cni "+version.String())
}
