package ipcache

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"sort"
	"sync"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
	"golang.org/x/time/rate"

	"github.com/tendril-net/tendril/pkg/dbinspect"
	"github.com/tendril-net/tendril/pkg/mapevents"
	"github.com/tendril-net/tendril/pkg/reconcile"
)

// Backend realizes resolved entries (the BPF map). Its methods are the
// reconciler's operations on one prefix: Upsert and Delete must be
// idempotent (deleting an absent prefix is not an error).
type Backend interface {
	Upsert(prefix netip.Prefix, e Entry) error
	Delete(prefix netip.Prefix) error
	// Prefixes lists what the backend holds, for the prune.
	Prefixes() ([]netip.Prefix, error)
}

// BatchBackend is a Backend that also writes many prefixes in one call
// (the BPF map's batch update: one system call for a reconciler round
// instead of one a prefix). UpsertBatch writes in order and returns how
// many it wrote before the first failure, with that failure.
type BatchBackend interface {
	Backend
	UpsertBatch(prefixes []netip.Prefix, entries []Entry) (int, error)
}

// InitializerRestore is the table initializer that holds the prune back
// until the agent has restored its state (MarkRestored).
const InitializerRestore = "agent-restore"

// Params builds an IPCache.
type Params struct {
	DB *statedb.DB
	// Jobs runs the reconciler's goroutines; they start with the group.
	Jobs     job.Group
	Log      *slog.Logger
	ModuleID cell.FullModuleID
	Backend  Backend
	// Reconciler options beyond the defaults (retry backoff, prune
	// interval), for tests.
	Options []reconciler.Option
	// Events records the map writes (GET /v1/map/{name}/events); nil:
	// none.
	Events *mapevents.Ring
}

// IPCache is the writers' API over the ipcache table.
type IPCache struct {
	db    *statedb.DB
	table statedb.RWTable[*PrefixClaims]
	rec   reconciler.Reconciler[*PrefixClaims]
	log   *slog.Logger

	restoredOnce sync.Once
	restored     func(statedb.WriteTxn)

	// queue holds the claims made with UpsertQueued and DeleteQueued
	// until its job writes them in batches.
	queue *queue

	// withdrawn holds the addresses whose effective claim, another node's
	// endpoint or address, was withdrawn or replaced since the last
	// TakeWithdrawnRemote (nil until TrackWithdrawnRemote): the conntrack
	// sweep ends their flows, so that a pod given the address later
	// never meets a flow admitted for the one before it.
	withdrawnMu sync.Mutex
	withdrawn   map[netip.Addr]struct{}
}

// maxWithdrawn bounds what is kept between two takes: past it, more
// addresses are dropped (their flows expire by the conntrack timers).
const maxWithdrawn = 1 << 16

// TrackWithdrawnRemote starts recording the addresses (single-address
// prefixes) whose effective claim came from another node (kvstore or
// Kubernetes source) and was withdrawn, or replaced by another owner's
// or another identity.
func (c *IPCache) TrackWithdrawnRemote() {
	c.withdrawnMu.Lock()
	defer c.withdrawnMu.Unlock()
	if c.withdrawn == nil {
		c.withdrawn = map[netip.Addr]struct{}{}
	}
}

// TakeWithdrawnRemote returns what was recorded since the last call and
// forgets it.
func (c *IPCache) TakeWithdrawnRemote() []netip.Addr {
	c.withdrawnMu.Lock()
	defer c.withdrawnMu.Unlock()
	if len(c.withdrawn) == 0 {
		return nil
	}
	out := make([]netip.Addr, 0, len(c.withdrawn))
	for a := range c.withdrawn {
		out = append(out, a)
	}
	clear(c.withdrawn)
	return out
}

func (c *IPCache) noteWithdrawn(addrs []netip.Addr) {
	c.withdrawnMu.Lock()
	defer c.withdrawnMu.Unlock()
	if c.withdrawn == nil {
		return
	}
	for _, a := range addrs {
		if len(c.withdrawn) >= maxWithdrawn {
			return
		}
		c.withdrawn[a] = struct{}{}
	}
}

// remoteHost reports whether a prefix's effective claim is another
// node's, for one address.
func remoteHost(p *PrefixClaims) bool {
	src := p.Resolved.Source
	return p.Prefix.IsSingleIP() && (src == SourceKVStore || src == SourceKubernetes)
}

