// Package prefilter keeps the XDP prefilter's deny list: the CIDRs whose
// packets the host devices drop before the stack sees them, as the
// Cilium v1 API manages them (PATCH and DELETE /v1/prefilter with a
// revision). The list is a statedb table of prefixes, reconciled into the
// prefilter's BPF maps (pkg/datapath/prefilter), and a revision; both are
// saved in the agent's state directory before a change is answered, and
// restored at start, so the list survives a restart (the pinned maps keep
// dropping meanwhile).
package prefilter

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sync"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"
	"github.com/cilium/statedb/reconciler"

	"github.com/tendril-net/tendril/pkg/reconcile"
)

// TableName is the statedb table's name.
const TableName = "prefilter"

// Entry is one denied prefix.
type Entry struct {
	Prefix netip.Prefix
	Status reconciler.Status
}

// TableHeader implements statedb.TableWritable.
func (e *Entry) TableHeader() []string { return []string{"Prefix", "Status"} }

// TableRow implements statedb.TableWritable.
func (e *Entry) TableRow() []string { return []string{e.Prefix.String(), e.Status.String()} }

func (e *Entry) clone() *Entry { c := *e; return &c }

func (e *Entry) setStatus(s reconciler.Status) *Entry { e.Status = s; return e }

func (e *Entry) getStatus() reconciler.Status { return e.Status }

// PrefixIndex is the primary index.
var PrefixIndex = statedb.Index[*Entry, netip.Prefix]{
	Name:       "prefix",
	FromObject: func(e *Entry) index.KeySet { return index.NewKeySet(index.NetIPPrefix(e.Prefix)) },
	FromKey:    index.NetIPPrefix,
	FromString: index.NetIPPrefixString,
	Unique:     true,
}

// Backend is the datapath's deny maps. Put and Delete are idempotent.
type Backend interface {
	Put(netip.Prefix) error
	Delete(netip.Prefix) error
	Prefixes() ([]netip.Prefix, error)
}

// ErrInvalidCIDR marks a request naming a CIDR the prefilter cannot hold
// (the API's 461): the request changes nothing.
var ErrInvalidCIDR = errors.New("invalid CIDR prefix")

// ErrStaleRevision marks a request made against a revision that is no
// longer the list's: someone changed it since the caller read it.
var ErrStaleRevision = errors.New("stale revision")

// ErrFull marks a change that would put more prefixes of a family in the
// list than its map holds.
var ErrFull = errors.New("prefilter full")

// Spec is a deny list at a revision.
type Spec struct {
	Revision int64    `json:"revision"`
	Deny     []string `json:"deny"`
}

// Params builds a List.
type Params struct {
	DB       *statedb.DB
	Jobs     job.Group
	Log      *slog.Logger
	ModuleID cell.FullModuleID
	Backend  Backend
	// StateFile is where the list is saved (the agent's state directory).
	StateFile string
	// MaxPerFamily is each family's capacity (the map's max entries).
	MaxPerFamily int
	Options      []reconciler.Option
}

// List is the deny list: the table's writer, its revision and its file.
type List struct {
	db    *statedb.DB
	table statedb.RWTable[*Entry]
	rec   reconciler.Reconciler[*Entry]
	log   *slog.Logger
	file  string
	max   int

	// mu orders the changes: each checks the revision, saves the file
	// and writes the table before the next.
	mu       sync.Mutex
	revision int64
	realized int64
	done     func(statedb.WriteTxn)
}

