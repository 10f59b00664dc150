package agent

import (
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"

	"github.com/tendril-net/tendril/pkg/agent/agentcore"
	"github.com/tendril-net/tendril/pkg/agent/agentdatapath"
	"github.com/tendril-net/tendril/pkg/agent/agentendpoints"
	"github.com/tendril-net/tendril/pkg/agent/agentflows"
	"github.com/tendril-net/tendril/pkg/agent/agentfqdn"
	"github.com/tendril-net/tendril/pkg/agent/agentidentity"
	"github.com/tendril-net/tendril/pkg/agent/agentk8s"
	"github.com/tendril-net/tendril/pkg/agent/agentkv"
	"github.com/tendril-net/tendril/pkg/agent/agentl7"
	"github.com/tendril-net/tendril/pkg/agent/agentpolicy"
	"github.com/tendril-net/tendril/pkg/agent/agentservices"
	"github.com/tendril-net/tendril/pkg/agent/bgpcp"
	"github.com/tendril-net/tendril/pkg/agent/cgroupmeta"
	"github.com/tendril-net/tendril/pkg/agent/daemonapi"
	"github.com/tendril-net/tendril/pkg/agent/epattach"
	"github.com/tendril-net/tendril/pkg/agent/hostdev"
	"github.com/tendril-net/tendril/pkg/agent/hostips"
	"github.com/tendril-net/tendril/pkg/agent/l2announcer/l2wiring"
	"github.com/tendril-net/tendril/pkg/agent/mapeventlog"
	"github.com/tendril-net/tendril/pkg/agent/nodehealth"
	"github.com/tendril-net/tendril/pkg/agent/nodeids"
	"github.com/tendril-net/tendril/pkg/agent/nodes"
	"github.com/tendril-net/tendril/pkg/agent/prefilter"
	"github.com/tendril-net/tendril/pkg/agent/realizer"
	"github.com/tendril-net/tendril/pkg/agent/tunnel"
	"github.com/tendril-net/tendril/pkg/agent/wireguard"
)

// cells is the agent: one cell per subsystem. Each cell's constructor takes
// its dependencies as parameters and appends its start steps, so a step
// starts after the steps of what it depends on; where two steps do not
// depend on each other, the order of this list decides, and it is the
// seeds' order (docs/architecture.md, TestStartOrder):
//
//	config, k8s-client, bpf-maps, lb-restore, endpoint-restore-ipam, k8s-node-writeback,
//	k8s-watchers, kvstore, identity-restore, host-ips-ct-gc, policy-restore,
//	regenerate-restored, policy-regeneration, l7-proxies, metrics, pprof, hubble, api-server
//
// No module has a cell.Invoke: what must run when the hive is populated
// (a config's check, an object no other cell takes, a registration) is a
// Provide of a lifecycle.Invoked, and the agent's one root Invoke
// (agent.New) takes them all, in this list's order. dig checks the whole
// graph for cycles at the first Invoke in a scope after a Provide, so a
// module's own Invoke cost one full check each: BenchmarkNew's allocations
// fell from 111,039 to 93,197 with the one root Invoke. Inside a module
// the Configs come before the Provides: the module's registration has just
// checked, and a Config registers with an Invoke, which then costs nothing
// (76,796 from 84,862 allocations when that order was set).
func cells() []cell.Cell {
	return []cell.Cell{
		job.Cell,
		wiring,
		agentcore.TablesCell, // statedb's cell and the tables' inspection
		agentcore.Cell,       // the agent's own options, health, steps, API and metrics servers
		agentidentity.Cell,
		agentk8s.ClientCell,
		mapeventlog.Cell, // the recent writes of the ipcache, LB and policy maps (GET /v1/map/{name}/events)
		agentdatapath.Cell,
		epattach.Cell,  // the endpoints table: each endpoint's attachment, reconciled
		hostdev.Cell,   // the host device programs: masquerade at the uplinks
		prefilter.Cell, // the XDP prefilter: denied source CIDRs dropped at the host devices
		agentservices.Cell,
		agentendpoints.Cell,
		nodes.Cell,     // the nodes and routes tables, written by agentk8s's node watchers
		tunnel.Cell,    // the routing mode: native, or the VXLAN/Geneve overlay's device and programs
		nodeids.Cell,   // the other nodes' IDs, kept across restarts (GET /v1/node/ids)
		wireguard.Cell, // transparent encryption between nodes: the WireGuard device and its peers
		nodehealth.Cell,
		agentk8s.Cell,
		l2wiring.Cell, // the L2 announcements with their providers
		bgpcp.Cell,    // the BGP control plane: a speaker announcing pod CIDRs and LoadBalancer addresses
		agentkv.Cell,
		realizer.Cell,
		hostips.Cell,
		agentpolicy.Cell,
		agentfqdn.Cell, // the names the DNS proxy learned: restored into policy before its first regeneration
		agentendpoints.RegenerationCell,
		// The DNS and HTTP proxies the datapath redirects L7 ports to, once
		// the restored endpoints have their policy (the proxies' rules):
		// until then the datapath's fallback lets DNS through unfiltered,
		// where a proxy without rules would refuse allowed names.
		agentl7.Cell,
		agentdatapath.RestoredCell,
		cgroupmeta.Cell, // pods by cgroup ID: socket-LB flows name their client pod
		agentflows.Cell,
		daemonapi.Cell,
		agentcore.ServeCell,
	}
}
