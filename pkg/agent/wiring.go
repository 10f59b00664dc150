package agent

import (
	"github.com/cilium/hive/cell"
	corev1 "k8s.io/api/core/v1"

	"github.com/tendril-net/tendril/pkg/agent/daemonapi"
	"github.com/tendril-net/tendril/pkg/datapath/agentdatapath"
	"github.com/tendril-net/tendril/pkg/datapath/hostdev"
	"github.com/tendril-net/tendril/pkg/datapath/hostips"
	"github.com/tendril-net/tendril/pkg/datapath/loader"
	"github.com/tendril-net/tendril/pkg/endpoint"
	"github.com/tendril-net/tendril/pkg/endpointmanager"
	"github.com/tendril-net/tendril/pkg/endpointmanager/agentendpoints"
	"github.com/tendril-net/tendril/pkg/hubble/agentflows"
	"github.com/tendril-net/tendril/pkg/identity/agentidentity"
	"github.com/tendril-net/tendril/pkg/k8s/agentk8s"
	"github.com/tendril-net/tendril/pkg/k8s/watchers"
	"github.com/tendril-net/tendril/pkg/kvstore/agentkv"
	"github.com/tendril-net/tendril/pkg/loadbalancer/agentservices"
	"github.com/tendril-net/tendril/pkg/loadbalancer/l2announcer"
	"github.com/tendril-net/tendril/pkg/policy/agentpolicy"
)

