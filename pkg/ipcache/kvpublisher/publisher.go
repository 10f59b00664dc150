// Package kvpublisher keeps this node's keys in the kvstore (its endpoint
// addresses, for other nodes' ipcaches) without making anyone wait for
// etcd. The desired keys are a statedb table ("kvstore-addresses", one
// object per key) that Set and Delete write in one short transaction and
// return; a statedb reconciler writes etcd, records each key's status
// (pending, done, error with the message), retries failures with backoff,
// and once the endpoints are restored and the kvstore's first listing is
// in, prunes this node's keys that no object backs (left by an earlier run
// whose lease is still alive). After a new kvstore session (the keys went
// with the old lease) Republish marks every key to be written again. A
// slow or unreachable etcd therefore delays the keys, never the caller
// (an endpoint's creation, a CNI ADD).
package kvpublisher

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"
	"github.com/cilium/statedb/reconciler"

	"github.com/tendril-net/tendril/pkg/reconcile"
)

// TableName is the name of the publisher's table.
const TableName = "kvstore-addresses"

// Initializers hold the prune back: until the restored endpoints are in
// the table (MarkRestored), and until the kvstore's first listing is in
// the store's view (MarkListed), a key missing from the table may only
// not be there yet.
const (
	InitializerRestore = "agent-restore"
	InitializerListing = "kvstore-listing"
)

// Defaults. A failed write is retried from 100 ms up to every second: a
// failed attempt against a stopped etcd has already waited WriteTimeout
// (etcd's client waits for a connection), and keys should reach etcd soon
// after it is back. The prune runs every 5 minutes.
const (
	DefaultWriteTimeout  = 5 * time.Second
	DefaultRetryMin      = 100 * time.Millisecond
	DefaultRetryMax      = time.Second
	DefaultPruneInterval = 5 * time.Minute
)

// Store writes and lists keys (a kvstore.SharedStore's local keys and its
// view of the prefix).
type Store interface {
	UpsertLocal(ctx context.Context, name string, value []byte) error
	DeleteLocal(ctx context.Context, name string) error
	// List is every key under the prefix as last observed.
	List() map[string][]byte
}

// Key is one key's desired state: the table's object, immutable once
// inserted. A deleted key stays in the table as a tombstone (Value nil)
// until its delete is done, so a delete etcd has not confirmed is visible
// (pending, or failing with the error) like a write.
type Key struct {
	Name string
	// Value is what the key should hold; nil: it should not exist.
	Value []byte
	// Reconciliation is the reconciler's status.
	Reconciliation reconciler.Status
}

// Tombstone says the key should not exist.
func (k *Key) Tombstone() bool { return k.Value == nil }

// TableHeader implements statedb.TableWritable (`tendril statedb dump`).
func (k *Key) TableHeader() []string { return []string{"Key", "Value", "Status"} }

// TableRow implements statedb.TableWritable.
func (k *Key) TableRow() []string {
	v := string(k.Value)
	if k.Tombstone() {
		v = "(delete)"
	}
	return []string{k.Name, v, k.Reconciliation.String()}
}

func (k *Key) clone() *Key {
	c := *k
	return &c
}

func (k *Key) setStatus(s reconciler.Status) *Key {
	k.Reconciliation = s
	return k
}

func (k *Key) getStatus() reconciler.Status { return k.Reconciliation }

// NameIndex is the primary index: the key's name under the store's prefix.
var NameIndex = statedb.Index[*Key, string]{
	Name: "name",
	FromObject: func(k *Key) index.KeySet {
		return index.NewKeySet(index.String(k.Name))
	},
	FromKey:    index.String,
	FromString: index.FromString,
	Unique:     true,
}

// Params builds a Publisher.
type Params struct {
	DB       *statedb.DB
	Jobs     job.Group
	Log      *slog.Logger
	ModuleID cell.FullModuleID
	// Store is where the keys go. It is called only from the reconciler's
	// job, so it may be one that exists only once the module's start step
	// has run.
	Store Store
	// Owned says whether a key in the store is this node's: only those
	// are pruned.
	Owned func(name string, value []byte) bool
	// WriteTimeout bounds one write (DefaultWriteTimeout if zero).
	WriteTimeout time.Duration
	// Options beyond the defaults, for tests.
	Options []reconciler.Option
}

// Status says how far the kvstore is behind the desired state.
type Status struct {
	// Keys is how many keys should exist.
	Keys int
	// Pending is how many keys (writes and deletes) are not confirmed yet.
	Pending int
	// LastError is the last failed write (nil if none yet), at
	// LastErrorAt; it stays after later successes, for diagnosis.
	LastError   error
	LastErrorAt time.Time
}

