// Package epattach is the endpoints table: what the datapath should hold
// for each local endpoint (its endpoint map entries and its programs on
// the host veth), and the statedb reconciler that writes it to the
// kernel, retries failures with backoff and prunes the attachments and
// map entries of endpoints that have no object in the table.
package epattach

import (
	"context"
	"fmt"
	"iter"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"

	"github.com/tendril-net/tendril/pkg/datapath/loader"
	"github.com/tendril-net/tendril/pkg/dbinspect"
	"github.com/tendril-net/tendril/pkg/health"
	"github.com/tendril-net/tendril/pkg/lifecycle"
	"github.com/tendril-net/tendril/pkg/metrics"
	"github.com/tendril-net/tendril/pkg/reconcile"
)

// Kernel is the datapath as the reconciler writes it (the loader in the
// agent); a test injects failures through it.
type Kernel interface {
	// AttachEndpoint writes the endpoint's map entries and attaches its
	// programs; idempotent, and only the entries when the programs are
	// attached already.
	AttachEndpoint(loader.EndpointInfo) error
	// DetachEndpoint removes the endpoint's programs and map entries.
	DetachEndpoint(id uint16, addrs []netip.Addr) error
	// CheckEndpoint is AttachEndpoint believing the kernel rather than
	// the loader's record of the programs: it puts back what someone else
	// removed (a tc filter, the clsact qdisc, a TCX link) and says so.
	CheckEndpoint(loader.EndpointInfo) (reattached bool, err error)
	// AttachedEndpoints and EndpointIDs list the endpoint IDs with
	// programs attached and with endpoint map entries, for the prune.
	AttachedEndpoints() []uint16
	EndpointIDs() ([]uint16, error)
	// PurgeEndpoint removes the map entries of an endpoint whose
	// addresses are not known (the prune), and its programs unless they
	// are on an interface that still exists (keptPrograms: a pod whose
	// state was lost, cut off by its programs rather than left without;
	// loader.PurgeEndpoint).
	PurgeEndpoint(id uint16) (keptPrograms bool, err error)
}

// InitializerRestore is the table initializer that holds the prune back
// until the restored endpoints are in the table (MarkRestored).
const InitializerRestore = "agent-restore"

// Deps are what Register needs.
type Deps struct {
	DB *statedb.DB
	// Jobs runs the reconciler; its jobs must start once the kernel can
	// be written (after the datapath's step).
	Jobs     job.Group
	Log      *slog.Logger
	ModuleID cell.FullModuleID
	Kernel   Kernel
	// CheckInterval is how often each endpoint's attachment is checked in
	// the kernel (0: never). It is a refresh of the reconciler.
	CheckInterval time.Duration
	// Options beyond the defaults (retry backoff, prune interval), for
	// tests.
	Options []reconciler.Option
}

// roundSize is how many objects the reconciler writes before it commits
// their statuses (and their regenerations stop waiting): one, so that of
// a burst of ADDs each waits for its own attach and those queued before
// it (the loader attaches one at a time anyway), as when each called the
// loader itself, not for a batch after it; a round's commit is a write
// transaction of a few microseconds.
const roundSize = 1

// Table is the writers' API over the endpoints table.
type Table struct {
	db    *statedb.DB
	table statedb.RWTable[*Endpoint]
	rec   reconciler.Reconciler[*Endpoint]
	ops   *ops

	restoredOnce sync.Once
	restored     func(statedb.WriteTxn)
}

