package hostdev

import (
	"context"
	"log/slog"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"

	"github.com/tendril-net/tendril/api/v1/server"
	"github.com/tendril-net/tendril/pkg/agent/agentdatapath"
	"github.com/tendril-net/tendril/pkg/agent/agentk8s"
	"github.com/tendril-net/tendril/pkg/agent/l2announcer"
	"github.com/tendril-net/tendril/pkg/datapath/loader"
	"github.com/tendril-net/tendril/pkg/health"
	"github.com/tendril-net/tendril/pkg/lifecycle"
	"github.com/tendril-net/tendril/pkg/metrics"
	"github.com/tendril-net/tendril/pkg/nodemanager"
	"github.com/tendril-net/tendril/pkg/option"
)

// Cell is the host device programs' part of the agent: it provides the
// node's *Masquerade (nil without the datapath), started after the pod
// datapath's maps are open, and serves its status and NAT table on the
// API. The datapath cell provides the *loader.Loader and the attach mode.
var Cell = cell.Module("host-devices", "Host device programs masquerading pod traffic leaving the node",
	cell.Provide(lifecycle.Check(Config.validate)),
	cell.Provide(func(api *server.Server, m *Masquerade) lifecycle.Invoked {
		if m != nil {
			m.registerAPI(api)
		}
		return lifecycle.Invoked{}
	}),
	cell.Config(DefaultConfig()),
	cell.Provide(newCell, statusContribution),
)

// settings are what the cell takes from the other cells' options.
type settings struct {
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

// settingsOf: the host programs share the pod datapath's BPF root,
// attach mode and check interval; L2 announcements need them; a cluster
// node takes its default routes' devices, a standalone agent leaves the
// machine's uplink alone.
func settingsOf(p cellParams) settings {
	return settings{Config: p.Config, BPFRoot: p.Agent.BPFRoot, AttachMode: p.Attach.Mode,
		CheckInterval: p.Datapath.AttachmentCheckInterval, L2Announcements: p.L2.Enabled, AutoDevices: p.K8s.Client.Enabled()}
}

type cellParams struct {
	cell.In

	Config    Config
	Agent     option.Agent
	Attach    agentdatapath.AttachMode
	Datapath  agentdatapath.Config
	L2        l2announcer.Config
	K8s       agentk8s.Config
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
	st := settingsOf(p)
	m, err := New(st.Config, p.Loader, p.DB, p.Peers, st.AttachMode, st.BPFRoot, p.Log)
	if err != nil {
		return nil, err
	}
	m.SetL2Announcements(st.L2Announcements)
	m.SetAutoDevices(st.AutoDevices)
	m.SetProcFS(p.Agent.ProcFS)
	p.Metrics.Registry.MustRegister(newCollector(m))
	p.Lifecycle.Append(cell.Hook{
		OnStart: func(ctx cell.HookContext) error { return m.Start(ctx) },
		OnStop:  func(cell.HookContext) error { m.Stop(); return nil },
	})
	if !st.Config.HostPrograms() {
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
	if st.CheckInterval > 0 {
		jobs.Add(job.Timer("host-program-check", func(context.Context) error {
			m.CheckAttachments()
			return nil
		}, st.CheckInterval))
	}
	return m, nil
}
