// Package policycidr keeps the prefixes policy rules name (CIDRs and their
// exceptions) with the node-local identity an in-cluster address inside
// each carries for those rules, in a statedb table reconciled into the
// datapath's policy CIDR map (tdr_policy_cidr_v1).
//
// Why a table of its own: the ipcache resolves an address to one identity,
// the longest prefix's, and a pod's or a node's address keeps its own
// identity there whatever prefix a rule names. A Kubernetes ipBlock,
// though, selects every address in its block, pods' and nodes' included,
// and pods sharing an identity may fall on both sides of a block. So the
// datapath decides by address: for a new flow whose peer is in the
// cluster, it also looks the peer's address up in this map and applies
// the endpoint's entries for the identity it finds beside those for the
// peer's own identity (a deny in either wins).
//
// The identities here are distinct from the CIDR identities the ipcache
// gives addresses outside the cluster (identity.InClusterCIDR is set), so
// an entity selector such as "world" never selects a pod through them.
package policycidr

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"strconv"
	"sync"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"
	"github.com/cilium/statedb/reconciler"

	"github.com/tendril-net/tendril/pkg/identity"
	"github.com/tendril-net/tendril/pkg/reconcile"
)

// TableName is the statedb table's name.
const TableName = "policy-cidrs"

// Prefix is the table's object: one prefix a rule names and the identity
// in-cluster addresses inside it carry for policy.
type Prefix struct {
	Prefix   netip.Prefix
	Identity identity.NumericIdentity
	Status   reconciler.Status
}

// TableHeader implements statedb.TableWritable.
func (p *Prefix) TableHeader() []string { return []string{"Prefix", "Identity", "Status"} }

// TableRow implements statedb.TableWritable.
func (p *Prefix) TableRow() []string {
	return []string{p.Prefix.String(), strconv.FormatUint(uint64(p.Identity), 10), p.Status.String()}
}

func (p *Prefix) clone() *Prefix { c := *p; return &c }

func (p *Prefix) setStatus(s reconciler.Status) *Prefix { p.Status = s; return p }

func (p *Prefix) getStatus() reconciler.Status { return p.Status }

// PrefixIndex is the primary index.
var PrefixIndex = statedb.Index[*Prefix, netip.Prefix]{
	Name:       "prefix",
	FromObject: func(p *Prefix) index.KeySet { return index.NewKeySet(index.NetIPPrefix(p.Prefix)) },
	FromKey:    index.NetIPPrefix,
	FromString: index.NetIPPrefixString,
	Unique:     true,
}

// Backend is the datapath map. Upsert and Delete are idempotent.
type Backend interface {
	Upsert(prefix netip.Prefix, id identity.NumericIdentity) error
	Delete(prefix netip.Prefix) error
	// Prefixes lists what the map holds, for the prune.
	Prefixes() ([]netip.Prefix, error)
}

// Params builds a Table.
type Params struct {
	DB       *statedb.DB
	Jobs     job.Group
	Log      *slog.Logger
	ModuleID cell.FullModuleID
	Backend  Backend
	Options  []reconciler.Option
}

// Table is the writer's API over the table.
type Table struct {
	db    *statedb.DB
	table statedb.RWTable[*Prefix]
	rec   reconciler.Reconciler[*Prefix]

	restoredOnce sync.Once
	restored     func(statedb.WriteTxn)
}

// New creates the table and registers its reconciler on p.Jobs. The prune
// waits for MarkRestored: until the agent has its rules back, an entry of
// the previous run may still be needed (a deny among them), so it stays.
func New(p Params) (*Table, error) {
	if p.Backend == nil {
		return nil, fmt.Errorf("%s: no backend", TableName)
	}
	tbl, err := statedb.NewTable(p.DB, TableName, PrefixIndex)
	if err != nil {
		return nil, fmt.Errorf("%s table: %w", TableName, err)
	}
	t := &Table{db: p.DB, table: tbl}
	wtxn := p.DB.WriteTxn(tbl)
	t.restored = tbl.RegisterInitializer(wtxn, "agent-restore")
	wtxn.Commit()
	opts := append([]reconciler.Option{
		reconciler.WithName(TableName),
		reconciler.WithPruning(reconcile.PruneInterval),
		reconciler.WithRetry(reconcile.RetryMin, reconcile.RetryMax),
	}, p.Options...)
	t.rec, err = reconciler.Register(
		reconciler.Params{Log: p.Log, DB: p.DB, JobGroup: p.Jobs, ModuleID: p.ModuleID},
		tbl, (*Prefix).clone, (*Prefix).setStatus, (*Prefix).getStatus,
		prefixOps(p.Backend, p.Log), nil, opts...)
	if err != nil {
		return nil, fmt.Errorf("%s reconciler: %w", TableName, err)
	}
	return t, nil
}

