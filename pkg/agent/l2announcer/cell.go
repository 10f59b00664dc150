package l2announcer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
	"k8s.io/client-go/kubernetes"

	"github.com/tendril-net/tendril/pkg/dbinspect"
	"github.com/tendril-net/tendril/pkg/health"
	"github.com/tendril-net/tendril/pkg/lifecycle"
	"github.com/tendril-net/tendril/pkg/loadbalancer"
)

// Cell is the L2 announcements' part of the agent: with
// --enable-l2-announcements, the announcer's job (services and devices
// into campaigns and the table) and the table's reconciler (the
// responder map). It provides the *Announcer (nil when off).
var Cell = cell.Module("l2-announcements", "Answers ARP for service addresses admitted by a pool L2 announcement policy",
	cell.Provide(lifecycle.Check(Config.validate)),
	cell.Provide(lifecycle.Build[*Announcer]),
	cell.Config(DefaultConfig()),
	cell.Provide(newCell, statusContribution, tableOf),
)

// Node is this node's name (the leases' holder identity).
type Node struct{ Name string }

// Services are the services tables the announcer reads.
type Services struct {
	Services statedb.Table[*loadbalancer.Service]
	Backends statedb.Table[*loadbalancer.Backend]
}

// DeviceNames returns the devices the host programs are attached to
// (nil func: no datapath).
type DeviceNames func() []string

// Kubernetes returns the client once the agent is connected (nil func:
// standalone).
type Kubernetes func() kubernetes.Interface

// ClusterSource starts following the pools' L2 announcement policies and
// the nodes once the agent is connected (the services have synced): read
// returns the current Cluster as it applies to this node, and changed
// receives after each change of either, until ctx ends.
type ClusterSource func(ctx context.Context) (read func() Cluster, changed <-chan struct{}, err error)

type cellParams struct {
	cell.In

	Config Config
	Node   Node
	// The services tables (the services cell's), by type.
	Services  statedb.Table[*loadbalancer.Service]
	Backends  statedb.Table[*loadbalancer.Backend]
	Devices   DeviceNames
	Kube      Kubernetes
	Cluster   ClusterSource
	Responder Responder `optional:"true"`
	Log       *slog.Logger
	Jobs      job.Registry
	Health    *health.Registry
	DB        *statedb.DB
	Inspector *dbinspect.Inspector
	ModuleID  cell.FullModuleID
}

// Timings of the announcer's job.
const (
	// deviceRefresh: devices' addresses are read again this often.
	deviceRefresh = 30 * time.Second
	// settle batches a burst of table changes into one pass.
	settle = 50 * time.Millisecond
	// pruneInterval: map entries no announcement backs are removed this
	// often (and once the first campaigns have read their leases).
	pruneInterval = 5 * time.Minute
)

func newCell(p cellParams) (*Announcer, error) {
	if !p.Config.Enabled {
		return nil, nil
	}
	if p.Kube == nil {
		return nil, errors.New("enable-l2-announcements: needs Kubernetes (the announcing node is elected with Leases)")
	}
	if p.Cluster == nil {
		return nil, errors.New("enable-l2-announcements: needs Kubernetes (the TendrilLoadBalancerIPPools' l2Announcements say what is announced)")
	}
	if p.Responder == nil || p.Devices == nil {
		return nil, errors.New("enable-l2-announcements: needs the eBPF datapath (the host device programs answer ARP)")
	}
	table, err := NewTable(p.DB)
	if err != nil {
		return nil, err
	}
	wtxn := p.DB.WriteTxn(table)
	synced := table.RegisterInitializer(wtxn, "l2-announcer-leases")
	wtxn.Commit()

	a := NewAnnouncer(p.Config, p.Node.Name, p.DB, table, LeaseCampaign(p.Config, p.Kube, p.Node.Name, p.Log), p.Log)
	jobs := p.Jobs.NewGroup(p.Health.Scope("l2-announcements"), job.WithLogger(p.Log))
	o := &ops{resp: p.Responder, ttl: p.Config.LeaseDuration, garp: sendGARP, clock: monotonicNow, log: p.Log}
	if _, err := reconciler.Register(reconciler.Params{Log: p.Log, DB: p.DB, JobGroup: jobs, ModuleID: p.ModuleID},
		table, (*Announcement).clone, (*Announcement).setStatus, (*Announcement).getStatus, o, nil,
		reconciler.WithName(TableName), reconciler.WithPruning(pruneInterval),
		reconciler.WithRefreshing(p.Config.RetryPeriod, nil), reconciler.WithRetry(100*time.Millisecond, 10*time.Second)); err != nil {
		return nil, fmt.Errorf("%s reconciler: %w", TableName, err)
	}
	p.Inspector.AddReconciled(TableName, func(txn statedb.ReadTxn) dbinspect.Realization {
		return dbinspect.CountStatus(table.All(txn), func(a *Announcement) reconciler.Status { return a.Status })
	})
	run := &runner{a: a, db: p.DB, svc: Services{Services: p.Services, Backends: p.Backends}, devices: p.Devices, cluster: p.Cluster, node: p.Node.Name, log: p.Log,
		report: newRefusalRecorder(p.Kube, p.Node.Name),
		synced: func() {
			w := p.DB.WriteTxn(table)
			synced(w)
			w.Commit()
		}, observeTimeout: p.Config.LeaseDuration}
	jobs.Add(job.OneShot("l2-announcer", func(ctx context.Context, _ cell.Health) error {
		return run.Run(ctx)
	}))
	return a, nil
}