// Register creates the table and registers its reconciler on d.Jobs; the
// prune waits for MarkRestored. Retries and prunes follow pkg/reconcile's
// intervals; the refresh is the attachment check, every d.CheckInterval.
func Register(d Deps) (*Table, error) {
	tbl, err := NewTable(d.DB)
	if err != nil {
		return nil, fmt.Errorf("endpoints table: %w", err)
	}
	t := &Table{db: d.DB, table: tbl, ops: &ops{kernel: d.Kernel, log: d.Log, deleteErrs: map[uint16]error{}}}
	wtxn := d.DB.WriteTxn(tbl)
	t.restored = tbl.RegisterInitializer(wtxn, InitializerRestore)
	wtxn.Commit()
	opts := append([]reconciler.Option{
		reconciler.WithName(TableName),
		reconciler.WithPruning(reconcile.PruneInterval),
		reconciler.WithRetry(reconcile.RetryMin, reconcile.RetryMax),
		// A regeneration (a CNI ADD) waits for its object's attach: no
		// pause between rounds to gather a batch (statedb's default
		// waits up to 1 ms, which a serial ADD paid every time), and each
		// status committed as soon as its attach is done.
		reconciler.WithRoundLimits(roundSize, rate.NewLimiter(rate.Inf, 1)),
		// The check: an endpoint's programs removed by someone else leave
		// its pod unpoliced (fail open) until they are back. Its
		// refreshes are paced at 100 endpoints a second.
		reconciler.WithRefreshing(d.CheckInterval, rate.NewLimiter(100, 1)),
	}, d.Options...)
	t.rec, err = reconciler.Register(
		reconciler.Params{Log: d.Log, DB: d.DB, JobGroup: d.Jobs, ModuleID: d.ModuleID},
		tbl,
		(*Endpoint).clone,
		(*Endpoint).setStatus,
		(*Endpoint).getStatus,
		t.ops,
		nil,
		opts...,
	)
	if err != nil {
		return nil, fmt.Errorf("endpoints reconciler: %w", err)
	}
	return t, nil
}

// Reattached is how many times the check found an endpoint's programs
// removed by something else and attached them again.
func (t *Table) Reattached() uint64 { return t.ops.reattached.Load() }

// Realization counts the objects by status for the Tables section, and
// the failed detaches being retried as errors too (their rows are gone).
func (t *Table) Realization(txn statedb.ReadTxn) dbinspect.Realization {
	r := dbinspect.CountStatus(t.table.All(txn), (*Endpoint).getStatus)
	if n, last := t.ops.failedDetaches(); n > 0 {
		r.Errors += n
		r.LastError = last.Error()
	}
	return r
}

// Table is the statedb table, for reading and inspection.
func (t *Table) Table() statedb.Table[*Endpoint] { return t.table }

// Get returns endpoint id's object.
func (t *Table) Get(id uint16) (*Endpoint, bool) {
	obj, _, found := t.table.Get(t.db.ReadTxn(), IDIndex.Query(id))
	return obj, found
}

// Upsert records what the datapath should hold for an endpoint, in one
// short write transaction. The object is marked pending (the reconciler
// attaches it) when that changed, or when its last attach failed (the
// caller, a regeneration, wants it tried now); otherwise it is left as
// it is, so an unchanged endpoint costs no kernel write.
func (t *Table) Upsert(info loader.EndpointInfo, namespace, pod string) error {
	next := &Endpoint{EndpointInfo: info, Namespace: namespace, Pod: pod, Status: reconciler.StatusPending()}
	wtxn := t.db.WriteTxn(t.table)
	old, _, found := t.table.Get(wtxn, IDIndex.Query(info.ID))
	if found && old.sameSpec(next) && old.Status.Kind != reconciler.StatusKindError {
		wtxn.Abort()
		return nil
	}
	if _, _, err := t.table.Insert(wtxn, next); err != nil {
		wtxn.Abort()
		return fmt.Errorf("endpoints table: endpoint %d: %w", info.ID, err)
	}
	wtxn.Commit()
	return nil
}

// AddRestored gives each restored endpoint that has no object yet one
// that keeps what the previous run left in the kernel (Restored, done at
// once: the reconciler writes nothing for it), so that the prune never
// detaches an endpoint that is restored but not regenerated yet, or whose
// regeneration failed before it reached the table.
func (t *Table) AddRestored(eps []Endpoint) error {
	wtxn := t.db.WriteTxn(t.table)
	defer wtxn.Abort()
	for _, ep := range eps {
		if _, _, found := t.table.Get(wtxn, IDIndex.Query(ep.ID)); found {
			continue
		}
		ep.Restored = true
		ep.Status = reconciler.StatusDone()
		if _, _, err := t.table.Insert(wtxn, &ep); err != nil {
			return fmt.Errorf("endpoints table: restored endpoint %d: %w", ep.ID, err)
		}
	}
	wtxn.Commit()
	return nil
}