// New creates the table, registers its reconciler on p.Jobs and holds the
// prune back until MarkRestored.
func New(p Params) (*IPCache, error) {
	if p.Backend == nil {
		return nil, fmt.Errorf("ipcache: no backend")
	}
	tbl, err := NewTable(p.DB)
	if err != nil {
		return nil, fmt.Errorf("ipcache table: %w", err)
	}
	c := &IPCache{db: p.DB, table: tbl, log: p.Log, queue: newQueue(p.Log)}
	wtxn := p.DB.WriteTxn(tbl)
	c.restored = tbl.RegisterInitializer(wtxn, InitializerRestore)
	wtxn.Commit()
	opts := append([]reconciler.Option{
		reconciler.WithName(TableName),
		// Prune once the table is initialized, then every 5 minutes.
		reconciler.WithPruning(reconcile.PruneInterval),
		reconciler.WithRetry(reconcile.RetryMin, reconcile.RetryMax),
		// No pause between rounds: statedb's default (at most 1,000 rounds
		// a second) made every regeneration's WaitRealized wait up to 1 ms
		// for the next round. Batches still fill: the queue commits up to
		// 1,000 claims a transaction, and a round takes all changes since
		// the last.
		reconciler.WithRoundLimits(DefaultRoundSize, rate.NewLimiter(rate.Inf, 1)),
	}, p.Options...)
	// A backend that writes batches gets the round's changes at once.
	var batch reconciler.BatchOperations[*PrefixClaims]
	if bb, ok := p.Backend.(BatchBackend); ok {
		batch = batchOps{backend: bb}
	}
	// An event names the prefix and what its entry holds (map events,
	// GET /v1/map/{name}/events).
	describe := func(p *PrefixClaims) (string, string) {
		v := fmt.Sprintf("identity=%d source=%v", p.Resolved.Identity, p.Resolved.Source)
		if p.Resolved.HostIP.IsValid() {
			v += " tunnel=" + p.Resolved.HostIP.String()
		}
		return p.Prefix.String(), v
	}
	c.rec, err = reconciler.Register(
		reconciler.Params{Log: p.Log, DB: p.DB, JobGroup: p.Jobs, ModuleID: p.ModuleID},
		tbl,
		(*PrefixClaims).clone,
		(*PrefixClaims).setStatus,
		(*PrefixClaims).getStatus,
		mapevents.Ops(prefixOps(p.Backend, p.Log), p.Events, describe),
		mapevents.BatchOps(batch, p.Events, describe),
		opts...,
	)
	if err != nil {
		return nil, fmt.Errorf("ipcache reconciler: %w", err)
	}
	p.Jobs.Add(job.OneShot("ipcache-queue", c.runQueue))
	return c, nil
}

// DefaultRoundSize is the most prefixes one reconciler round writes;
// retries and prunes follow reconcile's defaults.
const DefaultRoundSize = 1000

// Table is the ipcache table, for inspection.
func (c *IPCache) Table() statedb.Table[*PrefixClaims] { return c.table }

// MarkRestored says that the agent has restored its state (its endpoints,
// host addresses, policy prefixes): from now on the reconciler prunes
// backend entries that no claim backs. It takes effect once the claims
// queued before it are in the table (so the prune never removes an entry
// whose claim is still queued). Idempotent.
func (c *IPCache) MarkRestored() {
	c.AfterQueued(func() {
		c.restoredOnce.Do(func() {
			wtxn := c.db.WriteTxn(c.table)
			c.restored(wtxn)
			wtxn.Commit()
		})
	})
}

// AddInitializer holds the prune back until the returned function is
// called as well: a source (the kvstore watch) calls it once its initial
// listing is in the table, so the prune does not delete what the source
// would write again a moment later. Call it while the hive is built;
// the function is idempotent, and takes effect once the claims queued
// before it (UpsertQueued) are in the table.
func (c *IPCache) AddInitializer(name string) func() {
	wtxn := c.db.WriteTxn(c.table)
	done := c.table.RegisterInitializer(wtxn, name)
	wtxn.Commit()
	var once sync.Once
	return func() {
		c.AfterQueued(func() {
			once.Do(func() {
				wtxn := c.db.WriteTxn(c.table)
				done(wtxn)
				wtxn.Commit()
			})
		})
	}
}

// Prune asks for a prune now (it still waits for MarkRestored).
func (c *IPCache) Prune() { c.rec.Prune() }

// Upsert records (or changes) e.Owner's claim in e.Source. A claim keeps
// its place among its source's claims when its owner changes it: it is as
// recent as when it was first made, so a periodic resync of an old object
// does not take the prefix back from a newer one. The backend is written
// by the reconciler; a change that does not change the resolved entry
// does not write it again.
func (c *IPCache) Upsert(prefix netip.Prefix, e Entry) error {
	return c.Write(func(w *Writer) error { return w.Upsert(prefix, e) })
}