// runner turns the services tables and the devices into the announcer's
// wants, again on every change.
type runner struct {
	a       *Announcer
	db      *statedb.DB
	svc     Services
	devices DeviceNames
	cluster ClusterSource
	node    string
	// report makes a refusal known on its service (an Event); called
	// once per refusal while it lasts.
	report         func(ctx context.Context) (func(Refusal), func())
	log            *slog.Logger
	synced         func()
	observeTimeout time.Duration
}

// Run follows the tables until ctx ends, then stops the campaigns
// (releasing their leases).
func (r *runner) Run(ctx context.Context) error {
	defer r.a.Stop()
	if ok, watch := r.svc.Services.Initialized(r.db.ReadTxn()); !ok {
		select {
		case <-watch:
		case <-ctx.Done():
			return nil
		}
	}
	readCluster, clusterChanged, err := r.cluster(ctx)
	if err != nil {
		return fmt.Errorf("L2 announcements: follow the pools and nodes: %w", err)
	}
	report, stopReports := r.report(ctx)
	defer stopReports()
	reported := map[Refusal]struct{}{}
	ticker := time.NewTicker(deviceRefresh)
	defer ticker.Stop()
	first := true
	// The devices are read at the first pass and on each tick (a failed
	// read again at the next pass), not on every services change.
	var devs []Device
	readDevs := true
	for {
		txn := r.db.ReadTxn()
		svcs, svcWatch := r.svc.Services.AllWatch(txn)
		_, beWatch := r.svc.Backends.AllWatch(txn)
		if readDevs {
			var err error
			if devs, err = ReadDevices(r.devices()); err != nil {
				r.log.Warn("Cannot read the devices for L2 announcements", "error", err)
			}
			readDevs = err != nil
		}
		wants, refused := Wants(r.node, statedb.Collect(svcs), func(n loadbalancer.ServiceName) []*loadbalancer.Backend {
			return statedb.Collect(loadbalancer.ServiceBackends(txn, r.svc.Backends, n))
		}, devs, readCluster())
		r.a.Sync(ctx, wants)
		reported = r.reportNew(refused, reported, report)
		if first {
			// Prune only once the campaigns of the services announced
			// before a restart have read their leases: this node keeps
			// answering for those it still holds.
			octx, cancel := context.WithTimeout(ctx, r.observeTimeout)
			r.a.WaitObserved(octx)
			cancel()
			r.synced()
			first = false
		}
		select {
		case <-ctx.Done():
			return nil
		case <-svcWatch:
		case <-beWatch:
		case <-clusterChanged:
		case <-ticker.C:
			readDevs = true
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(settle):
		}
	}
}

// reportNew reports the refusals not reported in the last pass (a
// refusal that ends and comes back is reported again) and returns the
// set to compare the next pass with.
func (r *runner) reportNew(refused []Refusal, last map[Refusal]struct{}, report func(Refusal)) map[Refusal]struct{} {
	now := make(map[Refusal]struct{}, len(refused))
	for _, x := range refused {
		now[x] = struct{}{}
		if _, ok := last[x]; ok {
			continue
		}
		r.log.Warn("L2 announcement refused", "service", x.Service, "address", x.Addr, "reason", x.Reason)
		report(x)
	}
	return now
}

// tableOf is the announcements table, the cell's typed output: which
// service address this node answers ARP for, on which device, and its
// reconciliation. Nil with announcements off.
func tableOf(a *Announcer) statedb.Table[*Announcement] {
	if a == nil {
		return nil
	}
	return a.table
}