// MarkRestored says that every restored endpoint is in the table: from
// now on the reconciler prunes what no object backs. Idempotent.
func (t *Table) MarkRestored() {
	t.restoredOnce.Do(func() {
		wtxn := t.db.WriteTxn(t.table)
		t.restored(wtxn)
		wtxn.Commit()
	})
}

// Prune asks for a prune now (it still waits for MarkRestored).
func (t *Table) Prune() { t.rec.Prune() }

// WaitRealized waits until the kernel holds endpoint id's current object.
// It returns the reconciler's error when the attach failed (the
// reconciler goes on retrying it), so that the endpoint's regeneration
// fails and is retried like any other failure.
func (t *Table) WaitRealized(ctx context.Context, id uint16) error {
	for {
		obj, _, watch, found := t.table.GetWatch(t.db.ReadTxn(), IDIndex.Query(id))
		if !found {
			return fmt.Errorf("endpoint %d is not in the endpoints table", id)
		}
		switch obj.Status.Kind {
		case reconciler.StatusKindDone:
			return nil
		case reconciler.StatusKindError:
			return fmt.Errorf("attach endpoint %d: %s", id, obj.Status.GetError())
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for endpoint %d to be attached: %w", id, ctx.Err())
		case <-watch:
		}
	}
}

// Delete removes endpoint id's object and waits until the reconciler has
// detached it. A failed detach is returned, and retried by the
// reconciler with backoff (and by the prune) until it succeeds.
func (t *Table) Delete(ctx context.Context, id uint16) error {
	wtxn := t.db.WriteTxn(t.table)
	obj, _, found := t.table.Get(wtxn, IDIndex.Query(id))
	if !found {
		wtxn.Abort()
		return nil
	}
	if _, _, err := t.table.Delete(wtxn, obj); err != nil {
		wtxn.Abort()
		return fmt.Errorf("endpoints table: delete endpoint %d: %w", id, err)
	}
	rev := t.table.Revision(wtxn)
	wtxn.Commit()
	if _, _, err := t.rec.WaitUntilReconciled(ctx, rev); err != nil {
		return fmt.Errorf("wait for endpoint %d to be detached: %w", id, err)
	}
	return t.ops.deleteErr(id)
}

// ops are the reconciler's operations over the kernel.
type ops struct {
	kernel Kernel
	log    *slog.Logger

	mu sync.Mutex
	// deleteErrs holds the last failed detach of each endpoint until one
	// succeeds, for Delete to report.
	deleteErrs map[uint16]error
	// reattached counts the checks that found programs gone.
	reattached atomic.Uint64
}

// failedDetaches counts the detaches that failed and are retried, with
// one of their errors: their objects are gone from the table.
func (o *ops) failedDetaches() (n int, last error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, err := range o.deleteErrs {
		last = err
	}
	return len(o.deleteErrs), last
}

func (o *ops) deleteErr(id uint16) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.deleteErrs[id]
}

// Update attaches the endpoint (its map entries, then its programs); a
// refresh (the periodic check) checks the kernel for its programs and
// attaches again what is gone. A restored endpoint not regenerated yet is
// left as the previous run left it: its facts (identity, flags) are not
// known to be current.
func (o *ops) Update(_ context.Context, _ statedb.ReadTxn, _ statedb.Revision, e *Endpoint) error {
	if e.Restored {
		return nil
	}
	if e.Status.Kind == reconciler.StatusKindRefreshing {
		reattached, err := o.kernel.CheckEndpoint(e.EndpointInfo)
		if err != nil {
			return fmt.Errorf("check endpoint %d: %w", e.ID, err)
		}
		if reattached {
			o.reattached.Add(1)
			o.log.Warn("Attached the programs of an endpoint again: something else had removed them, and its pod was not policed meanwhile",
				"endpoint", e.ID, "pod", e.Namespace+"/"+e.Pod, "interface", e.IfName)
		}
		return nil
	}
	if err := o.kernel.AttachEndpoint(e.EndpointInfo); err != nil {
		return fmt.Errorf("attach endpoint %d: %w", e.ID, err)
	}
	// The ID's new interface has its programs, and the attach removed
	// those of a former one: a failed detach under this ID is over.
	o.mu.Lock()
	delete(o.deleteErrs, e.ID)
	o.mu.Unlock()
	return nil
}