// New creates the table, its reconciler (on p.Jobs) and restores the list
// saved by an earlier run. The reconciler prunes map entries the list
// lacks only once the saved list is in the table (it is at once, unless
// the file is unreadable: then the list is rebuilt from the maps
// themselves, so nothing they drop stops being dropped).
func New(p Params) (*List, error) {
	if p.Backend == nil {
		return nil, fmt.Errorf("%s: no backend", TableName)
	}
	tbl, err := statedb.NewTable(p.DB, TableName, PrefixIndex)
	if err != nil {
		return nil, fmt.Errorf("%s table: %w", TableName, err)
	}
	l := &List{db: p.DB, table: tbl, log: p.Log, file: p.StateFile, max: p.MaxPerFamily, revision: 1}
	wtxn := p.DB.WriteTxn(tbl)
	l.done = tbl.RegisterInitializer(wtxn, "prefilter-restore")
	wtxn.Commit()
	opts := append([]reconciler.Option{
		reconciler.WithName(TableName),
		reconciler.WithPruning(reconcile.PruneInterval),
		reconciler.WithRetry(reconcile.RetryMin, reconcile.RetryMax),
		reconciler.WithRefreshing(reconcile.Refresh, nil),
	}, p.Options...)
	l.rec, err = reconciler.Register(
		reconciler.Params{Log: p.Log, DB: p.DB, JobGroup: p.Jobs, ModuleID: p.ModuleID},
		tbl, (*Entry).clone, (*Entry).setStatus, (*Entry).getStatus,
		reconcile.PrefixOps[*Entry]{
			Prefix: func(e *Entry) netip.Prefix { return e.Prefix },
			Kernel: reconcile.PrefixKernel[*Entry]{
				Put:    func(pf netip.Prefix, _ *Entry) error { return p.Backend.Put(pf) },
				Delete: p.Backend.Delete,
				List:   reconcile.ListPrefixes("the prefilter maps", p.Backend.Prefixes),
			},
			Entry: "prefilter prefix",
			Pruned: func(gone []reconcile.Stale) {
				p.Log.Info("Pruned prefilter prefixes the list lacks", "pruned", len(gone))
			},
		}, nil, opts...)
	if err != nil {
		return nil, fmt.Errorf("%s reconciler: %w", TableName, err)
	}
	if err := l.restore(p.Backend); err != nil {
		return nil, err
	}
	return l, nil
}

// Table is the statedb table, for inspection.
func (l *List) Table() statedb.Table[*Entry] { return l.table }

// saved is the state file's content.
type saved struct {
	Revision int64    `json:"revision"`
	Deny     []string `json:"deny"`
}

func (l *List) restore(backend Backend) error {
	var prefixes []netip.Prefix
	data, err := os.ReadFile(l.file)
	switch {
	case errors.Is(err, os.ErrNotExist):
		// No list was ever set here: the maps hold nothing of ours.
	case err != nil:
		return fmt.Errorf("read the saved prefilter list: %w", err)
	default:
		var s saved
		if err := json.Unmarshal(data, &s); err == nil {
			prefixes, err = parseAll(s.Deny)
			if err == nil {
				l.revision = max(s.Revision, 1)
				break
			}
		}
		// A damaged file: what the maps drop stays dropped, and the
		// list is what they hold.
		l.log.Warn("Saved prefilter list unreadable: the list is rebuilt from the pinned maps", "file", l.file, "error", err)
		if prefixes, err = backend.Prefixes(); err != nil {
			return fmt.Errorf("rebuild the prefilter list from its maps: %w", err)
		}
		l.revision = 1
	}
	wtxn := l.db.WriteTxn(l.table)
	defer wtxn.Abort()
	for _, p := range prefixes {
		if _, _, err := l.table.Insert(wtxn, &Entry{Prefix: p, Status: reconciler.StatusPending()}); err != nil {
			return fmt.Errorf("restore %s into %s: %w", p, TableName, err)
		}
	}
	l.done(wtxn)
	wtxn.Commit()
	if len(prefixes) > 0 {
		l.log.Info("Restored the prefilter deny list", "prefixes", len(prefixes), "revision", l.revision)
	}
	return nil
}

