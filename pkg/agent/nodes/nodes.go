// Package nodes is the agent's cell for the cluster's other nodes: it
// owns the nodes and routes tables (pkg/nodemanager) and provides them by
// type, read-only, to whoever reads them (statedb.Table[*nodemanager.Peer],
// statedb.Table[*nodemanager.Route]); the tables exist in every mode, empty
// when nothing fills them. With Kubernetes it also provides the
// *nodemanager.Manager, the sources' only way to write the tables (the
// Node and TendrilNode watchers of pkg/agent/agentk8s), with its
// reconcilers: peers' addresses in the ipcache, routes to their pod
// CIDRs. Sources says whether anything fills the tables at all.
package nodes

import (
	"cmp"
	"log/slog"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/vishvananda/netlink"

	"github.com/tendril-net/tendril/pkg/agent/agentendpoints"
	"github.com/tendril-net/tendril/pkg/agent/agentk8s"
	"github.com/tendril-net/tendril/pkg/dbinspect"
	"github.com/tendril-net/tendril/pkg/health"
	"github.com/tendril-net/tendril/pkg/logging"
	"github.com/tendril-net/tendril/pkg/metrics"
	"github.com/tendril-net/tendril/pkg/nodemanager"
	"github.com/tendril-net/tendril/pkg/option"
)

// Cell provides the nodes and routes tables (read-only, by type), what
// fills them (Sources) and, with Kubernetes, the node manager that writes
// them.
var Cell = cell.Module("nodes", "Other nodes and the routes to their pods",
	cell.ProvidePrivate(nodemanager.NewTables),
	cell.Provide(readTables, sources, newManager),
)

// Sources says what fills the nodes table. Its readers that judge other
// nodes' objects against it tell an empty table (no node known yet, or
// none left) from no source at all (nothing ever will be known): the
// ClaimGate judges a claim on its identity alone in the second case.
type Sources struct {
	// Kubernetes: the Node and TendrilNode watchers (pkg/agent/agentk8s).
	Kubernetes bool
}

// None: nothing fills the nodes table; it stays empty.
func (s Sources) None() bool { return !s.Kubernetes }

// Tables are the tables as everyone but their writer sees them.
type Tables struct {
	cell.Out

	Nodes  statedb.Table[*nodemanager.Peer]
	Routes statedb.Table[*nodemanager.Route]
}

func readTables(t nodemanager.Tables) Tables {
	return Tables{Nodes: t.Nodes, Routes: t.Routes}
}

func sources(c *agentk8s.Client) Sources {
	return Sources{Kubernetes: c != nil}
}

// RouteDevice is the device the routes to the peers' pod CIDRs go to
// instead of via the peers' addresses: the tunnel routing mode's device,
// provided by pkg/agent/tunnel ("" in native routing).
type RouteDevice string

// EncryptionDevice is the encryption's device (pkg/agent/wireguard, ""
// with encryption off): with one, the routes to the peers' pod CIDRs go
// to it, so the host sends pod traffic for other nodes through it.
type EncryptionDevice string

// IPCache takes the peers' remote-node claims (the datapath's ipcache).
type IPCache interface {
	nodemanager.IPCache
}

// Params are the node manager's dependencies.
type Params struct {
	cell.In

	Tables nodemanager.Tables
	Config agentk8s.Config
	// Node is this node's name; EPConfig says whether routes to the
	// peers' pod CIDRs are installed (--install-host-networking).
	Node     option.LocalNode
	EPConfig agentendpoints.Config
	// Client is nil in standalone mode: then nothing writes the tables.
	Client    *agentk8s.Client
	Endpoints *agentendpoints.Module
	// IPCache is nil without the datapath.
	IPCache IPCache `optional:"true"`
	// RouteDevice is set in the tunnel routing mode (optional: a hive
	// without the tunnel cell routes natively).
	RouteDevice RouteDevice `optional:"true"`
	// EncryptionDevice, when set, takes the routes instead (optional: a
	// hive without the wireguard cell encrypts nothing).
	EncryptionDevice EncryptionDevice `optional:"true"`
	DB               *statedb.DB
	Log              *slog.Logger
	Root             cell.RootLogger
	Jobs             job.Registry
	Health           *health.Registry
	ModuleID         cell.FullModuleID
	Inspector        *dbinspect.Inspector
	Metrics          *metrics.Server `optional:"true"`
}

// newManager builds the node manager and registers its reconcilers (nil
// without Kubernetes: no source, no reconciler, empty tables).
func newManager(p Params) (*nodemanager.Manager, error) {
	if p.Client == nil {
		return nil, nil
	}
	var cache nodemanager.IPCache
	if p.IPCache != nil {
		cache = p.IPCache
	}
	var routes nodemanager.RouteBackend
	if p.EPConfig.InstallHostNetworking {
		// The endpoints' step opens the handle; the reconcilers are jobs,
		// started after every step the constructor's parameters appended.
		routes = nodemanager.NetlinkRoutes{Handle: func() *netlink.Handle { return p.Endpoints.Netlink() }, Device: cmp.Or(string(p.EncryptionDevice), string(p.RouteDevice))}
	}
	rules, err := agentk8s.PeerRules(p.Config, p.Client)
	if err != nil {
		return nil, err
	}
	rejected := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "tendril", Subsystem: "node", Name: "pod_cidrs_rejected_total",
		Help: "Pod CIDRs of other nodes refused (no route, no endpoint claims in them), by reason.",
	}, []string{"reason"})
	refused := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "tendril", Subsystem: "node", Name: "addresses_refused_total",
		Help: "Addresses other nodes claim that are not taken as theirs (no remote-node claim, next hop or peer address), by reason.",
	}, []string{"reason"})
	if p.Metrics != nil {
		p.Metrics.Registry.MustRegister(rejected, refused)
	}
	jobs := p.Jobs.NewGroup(p.Health.Scope("nodes"), job.WithLogger(p.Log))
	m, err := nodemanager.New(nodemanager.Params{LocalNode: p.Node.Name, DB: p.DB, Jobs: jobs,
		Log: logging.For(p.Root, "node-manager"), ModuleID: p.ModuleID, Routes: routes, IPCache: cache,
		Rules: rules, Tables: p.Tables,
		OnRejected:       func(_ string, r nodemanager.Rejection) { rejected.WithLabelValues(r.Reason).Inc() },
		OnAddressRefused: func(_ string, r nodemanager.AddressRejection) { refused.WithLabelValues(r.Reason).Inc() }})
	if err != nil {
		return nil, err
	}
	p.Inspector.AddReconciled(nodemanager.NodesTableName, func(txn statedb.ReadTxn) dbinspect.Realization {
		return dbinspect.CountStatus(p.Tables.Nodes.All(txn), func(p *nodemanager.Peer) reconciler.Status { return p.Status })
	})
	if routes != nil {
		p.Inspector.AddReconciled(nodemanager.RoutesTableName, func(txn statedb.ReadTxn) dbinspect.Realization {
			return dbinspect.CountStatus(p.Tables.Routes.All(txn), func(r *nodemanager.Route) reconciler.Status { return r.Status })
		})
	}
	return m, nil
}