// wiring gives each cell what it takes from the agent's configuration
// (its config struct and settings) and from other cells, as the types its
// package declares. It is the only place that knows both sides; where a
// cell's type already has the methods another declares, the provider only
// names the interface (as).
var wiring = cell.Provide(
	cellConfigs, daemonSettings, identitySettings, endpointsSettings, datapathSettings, k8sSettings,
	servicesSettings, masqueradeSettings, kvstoreConfig, flowsNode, datapathLoader,
	as[agentidentity.Endpoints, *agentendpoints.Module],
	as[agentendpoints.Kubernetes, *agentk8s.Client],
	as[agentk8s.IPCache, *agentdatapath.Module],
	as[agentk8s.Policy, *agentpolicy.Module],
	as[hostips.Endpoints, *agentendpoints.Module],
	as[agentkv.IPCache, *agentdatapath.Module],
	as[agentpolicy.Datapath, *agentdatapath.Module],
	as[agentpolicy.Endpoints, *agentendpoints.Module],
	as[agentpolicy.NamedPorts, *agentk8s.Client],
	as[agentflows.Datapath, *agentdatapath.Module],
	as[agentflows.Endpoints, *agentendpoints.Module],
	as[agentflows.Policy, *agentpolicy.Module],
	endpointsPolicyModel, servicesWatchers, kvstoreEndpoints, kvstoreNodeIP, flowsServices, flowsNodeEvents,
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

// configs are the cells' config structs, fields of the agent's Config.
type configs struct {
	cell.Out

	Identity   agentidentity.Config
	Endpoints  agentendpoints.Config
	Datapath   agentdatapath.Config
	Kubernetes agentk8s.Config
	Services   agentservices.Config
	Hubble     agentflows.Config
	Policy     agentpolicy.Config
	L2         l2announcer.Config
	L2Node     l2announcer.Node
}

func cellConfigs(cfg Config) configs {
	return configs{Identity: cfg.Identity, Endpoints: cfg.Endpoints, Datapath: cfg.Datapath, Kubernetes: cfg.Kubernetes,
		Services: cfg.Services, Hubble: cfg.Hubble, Policy: agentpolicy.Config{StateDir: cfg.StateDir},
		L2: cfg.L2Announcements, L2Node: l2announcer.Node{Name: cfg.NodeName}}
}

// daemonSettings are what the daemon API shows of the configuration.
func daemonSettings(cfg Config, f effectiveFlags, eps *agentendpoints.Module) daemonapi.Settings {
	return daemonapi.Settings{NodeName: cfg.NodeName, AttachModeTC: cfg.Datapath.AttachMode == string(loader.AttachTC),
		MTU: cfg.Endpoints.MTU, Flags: f.set, NodeAddressing: eps.NodeAddressing}
}

func identitySettings(cfg Config) agentidentity.Settings {
	return agentidentity.Settings{NodeName: cfg.NodeName, Kubernetes: cfg.Kubernetes.Client.Enabled()}
}

func endpointsSettings(cfg Config) agentendpoints.Settings {
	return agentendpoints.Settings{NodeName: cfg.NodeName, StateDir: cfg.StateDir}
}

func endpointsPolicyModel(p *agentpolicy.Module) agentendpoints.PolicyModel {
	return p.EndpointPolicyModel
}

func servicesSettings(cfg Config) agentservices.Settings {
	trace, _ := cfg.Hubble.TraceMode() // validated with the config
	return agentservices.Settings{NodeName: cfg.NodeName, BPFRoot: cfg.BPFRoot, TraceEvents: trace != loader.TraceOff}
}

// servicesWatchers are the Kubernetes client's watchers (they exist once
// its step has connected); nil in standalone mode.
func servicesWatchers(k *agentk8s.Client) agentservices.Watchers {
	if k == nil {
		return nil
	}
	return k.Watchers
}

// masqueradeSettings are the host device programs' options and what they
// share with the pod datapath (BPF root, attach mode).
func masqueradeSettings(c Config) hostdev.Settings {
	return hostdev.Settings{Config: c.Masquerade, BPFRoot: c.BPFRoot, AttachMode: loader.AttachMode(c.Datapath.AttachMode),
		L2Announcements: c.L2Announcements.Enabled}
}

// datapathLoader is the pod datapath's loader, whose maps the host device
// programs share and whose promotions to TCX links the endpoints' API
// holds; nil without the datapath.
func datapathLoader(dp *agentdatapath.Module) *loader.Loader {
	if dp == nil {
		return nil
	}
	return dp.Loader()
}

func k8sSettings(cfg Config) agentk8s.Settings {
	return agentk8s.Settings{NodeName: cfg.NodeName, IPAM: cfg.Endpoints.IPAM, IPv4Range: cfg.Endpoints.IPv4Range,
		IPv6Range: cfg.Endpoints.IPv6Range, InstallHostNetworking: cfg.Endpoints.InstallHostNetworking}
}

// datapathSettings are the datapath's settings from the rest of the
// agent's configuration.
func datapathSettings(cfg Config) agentdatapath.Settings {
	trace, _ := cfg.Hubble.TraceMode() // validated with the config
	return agentdatapath.Settings{BPFRoot: cfg.BPFRoot, TraceEvents: trace, LBSizes: cfg.Services.LBSizes()}
}

func kvstoreConfig(cfg Config) agentkv.Config {
	return agentkv.Config{Options: cfg.KVStore, StateDir: cfg.StateDir, NodeName: cfg.NodeName,
		IdentityAllocationMode: cfg.Identity.AllocationMode}
}

// kvEndpoints reads the endpoint manager, which the endpoints' start step
// builds (before the kvstore's), and subscribes to it then.
type kvEndpoints struct{ eps *agentendpoints.Module }

func kvstoreEndpoints(eps *agentendpoints.Module) agentkv.Endpoints { return kvEndpoints{eps} }

func (k kvEndpoints) Subscribe(fn func(endpointmanager.Event)) { k.eps.Manager().Subscribe(fn) }
func (k kvEndpoints) List() []*endpoint.Endpoint               { return k.eps.Manager().List() }
func (k kvEndpoints) Lookup(id string) (*endpoint.Endpoint, error) {
	return k.eps.Manager().Lookup(id)
}

func kvstoreNodeIP(k *agentk8s.Module) agentkv.NodeIP {
	if k == nil {
		return nil
	}
	return k.NodeIP
}

func flowsNode(cfg Config) agentflows.Node {
	return agentflows.Node{Name: cfg.NodeName, APISocket: cfg.API.Socket}
}

func flowsServices(s *agentservices.Module) agentflows.Services {
	if s == nil {
		return agentflows.Services{}
	}
	return agentflows.Services{Tables: s.Tables()}
}

// flowsNodeEvents follows the Node objects for the Peer service; nil in
// standalone mode.
func flowsNodeEvents(k *agentk8s.Client) agentflows.NodeEvents {
	if k == nil {
		return nil
	}
	return func(fn func(watchers.Event[*corev1.Node])) (func(), error) {
		w := k.Watchers()
		if w == nil {
			return nil, nil
		}
		return w.Nodes.Subscribe(fn)
	}
}