// Publisher is the agent's API over the table.
type Publisher struct {
	db    *statedb.DB
	table statedb.RWTable[*Key]
	log   *slog.Logger
	ops   *ops

	restoredOnce, listedOnce sync.Once
	restored, listed         func(statedb.WriteTxn)
}

// New creates the table and registers its reconciler and the job that
// drops tombstones once their delete is done on p.Jobs.
func New(p Params) (*Publisher, error) {
	tbl, err := statedb.NewTable(p.DB, TableName, NameIndex)
	if err != nil {
		return nil, fmt.Errorf("%s table: %w", TableName, err)
	}
	if p.WriteTimeout <= 0 {
		p.WriteTimeout = DefaultWriteTimeout
	}
	pub := &Publisher{db: p.DB, table: tbl, log: p.Log,
		ops: &ops{store: p.Store, owned: p.Owned, timeout: p.WriteTimeout, log: p.Log}}
	wtxn := p.DB.WriteTxn(tbl)
	pub.restored = tbl.RegisterInitializer(wtxn, InitializerRestore)
	pub.listed = tbl.RegisterInitializer(wtxn, InitializerListing)
	wtxn.Commit()
	_, err = reconciler.Register(reconciler.Params{Log: p.Log, DB: p.DB, JobGroup: p.Jobs, ModuleID: p.ModuleID},
		tbl, (*Key).clone, (*Key).setStatus, (*Key).getStatus, pub.ops, nil,
		append([]reconciler.Option{reconciler.WithName(TableName), reconciler.WithPruning(DefaultPruneInterval),
			reconciler.WithRetry(DefaultRetryMin, DefaultRetryMax)}, p.Options...)...)
	if err != nil {
		return nil, fmt.Errorf("%s reconciler: %w", TableName, err)
	}
	p.Jobs.Add(job.OneShot("kvstore-tombstones", func(ctx context.Context, _ cell.Health) error {
		pub.dropDoneTombstones(ctx)
		return nil
	}))
	return pub, nil
}

// Table is the publisher's table, for inspection.
func (p *Publisher) Table() statedb.Table[*Key] { return p.table }

// DB is the database the table is in.
func (p *Publisher) DB() *statedb.DB { return p.db }

// Set makes name hold value, in one short transaction; it returns at once.
// An unchanged value writes nothing.
func (p *Publisher) Set(name string, value []byte) error {
	wtxn := p.db.WriteTxn(p.table)
	defer wtxn.Abort()
	if old, _, found := p.table.Get(wtxn, NameIndex.Query(name)); found && !old.Tombstone() && bytes.Equal(old.Value, value) {
		return nil
	}
	if _, _, err := p.table.Insert(wtxn, &Key{Name: name, Value: bytes.Clone(value), Reconciliation: reconciler.StatusPending()}); err != nil {
		return fmt.Errorf("kvstore key %s: %w", name, err)
	}
	wtxn.Commit()
	return nil
}

// Delete makes name not exist, in one short transaction; it returns at
// once. Only keys this publisher was asked to Set are deleted: others
// belong to other writers (or to an earlier run, and go with its lease or
// the prune).
func (p *Publisher) Delete(name string) error {
	wtxn := p.db.WriteTxn(p.table)
	defer wtxn.Abort()
	old, _, found := p.table.Get(wtxn, NameIndex.Query(name))
	if !found || old.Tombstone() {
		return nil
	}
	if _, _, err := p.table.Insert(wtxn, &Key{Name: name, Reconciliation: reconciler.StatusPending()}); err != nil {
		return fmt.Errorf("kvstore key %s: %w", name, err)
	}
	wtxn.Commit()
	return nil
}

// Republish marks every key that should exist to be written again (a new
// session: the keys bound to the old lease are gone), in one transaction.
func (p *Publisher) Republish() {
	wtxn := p.db.WriteTxn(p.table)
	defer wtxn.Abort()
	n := 0
	for k := range p.table.All(wtxn) {
		if k.Tombstone() {
			continue
		}
		next := k.clone()
		next.Reconciliation = reconciler.StatusPending()
		if _, _, err := p.table.Insert(wtxn, next); err != nil {
			p.log.Error("Mark a kvstore key to write again", "key", k.Name, "error", err)
			return
		}
		n++
	}
	wtxn.Commit()
	p.log.Info("New kvstore session; publishing every key again", "keys", n)
}

// MarkRestored says the restored endpoints are in the table.
func (p *Publisher) MarkRestored() { p.markInit(&p.restoredOnce, p.restored) }

// MarkListed says the store's view holds the kvstore's first listing.
func (p *Publisher) MarkListed() { p.markInit(&p.listedOnce, p.listed) }