// parseAll parses every CIDR, or fails naming the first bad one. A prefix
// is masked (10.1.2.3/8 is 10.0.0.0/8); an IPv4-mapped IPv6 prefix or one
// with a zone is refused, since the datapath sees such sources as IPv4
// packets or not at all.
func parseAll(cidrs []string) ([]netip.Prefix, error) {
	out := make([]netip.Prefix, 0, len(cidrs))
	for _, c := range cidrs {
		p, err := netip.ParsePrefix(c)
		if err != nil {
			return nil, fmt.Errorf("%w %q: %v", ErrInvalidCIDR, c, err)
		}
		if p.Addr().Is4In6() {
			return nil, fmt.Errorf("%w %q: an IPv4-mapped IPv6 prefix; name the IPv4 prefix", ErrInvalidCIDR, c)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// Patch adds cidrs to the list at revision rev (0: whatever the list's),
// and waits until the maps hold them or ctx ends (the change stands
// either way: the reconciler retries). It returns the list after.
func (l *List) Patch(ctx context.Context, rev int64, cidrs []string) (Spec, error) {
	return l.change(ctx, rev, cidrs, true)
}

// Delete removes cidrs from the list, as Patch adds them. A CIDR the list
// lacks is no error.
func (l *List) Delete(ctx context.Context, rev int64, cidrs []string) (Spec, error) {
	return l.change(ctx, rev, cidrs, false)
}

func (l *List) change(ctx context.Context, rev int64, cidrs []string, add bool) (Spec, error) {
	prefixes, err := parseAll(cidrs)
	if err != nil {
		return Spec{}, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if rev != 0 && rev != l.revision {
		return Spec{}, fmt.Errorf("%w: the request is for revision %d, the list is at revision %d (read it again with GET /v1/prefilter)", ErrStaleRevision, rev, l.revision)
	}
	wtxn := l.db.WriteTxn(l.table)
	defer wtxn.Abort()
	want := map[netip.Prefix]bool{}
	for e := range l.table.All(wtxn) {
		want[e.Prefix] = true
	}
	changed := false
	for _, p := range prefixes {
		if want[p] != add {
			want[p] = add
			changed = true
		}
	}
	if !changed {
		return l.spec(wtxn), nil
	}
	var n4, n6 int
	var list []string
	for p, in := range want {
		if !in {
			continue
		}
		if p.Addr().Is4() {
			n4++
		} else {
			n6++
		}
		list = append(list, p.String())
	}
	if l.max > 0 && (n4 > l.max || n6 > l.max) {
		return Spec{}, fmt.Errorf("%w: the list would hold %d IPv4 and %d IPv6 prefixes; each family holds at most %d", ErrFull, n4, n6, l.max)
	}
	slices.Sort(list)
	// Saved before the table changes: a change the agent answered is
	// never lost by a restart.
	if err := l.save(saved{Revision: l.revision + 1, Deny: list}); err != nil {
		return Spec{}, err
	}
	for _, p := range prefixes {
		e := &Entry{Prefix: p, Status: reconciler.StatusPending()}
		if add {
			if _, _, found := l.table.Get(wtxn, PrefixIndex.Query(p)); found {
				continue
			}
			if _, _, err := l.table.Insert(wtxn, e); err != nil {
				return Spec{}, fmt.Errorf("insert %s into %s: %w", p, TableName, err)
			}
		} else if _, _, err := l.table.Delete(wtxn, e); err != nil {
			return Spec{}, fmt.Errorf("delete %s from %s: %w", p, TableName, err)
		}
	}
	l.revision++
	rtxn := wtxn.Commit()
	out := l.spec(rtxn)
	if err := reconcile.Synced(ctx, l.rec, l.table.Revision(rtxn), TableName); err != nil {
		return out, fmt.Errorf("revision %d saved, not yet in the datapath (retried): %w", l.revision, err)
	}
	// A failed write is retried under a later table revision than the one
	// waited for: the entries' status says whether the maps hold them.
	if n, lastErr := l.Pending(); n > 0 {
		return out, fmt.Errorf("revision %d saved, %d CIDRs not yet in the datapath (retried): %s", l.revision, n, lastErr)
	}
	l.realized = l.revision
	return out, nil
}

func (l *List) save(s saved) error {
	data, err := json.Marshal(s)
	if err != nil {
		return fmt.Errorf("encode the prefilter list: %w", err)
	}
	tmp := l.file + ".tmp"
	if err := os.MkdirAll(filepath.Dir(l.file), 0o700); err != nil {
		return fmt.Errorf("save the prefilter list: %w", err)
	}
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return fmt.Errorf("save the prefilter list: %w", err)
	}
	if err := os.Rename(tmp, l.file); err != nil {
		return fmt.Errorf("save the prefilter list: %w", err)
	}
	return nil
}

func (l *List) spec(txn statedb.ReadTxn) Spec {
	s := Spec{Revision: l.revision, Deny: []string{}}
	for e := range l.table.All(txn) {
		s.Deny = append(s.Deny, e.Prefix.String())
	}
	return s
}

// Get returns the list (desired) and what the maps hold of it (realized:
// the prefixes written, at the last revision fully written).
func (l *List) Get() (desired, realized Spec) {
	l.mu.Lock()
	defer l.mu.Unlock()
	txn := l.db.ReadTxn()
	desired = l.spec(txn)
	realized = Spec{Revision: l.realized, Deny: []string{}}
	pending := false
	for e := range l.table.All(txn) {
		if e.Status.Kind == reconciler.StatusKindDone {
			realized.Deny = append(realized.Deny, e.Prefix.String())
		} else {
			pending = true
		}
	}
	if !pending {
		// Restored or retried entries are all in: the list is.
		realized.Revision = l.revision
	}
	return desired, realized
}

// Pending counts the prefixes not yet (or not successfully) written.
func (l *List) Pending() (pending int, lastErr string) {
	for e := range l.table.All(l.db.ReadTxn()) {
		if e.Status.Kind != reconciler.StatusKindDone {
			pending++
			if e.Status.Error != nil {
				lastErr = *e.Status.Error
			}
		}
	}
	return pending, lastErr
}
