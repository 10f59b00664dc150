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
	"github.com/tendril-net/tendril/pkg/agent/hostdev"
	"github.com/tendril-net/tendril/pkg/agent/hostips"
	"github.com/tendril-net/tendril/pkg/agent/l2announcer"
	"github.com/tendril-net/tendril/pkg/agent/nodes"
	"github.com/tendril-net/tendril/pkg/datapath/loader"
)

// wiring gives each cell what it takes from the agent's configuration
// (its config struct and settings) and, where a cell's type already has
// the methods another cell declares as an interface, names the interface
// (as). The cells provide the other adapters themselves, next to the
// interfaces they fill.
var wiring = cell.Provide(
	cellConfigs,
	as[daemonapi.Addressing, *agentendpoints.Module],
	as[agentidentity.Endpoints, *agentendpoints.Module],
	as[agentendpoints.Kubernetes, *agentk8s.Client],
	as[agentk8s.IPCache, *agentdatapath.Module],
	as[agentk8s.Policy, *agentpolicy.Module],
	as[hostips.Endpoints, *agentendpoints.Module],
	as[agentkv.IPCache, *agentdatapath.Module],
	as[nodes.IPCache, *agentdatapath.Module],
	as[agentpolicy.Datapath, *agentdatapath.Module],
	as[agentpolicy.Endpoints, *agentendpoints.Module],
	as[agentpolicy.NamedPorts, *agentk8s.Client],
	as[agentflows.Datapath, *agentdatapath.Module],
	as[agentflows.Endpoints, *agentendpoints.Module],
	as[agentflows.Policy, *agentpolicy.Module],
	as[epattach.Kernel, agentdatapath.Kernel],
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

// configs are the cells' config structs (fields of the agent's Config)
// and their settings: what each reads of the agent-wide options and of
// the other cells' options.
type configs struct {
	cell.Out

	Identity           agentidentity.Config
	IdentitySettings   agentidentity.Settings
	Endpoints          agentendpoints.Config
	EndpointsSettings  agentendpoints.Settings
	Datapath           agentdatapath.Config
	DatapathSettings   agentdatapath.Settings
	Attachments        epattach.Config
	Kubernetes         agentk8s.Config
	KubernetesSettings agentk8s.Settings
	Services           agentservices.Config
	ServicesSettings   agentservices.Settings
	Masquerade         hostdev.Settings
	KVStore            agentkv.Config
	Hubble             agentflows.Config
	HubbleNode         agentflows.Node
	Policy             agentpolicy.Config
	L2                 l2announcer.Config
	L2Node             l2announcer.Node
	Daemon             daemonapi.Settings
}

func cellConfigs(c Config) configs {
	trace, _ := c.Hubble.TraceMode() // validated with the config
	return configs{
		Identity:          c.Identity,
		IdentitySettings:  agentidentity.Settings{NodeName: c.NodeName, Kubernetes: c.Kubernetes.Client.Enabled()},
		Endpoints:         c.Endpoints,
		EndpointsSettings: agentendpoints.Settings{NodeName: c.NodeName, StateDir: c.StateDir},
		Datapath:          c.Datapath,
		DatapathSettings:  agentdatapath.Settings{BPFRoot: c.BPFRoot, TraceEvents: trace, LBSizes: c.Services.LBSizes()},
		Attachments:       epattach.Config{CheckInterval: c.Datapath.AttachmentCheckInterval},
		Kubernetes:        c.Kubernetes,
		KubernetesSettings: agentk8s.Settings{NodeName: c.NodeName, IPAM: c.Endpoints.IPAM, IPv4Range: c.Endpoints.IPv4Range,
			IPv6Range: c.Endpoints.IPv6Range, InstallHostNetworking: c.Endpoints.InstallHostNetworking},
		Services:         c.Services,
		ServicesSettings: agentservices.Settings{NodeName: c.NodeName, BPFRoot: c.BPFRoot, TraceEvents: trace != loader.TraceOff},
		// The host device programs share the pod datapath's BPF root and
		// attach mode.
		Masquerade: hostdev.Settings{Config: c.Masquerade, BPFRoot: c.BPFRoot, AttachMode: loader.AttachMode(c.Datapath.AttachMode),
			CheckInterval:   c.Datapath.AttachmentCheckInterval,
			L2Announcements: c.L2Announcements.Enabled,
			// A cluster node takes its default routes' devices; a
			// standalone agent leaves the machine's uplink alone.
			AutoDevices: c.Kubernetes.Client.Enabled()},
		KVStore: agentkv.Config{Options: c.KVStore, StateDir: c.StateDir, NodeName: c.NodeName,
			IdentityAllocationMode: c.Identity.AllocationMode},
		Hubble:     c.Hubble,
		HubbleNode: agentflows.Node{Name: c.NodeName, APISocket: c.API.Socket},
		Policy:     agentpolicy.Config{StateDir: c.StateDir, RevokeEstablished: c.PolicyRevokeEstablished},
		L2:         c.L2Announcements,
		L2Node:     l2announcer.Node{Name: c.NodeName},
		Daemon: daemonapi.Settings{NodeName: c.NodeName, AttachModeTC: c.Datapath.AttachMode == string(loader.AttachTC), AttachModeNote: c.attachModeNote,
			MTU: c.Endpoints.MTU},
	}
}