func (p *Publisher) markInit(once *sync.Once, done func(statedb.WriteTxn)) {
	once.Do(func() {
		wtxn := p.db.WriteTxn(p.table)
		done(wtxn)
		wtxn.Commit()
	})
}

// Status counts the table's keys and those not confirmed yet.
func (p *Publisher) Status() Status {
	st := Status{}
	st.LastError, st.LastErrorAt = p.ops.lastError()
	for k := range p.table.All(p.db.ReadTxn()) {
		if !k.Tombstone() {
			st.Keys++
		}
		if k.Reconciliation.Kind != reconciler.StatusKindDone {
			st.Pending++
		}
	}
	return st
}

// Keys returns the names of the keys that should exist, sorted.
func (p *Publisher) Keys() []string {
	var out []string
	for k := range p.table.All(p.db.ReadTxn()) {
		if !k.Tombstone() {
			out = append(out, k.Name)
		}
	}
	slices.Sort(out)
	return out
}

// dropDoneTombstones removes the tombstones whose delete is done, each
// time the table changes: they have nothing left to say. A tombstone the
// key was Set over meanwhile is a new object and stays.
func (p *Publisher) dropDoneTombstones(ctx context.Context) {
	for {
		txn := p.db.ReadTxn()
		objs, watch := p.table.AllWatch(txn)
		type doneKey struct {
			k   *Key
			rev statedb.Revision
		}
		var done []doneKey
		for k, rev := range objs {
			if k.Tombstone() && k.Reconciliation.Kind == reconciler.StatusKindDone {
				done = append(done, doneKey{k, rev})
			}
		}
		if len(done) > 0 {
			wtxn := p.db.WriteTxn(p.table)
			for _, d := range done {
				// Only if unchanged since the read: a Set meanwhile stays.
				if _, _, err := p.table.CompareAndDelete(wtxn, d.rev, d.k); err != nil && !errors.Is(err, statedb.ErrRevisionNotEqual) {
					p.log.Error("Drop a deleted kvstore key from the table", "key", d.k.Name, "error", err)
				}
			}
			wtxn.Commit()
			continue
		}
		select {
		case <-ctx.Done():
			return
		case <-watch:
		}
	}
}

// ops write the table's keys to the store.
type ops struct {
	store   Store
	owned   func(name string, value []byte) bool
	timeout time.Duration
	log     *slog.Logger

	mu        sync.Mutex
	lastErr   error
	lastErrAt time.Time
}

func (o *ops) noteError(err error) error {
	if err != nil {
		o.mu.Lock()
		o.lastErr, o.lastErrAt = err, time.Now()
		o.mu.Unlock()
	}
	return err
}

func (o *ops) lastError() (error, time.Time) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.lastErr, o.lastErrAt
}

// Update writes the key, or deletes it for a tombstone.
func (o *ops) Update(ctx context.Context, _ statedb.ReadTxn, _ statedb.Revision, k *Key) error {
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	if k.Tombstone() {
		if err := o.store.DeleteLocal(ctx, k.Name); err != nil {
			return o.noteError(fmt.Errorf("delete kvstore key %s: %w", k.Name, err))
		}
		return nil
	}
	if err := o.store.UpsertLocal(ctx, k.Name, k.Value); err != nil {
		return o.noteError(fmt.Errorf("write kvstore key %s: %w", k.Name, err))
	}
	return nil
}

// Delete runs when an object leaves the table: only tombstones whose
// delete is done leave it, so there is nothing left to do.
func (o *ops) Delete(context.Context, statedb.ReadTxn, statedb.Revision, *Key) error { return nil }

// Prune deletes this node's keys in the store that the table does not
// want (kept by an earlier run whose lease is still alive).
func (o *ops) Prune(ctx context.Context, _ statedb.ReadTxn, objs iter.Seq2[*Key, statedb.Revision]) error {
	if o.owned == nil {
		return nil
	}
	want := map[string]struct{}{}
	for k := range objs {
		if !k.Tombstone() {
			want[k.Name] = struct{}{}
		}
	}
	have := o.store.List()
	var owned []string
	for _, name := range slices.Sorted(maps.Keys(have)) {
		if o.owned(name, have[name]) {
			owned = append(owned, name)
		}
	}
	_, err := reconcile.PruneStale(owned, want, func(name string) error {
		wctx, cancel := context.WithTimeout(ctx, o.timeout)
		defer cancel()
		if err := o.store.DeleteLocal(wctx, name); err != nil {
			// PruneStale names the key in what it returns.
			o.noteError(fmt.Errorf("prune kvstore key %s: %w", name, err))
			return err
		}
		o.log.Info("Pruned a kvstore key no endpoint of this node backs", "key", name)
		return nil
	})
	return err
}
