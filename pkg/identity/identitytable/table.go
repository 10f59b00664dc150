// Package identitytable keeps the identities this node knows (every
// identity of its allocator: the local ones in standalone mode, the
// cluster's in CRD and kvstore mode) in a statedb table, "identities",
// with their labels and this node's references. The allocator stays the
// authority that hands identities out; the table is what readers (the
// policy's selector resolution, the REST API, `tendril statedb`) read:
// one consistent snapshot, without the allocator's lock.
//
// The table follows the allocator's change notifications level-triggered:
// on a notification for an identity it reads the allocator's current
// state of that identity inside the table's write transaction, so
// notifications delivered out of order (they run after the allocator's
// lock is released) cannot leave an older state in the table.
package identitytable

import (
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"

	"github.com/tendril-net/tendril/pkg/identity"
)

// TableName is the table's name.
const TableName = "identities"

// Row is one identity: the table's object, immutable once inserted.
type Row struct {
	ID identity.NumericIdentity
	// Labels are sorted.
	Labels []string
	// References is how many users on this node hold it (endpoints).
	References int
}

// TableHeader implements statedb.TableWritable (`tendril statedb dump`).
func (r *Row) TableHeader() []string { return []string{"ID", "Labels", "References"} }

// TableRow implements statedb.TableWritable.
func (r *Row) TableRow() []string {
	return []string{strconv.FormatUint(uint64(r.ID), 10), strings.Join(r.Labels, ","), strconv.Itoa(r.References)}
}

// IDIndex is the primary index.
var IDIndex = statedb.Index[*Row, identity.NumericIdentity]{
	Name: "id",
	FromObject: func(r *Row) index.KeySet {
		return index.NewKeySet(index.Uint32(uint32(r.ID)))
	},
	FromKey:    func(id identity.NumericIdentity) index.Key { return index.Uint32(uint32(id)) },
	FromString: index.Uint32String,
	Unique:     true,
}

// LabelIndex finds the identities that carry a label ("k8s:app=web").
var LabelIndex = statedb.Index[*Row, string]{
	Name: "label",
	FromObject: func(r *Row) index.KeySet {
		if len(r.Labels) == 0 {
			return index.KeySet{}
		}
		keys := make([]index.Key, len(r.Labels))
		for i, l := range r.Labels {
			keys[i] = index.String(l)
		}
		return index.NewKeySet(keys[0], keys[1:]...)
	},
	FromKey:    index.String,
	FromString: index.FromString,
	Unique:     false,
}

// Table is the identities table following one allocator.
type Table struct {
	db    *statedb.DB
	table statedb.RWTable[*Row]
	alloc identity.Allocator
	log   *slog.Logger
	// generation changes after a commit that added or removed an
	// identity or changed its labels; a change of references alone does
	// not change it (selector results do not depend on them).
	generation atomic.Uint64
}

// New creates the table, fills it with what alloc knows and subscribes
// to alloc's changes. Subscribe it before anyone who reads the table on
// the same notifications (the allocator calls its subscribers in order):
// their reads then see the change.
func New(db *statedb.DB, alloc identity.Allocator, log *slog.Logger) (*Table, error) {
	tbl, err := statedb.NewTable(db, TableName, IDIndex, LabelIndex)
	if err != nil {
		return nil, fmt.Errorf("%s table: %w", TableName, err)
	}
	t := &Table{db: db, table: tbl, alloc: alloc, log: log}
	alloc.Subscribe(func(added, deleted []identity.Identity) {
		ids := make([]identity.NumericIdentity, 0, len(added)+len(deleted))
		for _, i := range added {
			ids = append(ids, i.ID)
		}
		for _, i := range deleted {
			ids = append(ids, i.ID)
		}
		t.sync(ids)
	})
	alloc.SubscribeReferences(func(id identity.NumericIdentity) { t.sync([]identity.NumericIdentity{id}) })
	known := alloc.List()
	ids := make([]identity.NumericIdentity, len(known))
	for i, k := range known {
		ids[i] = k.ID
	}
	t.sync(ids)
	return t, nil
}

// sync writes the allocator's current state of ids into the table, in
// one transaction.
func (t *Table) sync(ids []identity.NumericIdentity) {
	if len(ids) == 0 {
		return
	}
	wtxn := t.db.WriteTxn(t.table)
	defer wtxn.Abort()
	membership := false
	for _, id := range ids {
		old, _, had := t.table.Get(wtxn, IDIndex.Query(id))
		cur, ok := t.alloc.Lookup(id)
		switch {
		case !ok && had:
			if _, _, err := t.table.Delete(wtxn, old); err != nil {
				t.log.Error("Remove an identity from the table", "identity", id, "error", err)
				return
			}
			membership = true
		case ok:
			labels := slices.Sorted(slices.Values(cur.Labels))
			if had && old.References == cur.RefCount && slices.Equal(old.Labels, labels) {
				continue
			}
			if !had || !slices.Equal(old.Labels, labels) {
				membership = true
			}
			if _, _, err := t.table.Insert(wtxn, &Row{ID: id, Labels: labels, References: cur.RefCount}); err != nil {
				t.log.Error("Write an identity to the table", "identity", id, "error", err)
				return
			}
		}
	}
	wtxn.Commit()
	// After the commit: a reader takes the generation before its
	// snapshot, so it never files an older snapshot under a newer
	// generation.
	if membership {
		t.generation.Add(1)
	}
}

// Table is the statedb table, for inspection.
func (t *Table) Table() statedb.Table[*Row] { return t.table }

// DB is the database the table is in.
func (t *Table) DB() *statedb.DB { return t.db }

// Generation changes whenever an identity is added or removed or its
// labels change. Read it before the snapshot it describes.
func (t *Table) Generation() uint64 { return t.generation.Load() }

// List returns every identity, by ID, from one snapshot.
func (t *Table) List() []*Row {
	txn := t.db.ReadTxn()
	out := make([]*Row, 0, t.table.NumObjects(txn))
	for r := range t.table.All(txn) {
		out = append(out, r)
	}
	return out
}

// Lookup returns one identity.
func (t *Table) Lookup(id identity.NumericIdentity) (*Row, bool) {
	r, _, ok := t.table.Get(t.db.ReadTxn(), IDIndex.Query(id))
	return r, ok
}

// WithLabel returns the identities that carry label, by ID.
func (t *Table) WithLabel(label string) []*Row {
	var out []*Row
	for r := range t.table.List(t.db.ReadTxn(), LabelIndex.Query(label)) {
		out = append(out, r)
	}
	return out
}
