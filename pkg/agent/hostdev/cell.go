package hostdev

import (
	"context"
	"log/slog"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"

	"github.com/tendril-net/tendril/api/v1/server"
	"github.com/tendril-net/tendril/pkg/datapath/loader"
	"github.com/tendril-net/tendril/pkg/health"
	"github.com/tendril-net/tendril/pkg/metrics"
	"github.com/tendril-net/tendril/pkg/nodemanager"
)

// Cell is the host device programs' part of the agent: it provides the
// node's *Masquerade (nil without the datapath), started after the pod
// datapath's maps are open, and serves its status and NAT table on the
// API. The agent provides Settings and the *loader.Loader.
var Cell = cell.Module("host-devices", "Host device programs masquerading pod traffic leaving the node",
	// Invoke before Provide: one cycle check less (pkg/agent/cells.go).
	cell.Invoke(func(api *server.Server, m *Masquerade) {
		if m != nil {
			m.registerAPI(api)
		}
	}),
	cell.Provide(newCell, statusContribution),
)

// Settings are what the agent tells the cell besides its flags.
type Settings struct {
	Config Config
	// BPFRoot and AttachMode are the pod datapath's: the host programs'
	// links are pinned beside the pods' and attach the same way.
	BPFRoot    string
	AttachMode loader.AttachMode
	// CheckInterval is how often the devices' programs are checked in the
	// kernel and attached again when gone (0: never), as the pods'.
	CheckInterval time.Duration
	// L2Announcements attaches the programs even with masquerade off
	// (their ingress answers ARP for announced addresses).
	L2Announcements bool
	// AutoDevices: with no --devices, attach to the default routes'
	// devices (a cluster node, Kubernetes mode). Off, a standalone agent
	// attaches to no device and reserves no port unless --devices names
	// one.
	AutoDevices bool
}

type cellParams struct {
	cell.In

	Settings  Settings
	Log       *slog.Logger
	Lifecycle cell.Lifecycle
	Jobs      job.Registry
	Health    *health.Registry
	DB        *statedb.DB
	// Peers are the other nodes (the nodes cell's table): their pod
	// CIDRs are not masqueraded.
	Peers statedb.Table[*nodemanager.Peer]
	// Loader is nil without the datapath.
	Loader  *loader.Loader
	Metrics *metrics.Server
}

// addressRefresh is how often the devices' addresses are read again.
const addressRefresh = 30 * time.Second

func newCell(p cellParams) (*Masquerade, error) {
	if p.Loader == nil {
		return nil, nil
	}
	m, err := New(p.Settings.Config, p.Loader, p.DB, p.Peers, p.Settings.AttachMode, p.Settings.BPFRoot, p.Log)
	if err != nil {
		return nil, err
	}
	m.SetL2Announcements(p.Settings.L2Announcements)
	m.SetAutoDevices(p.Settings.AutoDevices)
	p.Metrics.Registry.MustRegister(newCollector(m))
	p.Lifecycle.Append(cell.Hook{
		OnStart: func(ctx cell.HookContext) error { return m.Start(ctx) },
		OnStop:  func(cell.HookContext) error { m.Stop(); return nil },
	})
	if !p.Settings.Config.HostPrograms() {
		return m, nil
	}
	jobs := p.Jobs.NewGroup(p.Health.Scope("host-devices"), job.WithLogger(p.Log))
	jobs.Add(
		job.OneShot("non-masquerade-peers", func(ctx context.Context, _ cell.Health) error {
			m.WatchPeers(ctx)
			return nil
		}),
		job.Timer("masquerade-addresses", func(context.Context) error {
			m.RefreshAddresses()
			return nil
		}, addressRefresh),
	)
	if p.Settings.CheckInterval > 0 {
		jobs.Add(job.Timer("host-program-check", func(context.Context) error {
			m.CheckAttachments()
			return nil
		}, p.Settings.CheckInterval))
	}
	return m, nil
}