// Delete withdraws owner's claim in src; the best remaining claim, if any,
// takes over, else the prefix goes from the table (and the reconciler
// deletes it from the backend). Other owners' claims stay, whatever their
// source.
func (c *IPCache) Delete(prefix netip.Prefix, src Source, owner Owner) error {
	return c.Write(func(w *Writer) error { return w.Delete(prefix, src, owner) })
}

// Writer makes claims in one write transaction (see Write).
type Writer struct {
	c    *IPCache
	wtxn statedb.WriteTxn
	// withdrawn are the remote addresses this transaction took from
	// their owner (see IPCache.TrackWithdrawnRemote).
	withdrawn []netip.Addr
}

// noteChange records old's address when its remote claim stops being the
// effective one as next (nil: the prefix is gone) replaces it.
func (w *Writer) noteChange(old, next *PrefixClaims) {
	if !remoteHost(old) {
		return
	}
	if next == nil || next.Resolved.Owner != old.Resolved.Owner || next.Resolved.Identity != old.Resolved.Identity {
		w.withdrawn = append(w.withdrawn, old.Prefix.Addr())
	}
}

// Write runs fn with the table locked and commits its claims together, or
// none of them if fn fails. A writer with many claims at once (a node's
// addresses, a policy's prefixes, a source's listing) makes them in one
// transaction: each transaction copies the paths it changes in the
// table's trees, so one per claim costs several times more.
func (c *IPCache) Write(fn func(*Writer) error) error {
	wtxn := c.db.WriteTxn(c.table)
	w := &Writer{c: c, wtxn: wtxn}
	if err := fn(w); err != nil {
		wtxn.Abort()
		return err
	}
	wtxn.Commit()
	if len(w.withdrawn) > 0 {
		c.noteWithdrawn(w.withdrawn)
	}
	return nil
}

// Upsert is IPCache.Upsert within the transaction.
func (w *Writer) Upsert(prefix netip.Prefix, e Entry) error {
	if e.Owner == "" {
		return fmt.Errorf("ipcache %s: claim in source %s without an owner", prefix, e.Source)
	}
	prefix = prefix.Masked()
	old, _, found := w.c.table.Get(w.wtxn, PrefixIndex.Query(prefix))
	next := &PrefixClaims{Prefix: prefix}
	var claims []Claim
	if found {
		*next = *old
		claims = old.Claims()
	}
	next.setClaims(withClaim(claims, e))
	setPending(old, found, next)
	if _, _, err := w.c.table.Insert(w.wtxn, next); err != nil {
		return fmt.Errorf("ipcache %s: %w", prefix, err)
	}
	if found {
		w.noteChange(old, next)
	}
	return nil
}

// Delete is IPCache.Delete within the transaction.
func (w *Writer) Delete(prefix netip.Prefix, src Source, owner Owner) error {
	prefix = prefix.Masked()
	old, _, found := w.c.table.Get(w.wtxn, PrefixIndex.Query(prefix))
	if !found {
		return nil
	}
	claims, had := withoutClaim(old.Claims(), src, owner)
	if !had {
		return nil
	}
	var err error
	var next *PrefixClaims
	if len(claims) == 0 {
		_, _, err = w.c.table.Delete(w.wtxn, old)
	} else {
		n := *old
		n.setClaims(claims)
		setPending(old, true, &n)
		next = &n
		_, _, err = w.c.table.Insert(w.wtxn, next)
	}
	if err != nil {
		return fmt.Errorf("ipcache %s: %w", prefix, err)
	}
	w.noteChange(old, next)
	return nil
}

// setPending marks next pending when its resolved entry changed (or is
// new); otherwise it keeps old's status, so the reconciler does not
// rewrite an unchanged entry.
func setPending(old *PrefixClaims, found bool, next *PrefixClaims) {
	if !found || old.Resolved != next.Resolved {
		next.Status = reconciler.StatusPending()
	}
}

// Claims returns every claim of a prefix, the effective one first, then
// by precedence.
func (c *IPCache) Claims(prefix netip.Prefix) []Entry {
	obj, _, found := c.table.Get(c.db.ReadTxn(), PrefixIndex.Query(prefix.Masked()))
	if !found {
		return nil
	}
	claims := obj.Claims()
	out := make([]Entry, len(claims))
	for i, cl := range claims {
		out[i] = cl.Entry
	}
	return out
}

// Lookup returns a prefix's effective entry.
func (c *IPCache) Lookup(prefix netip.Prefix) (Entry, bool) {
	obj, _, found := c.table.Get(c.db.ReadTxn(), PrefixIndex.Query(prefix.Masked()))
	if !found {
		return Entry{}, false
	}
	return obj.Resolved, true
}