// Table is the statedb table, for inspection.
func (t *Table) Table() statedb.Table[*Prefix] { return t.table }

// MarkRestored lets the reconciler prune map entries no object backs.
func (t *Table) MarkRestored() {
	t.restoredOnce.Do(func() {
		wtxn := t.db.WriteTxn(t.table)
		t.restored(wtxn)
		wtxn.Commit()
	})
}

// Set makes the table hold exactly want (prefix → identity) in one write
// transaction; unchanged objects are left alone, so the reconciler writes
// only the difference.
func (t *Table) Set(want map[netip.Prefix]identity.NumericIdentity) error {
	// The policy pass calls Set each time: most find the table as wanted,
	// and take no write lock for it.
	if t.holds(want) {
		return nil
	}
	wtxn := t.db.WriteTxn(t.table)
	defer wtxn.Abort()
	for obj := range t.table.All(wtxn) {
		if _, ok := want[obj.Prefix]; ok {
			continue
		}
		if _, _, err := t.table.Delete(wtxn, obj); err != nil {
			return fmt.Errorf("delete %s from %s: %w", obj.Prefix, TableName, err)
		}
	}
	for pf, id := range want {
		pf = pf.Masked()
		if old, _, found := t.table.Get(wtxn, PrefixIndex.Query(pf)); found && old.Identity == id {
			continue
		}
		if _, _, err := t.table.Insert(wtxn, &Prefix{Prefix: pf, Identity: id, Status: reconciler.StatusPending()}); err != nil {
			return fmt.Errorf("insert %s into %s: %w", pf, TableName, err)
		}
	}
	wtxn.Commit()
	return nil
}

// holds reports whether the table holds exactly want.
func (t *Table) holds(want map[netip.Prefix]identity.NumericIdentity) bool {
	txn := t.db.ReadTxn()
	if t.table.NumObjects(txn) != len(want) {
		return false
	}
	for pf, id := range want {
		if obj, _, found := t.table.Get(txn, PrefixIndex.Query(pf.Masked())); !found || obj.Identity != id {
			return false
		}
	}
	return true
}

// Lookup is the identity of exactly prefix pf, if the table holds it.
func (t *Table) Lookup(pf netip.Prefix) (identity.NumericIdentity, bool) {
	obj, _, found := t.table.Get(t.db.ReadTxn(), PrefixIndex.Query(pf.Masked()))
	if !found {
		return 0, false
	}
	return obj.Identity, true
}

// Synced waits until the map holds every change made to the table so far.
func (t *Table) Synced(ctx context.Context) error {
	return reconcile.Synced(ctx, t.rec, t.table.Revision(t.db.ReadTxn()), TableName)
}

// prefixOps write the table to the map and prune map entries no object
// backs: prefixes of rules that are gone, left by a previous run.
func prefixOps(backend Backend, log *slog.Logger) reconcile.PrefixOps[*Prefix] {
	return reconcile.PrefixOps[*Prefix]{
		Prefix: func(p *Prefix) netip.Prefix { return p.Prefix },
		Kernel: reconcile.PrefixKernel[*Prefix]{
			Put:    func(pf netip.Prefix, p *Prefix) error { return backend.Upsert(pf, p.Identity) },
			Delete: backend.Delete,
			List:   reconcile.ListPrefixes("the policy CIDR map", backend.Prefixes),
		},
		Pruned: func(gone []reconcile.Stale) { log.Info("Pruned stale policy CIDR entries", "pruned", len(gone)) },
	}
}
