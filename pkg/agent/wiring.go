package agent

import (
	"github.com/cilium/hive/cell"

	"github.com/tendril-net/tendril/pkg/agent/agentdatapath"
	"github.com/tendril-net/tendril/pkg/agent/agentendpoints"
	"github.com/tendril-net/tendril/pkg/agent/agentflows"
	"github.com/tendril-net/tendril/pkg/agent/agentidentity"
	"github.com/tendril-net/tendril/pkg/agent/agentk8s"
	"github.com/tendril-net/tendril/pkg/agent/agentkv"
	"github.com/tendril-net/tendril/pkg/agent/agentpolicy"
	"github.com/tendril-net/tendril/pkg/agent/agentservices"
	"github.com/tendril-net/tendril/pkg/agent/daemonapi"
	"github.com/tendril-net/tendril/pkg/agent/epattach"
	"github.com/tendril-net/tendril/pkg/agent/hostips"
	"github.com/tendril-net/tendril/pkg/agent/nodes"
	"github.com/tendril-net/tendril/pkg/agent/realizer"
)

// wiring names, where a cell's type already has the methods another cell
// declares as an interface, the interface (as). The cells provide the
// other adapters themselves, next to the interfaces they fill, and each
// cell owns its config (cell.Config) and its flags.
var wiring = cell.Provide(
	as[daemonapi.Addressing, *agentendpoints.Module],
	as[agentidentity.Endpoints, *agentendpoints.Module],
	as[agentendpoints.Kubernetes, *agentk8s.Client],
	as[agentk8s.IPCache, *agentdatapath.Module],
	as[agentk8s.Policy, *agentpolicy.Module],
	as[hostips.Endpoints, *agentendpoints.Module],
	as[agentservices.Endpoints, *agentendpoints.Module],
	as[agentkv.IPCache, *agentdatapath.Module],
	as[nodes.IPCache, *agentdatapath.Module],
	as[agentpolicy.Datapath, *agentdatapath.Module],
	as[agentpolicy.Endpoints, *agentendpoints.Module],
	as[agentpolicy.NamedPorts, *agentk8s.Client],
	as[agentpolicy.NodeLabels, *agentk8s.Client],
	as[agentflows.Datapath, *agentdatapath.Module],
	as[agentflows.Endpoints, *agentendpoints.Module],
	as[agentflows.Policy, *agentpolicy.Module],
	as[epattach.Kernel, agentdatapath.Kernel],
	as[agentendpoints.Realizer, *realizer.Realizer],
	as[agentendpoints.PolicyRegeneration, *agentpolicy.Module],
)

// as is a cell's value as the interface I another cell declares; a nil
// pointer (a subsystem that is off) is a nil I, which the cells test for,
// rather than an I holding a nil pointer. A type without I's methods
// fails the hive's build: TestStartOrder builds it with every subsystem
// on.
func as[I any, P comparable](v P) I {
	var none P
	if v == none {
		var nilI I
		return nilI
	}
	return any(v).(I)
}
