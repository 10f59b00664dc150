// Package dbinspect shows the agent's statedb tables for debugging a live
// node: statedb's own HTTP handler (dumps of tables as JSON, queries,
// changes) mounted under the agent's API, a summary per table with how
// many of its objects the reconcilers have not realized yet, and the
// objects as rows (their TableHeader and TableRow) for `tendril statedb`.
package dbinspect

import (
	"fmt"
	"iter"
	"net/http"
	"sort"
	"sync"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"

	"github.com/tendril-net/tendril/api/v1/server"
)

// Realization counts a reconciled table's objects by status.
type Realization struct {
	Objects, Pending, Errors int
	// LastError is one of the errors, for display.
	LastError string
}

// Counter counts a reconciled table's objects in txn.
type Counter func(txn statedb.ReadTxn) Realization

// Inspector reads the database for the API and `tendril status`.
type Inspector struct {
	db *statedb.DB

	mu       sync.Mutex
	counters map[string]Counter
}

// New returns an inspector of db.
func New(db *statedb.DB) *Inspector {
	return &Inspector{db: db, counters: map[string]Counter{}}
}

// DB is the database inspected.
func (i *Inspector) DB() *statedb.DB { return i.db }

// AddReconciled registers how to count the objects of a reconciled table
// by status (a table's cell calls it while the hive is built).
func (i *Inspector) AddReconciled(table string, count Counter) {
	i.mu.Lock()
	defer i.mu.Unlock()
	i.counters[table] = count
}

// TableInfo is one table's summary.
type TableInfo struct {
	Name     string `json:"name"`
	Objects  int    `json:"objects"`
	Revision uint64 `json:"revision"`
	// Initialized: every initializer (the sources' initial syncs) is done.
	Initialized         bool     `json:"initialized"`
	PendingInitializers []string `json:"pending-initializers,omitempty"`
	// Reconciled: a reconciler writes the table's objects; then Pending
	// and Errors count those not realized yet.
	Reconciled bool   `json:"reconciled"`
	Pending    int    `json:"pending,omitempty"`
	Errors     int    `json:"errors,omitempty"`
	LastError  string `json:"last-error,omitempty"`
}

// Tables summarizes every table, by name.
func (i *Inspector) Tables() []TableInfo {
	txn := i.db.ReadTxn()
	i.mu.Lock()
	counters := make(map[string]Counter, len(i.counters))
	for k, v := range i.counters {
		counters[k] = v
	}
	i.mu.Unlock()
	var out []TableInfo
	for _, t := range i.db.GetTables(txn) {
		init, _ := t.Initialized(txn)
		ti := TableInfo{Name: t.Name(), Objects: t.NumObjects(txn), Revision: t.Revision(txn),
			Initialized: init, PendingInitializers: t.PendingInitializers(txn)}
		if count, ok := counters[t.Name()]; ok {
			r := count(txn)
			ti.Reconciled, ti.Pending, ti.Errors, ti.LastError = true, r.Pending, r.Errors, r.LastError
		}
		out = append(out, ti)
	}
	sort.Slice(out, func(a, b int) bool { return out[a].Name < out[b].Name })
	return out
}

// Rows is a table's objects as the table prints them.
type Rows struct {
	Table  string     `json:"table"`
	Header []string   `json:"header"`
	Rows   [][]string `json:"rows"`
}

// ErrNoTable is returned for a table the database does not have.
type ErrNoTable string

func (e ErrNoTable) Error() string { return fmt.Sprintf("no statedb table %q", string(e)) }

// Rows returns a table's objects, in primary key order.
func (i *Inspector) Rows(table string) (Rows, error) {
	txn := i.db.ReadTxn()
	meta := i.db.GetTable(txn, table)
	if meta == nil {
		return Rows{}, ErrNoTable(table)
	}
	t := statedb.AnyTable{Meta: meta}
	out := Rows{Table: table, Header: t.TableHeader(), Rows: [][]string{}}
	for obj := range t.All(txn) {
		out.Rows = append(out.Rows, t.TableRow(obj))
	}
	return out, nil
}

// Handler serves, under the path it is mounted at (the agent mounts it at
// /v1/statedb): statedb's handler (GET /dump, /dump/{table}, /query,
// /changes/{table}) and GET /tables (the summaries) and /rows/{table}.
func (i *Inspector) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/", i.db.HTTPHandler())
	mux.HandleFunc("GET /tables", func(w http.ResponseWriter, r *http.Request) {
		server.WriteJSON(w, http.StatusOK, i.Tables())
	})
	mux.HandleFunc("GET /rows/{table}", func(w http.ResponseWriter, r *http.Request) {
		rows, err := i.Rows(r.PathValue("table"))
		if err != nil {
			server.WriteError(w, http.StatusNotFound, err.Error())
			return
		}
		server.WriteJSON(w, http.StatusOK, rows)
	})
	return mux
}

// CountStatus counts a reconciled table's objects by their status (the
// Counter of a table whose objects carry one reconciler.Status).
func CountStatus[Obj any](objs iter.Seq2[Obj, statedb.Revision], status func(Obj) reconciler.Status) Realization {
	var r Realization
	for obj := range objs {
		r.Objects++
		s := status(obj)
		switch s.Kind {
		case reconciler.StatusKindDone, reconciler.StatusKindRefreshing:
			// Refreshing is realized, being written again (a periodic
			// check): not pending to whoever reads the count.
		case reconciler.StatusKindError:
			r.Errors++
			r.LastError = s.GetError()
		default:
			r.Pending++
		}
	}
	return r
}