// Delete detaches the endpoint and removes its map entries.
func (o *ops) Delete(_ context.Context, _ statedb.ReadTxn, _ statedb.Revision, e *Endpoint) error {
	err := o.kernel.DetachEndpoint(e.ID, e.Addresses)
	if err != nil {
		err = fmt.Errorf("detach endpoint %d: %w", e.ID, err)
	}
	o.mu.Lock()
	if err != nil {
		o.deleteErrs[e.ID] = err
	} else {
		delete(o.deleteErrs, e.ID)
	}
	o.mu.Unlock()
	return err
}

// Prune removes the map entries and programs of every endpoint ID that
// has no object: endpoints of a previous run that were not restored (their
// state is gone, or their interface), and detaches that failed. Programs
// on an interface that still exists stay (loader.PurgeEndpoint): they cut
// the pod off until its interface goes, and a later prune removes them.
func (o *ops) Prune(_ context.Context, _ statedb.ReadTxn, objs iter.Seq2[*Endpoint, statedb.Revision]) error {
	mapped, err := o.kernel.EndpointIDs()
	if err != nil {
		return fmt.Errorf("list the endpoint map: %w", err)
	}
	have := slices.Compact(slices.Sorted(slices.Values(append(mapped, o.kernel.AttachedEndpoints()...))))
	want := map[uint16]struct{}{}
	for e := range objs {
		want[e.ID] = struct{}{}
	}
	var pruned, cutOff []uint16
	_, err = reconcile.PruneStale(have, want, func(id uint16) error {
		kept, err := o.kernel.PurgeEndpoint(id)
		if err != nil {
			return err
		}
		if kept {
			cutOff = append(cutOff, id)
		} else {
			pruned = append(pruned, id)
		}
		o.mu.Lock()
		delete(o.deleteErrs, id)
		o.mu.Unlock()
		return nil
	})
	if len(pruned) > 0 {
		o.log.Info("Pruned the datapath of endpoints that no longer exist", "endpoints", pruned)
	}
	if len(cutOff) > 0 {
		o.log.Warn("Endpoints that were not restored keep their programs while their interfaces exist: their pods' traffic is dropped until they go",
			"endpoints", cutOff)
	}
	return err
}

// Cell provides the endpoints table (nil without the datapath) with its
// reconciler over the datapath's kernel side. Its jobs start after the
// datapath's step (the cell is built after the datapath, whose kernel it
// takes), so the maps are open when it writes them.
var Cell = cell.Module("endpoints-table", "The endpoints table and the reconciler of their attachments",
	cell.Provide(lifecycle.Build[*Table]),
	cell.Provide(New),
)

// Config is what the agent's options say of the endpoints table.
type Config struct {
	// CheckInterval is how often each endpoint's programs are checked in
	// the kernel and attached again when gone (0: never).
	CheckInterval time.Duration
}

// Params are the cell's dependencies.
type Params struct {
	cell.In

	Config    Config
	Metrics   *metrics.Server
	Log       *slog.Logger
	DB        *statedb.DB
	Inspector *dbinspect.Inspector
	Jobs      job.Registry
	Health    *health.Registry
	ModuleID  cell.FullModuleID
	Kernel    Kernel // the datapath's (agentdatapath.Kernel); nil without the datapath
}

// New registers the table and its reconciler; nil without the datapath.
func New(p Params) (*Table, error) {
	if p.Kernel == nil {
		return nil, nil
	}
	t, err := Register(Deps{
		DB: p.DB, Log: p.Log, ModuleID: p.ModuleID, Kernel: p.Kernel, CheckInterval: p.Config.CheckInterval,
		Jobs: p.Jobs.NewGroup(p.Health.Scope("bpf-maps"), job.WithLogger(p.Log)),
	})
	if err != nil {
		return nil, err
	}
	p.Metrics.Registry.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Namespace: "tendril", Subsystem: "endpoint", Name: "programs_reattached_total",
		Help: "Times the periodic check found an endpoint's programs removed by something else and attached them again.",
	}, func() float64 { return float64(t.Reattached()) }))
	p.Inspector.AddReconciled(TableName, t.Realization)
	return t, nil
}