// Item is a prefix with its effective entry.
type Item struct {
	Prefix netip.Prefix
	Entry  Entry
}

// List returns every effective entry, by prefix.
func (c *IPCache) List() []Item {
	txn := c.db.ReadTxn()
	out := make([]Item, 0, c.table.NumObjects(txn))
	for obj := range c.table.All(txn) {
		out = append(out, Item{Prefix: obj.Prefix, Entry: obj.Resolved})
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i].Prefix, out[j].Prefix
		if a.Addr() != b.Addr() {
			return a.Addr().Less(b.Addr())
		}
		return a.Bits() < b.Bits()
	})
	return out
}

// Realization counts the objects not yet realized: pending (not yet
// written) and failed (retried with backoff).
func (c *IPCache) Realization() dbinspect.Realization {
	return dbinspect.CountStatus(c.table.All(c.db.ReadTxn()), (*PrefixClaims).getStatus)
}

// Synced waits until the backend holds every change made to the table so
// far and every claim queued so far (no write left pending or failing),
// or ctx ends.
func (c *IPCache) Synced(ctx context.Context) error {
	if err := c.queue.waitQueued(ctx); err != nil {
		return err
	}
	return reconcile.Synced(ctx, c.rec, c.table.Revision(c.db.ReadTxn()), TableName)
}

// WaitRealized waits until the backend holds the current resolved entry
// of each prefix (a prefix no claim names is not waited for). It returns
// the reconciler's error when a write failed (the reconciler goes on
// retrying it), so that a caller that needs the entry in the datapath (an
// endpoint's regeneration) fails and is retried like any other failure.
func (c *IPCache) WaitRealized(ctx context.Context, prefixes ...netip.Prefix) error {
	for {
		txn := c.db.ReadTxn()
		var watch <-chan struct{}
		for _, p := range prefixes {
			obj, _, w, found := c.table.GetWatch(txn, PrefixIndex.Query(p.Masked()))
			if !found {
				continue
			}
			switch obj.Status.Kind {
			case reconciler.StatusKindDone:
				continue
			case reconciler.StatusKindError:
				return fmt.Errorf("ipcache %s: %s", obj.Prefix, obj.Status.GetError())
			}
			watch = w
			break
		}
		if watch == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for the ipcache to be written: %w", ctx.Err())
		case <-watch:
		}
	}
}

// prefixOps are the reconciler's operations: the resolved entry of one
// prefix to the backend, and the prune of what the table does not hold
// (entries of a previous run whose owners are gone).
func prefixOps(backend Backend, log *slog.Logger) reconcile.PrefixOps[*PrefixClaims] {
	return reconcile.PrefixOps[*PrefixClaims]{
		Prefix: func(c *PrefixClaims) netip.Prefix { return c.Prefix },
		Kernel: reconcile.PrefixKernel[*PrefixClaims]{
			Put:    func(p netip.Prefix, c *PrefixClaims) error { return backend.Upsert(p, c.Resolved) },
			Delete: backend.Delete,
			List:   reconcile.ListPrefixes("the ipcache backend", backend.Prefixes),
		},
		Pruned: func(gone []reconcile.Stale) { log.Info("Pruned stale ipcache entries", "pruned", len(gone)) },
	}
}

// batchOps write a reconciler round's changes with the backend's batch
// update; deletes go one by one (rarer, and a batch delete stops at the
// first absent prefix, which a delete must ignore).
type batchOps struct{ backend BatchBackend }

// UpdateBatch writes the batch; an element the batch stops at is written
// alone, so the failure lands on that prefix only (its status, its
// retry) and the batch goes on after it.
func (o batchOps) UpdateBatch(_ context.Context, _ statedb.ReadTxn, batch []reconciler.BatchEntry[*PrefixClaims]) {
	prefixes := make([]netip.Prefix, len(batch))
	entries := make([]Entry, len(batch))
	for i, b := range batch {
		prefixes[i], entries[i] = b.Object.Prefix, b.Object.Resolved
	}
	for i := 0; i < len(batch); {
		n, err := o.backend.UpsertBatch(prefixes[i:], entries[i:])
		i += n
		if err == nil {
			return
		}
		if i < len(batch) {
			batch[i].Result = o.backend.Upsert(prefixes[i], entries[i])
			i++
		}
	}
}

func (o batchOps) DeleteBatch(_ context.Context, _ statedb.ReadTxn, batch []reconciler.BatchEntry[*PrefixClaims]) {
	for i := range batch {
		batch[i].Result = o.backend.Delete(batch[i].Object.Prefix)
	}
}
