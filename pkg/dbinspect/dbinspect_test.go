package dbinspect

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"
	"github.com/cilium/statedb/reconciler"
)

type thing struct {
	Name  string
	State string
}

func (t thing) TableHeader() []string { return []string{"Name", "State"} }
func (t thing) TableRow() []string    { return []string{t.Name, t.State} }

var thingName = statedb.Index[thing, string]{
	Name:       "name",
	FromObject: func(t thing) index.KeySet { return index.NewKeySet(index.String(t.Name)) },
	FromKey:    index.String,
	Unique:     true,
}

// TestHandler: the summaries count a reconciled table's objects with its
// counter, the rows are the objects as the table prints them, statedb's
// own dump is served beside them, and an unknown table is a 404.
func TestHandler(t *testing.T) {
	db := statedb.New()
	tbl, err := statedb.NewTable(db, "things", thingName)
	if err != nil {
		t.Fatal(err)
	}
	wtxn := db.WriteTxn(tbl)
	tbl.RegisterInitializer(wtxn, "source")
	for _, o := range []thing{{"a", "Done"}, {"b", "Error"}, {"c", "Pending"}} {
		if _, _, err := tbl.Insert(wtxn, o); err != nil {
			t.Fatal(err)
		}
	}
	wtxn.Commit()
	in := New(db)
	in.AddReconciled("things", func(txn statedb.ReadTxn) Realization {
		var r Realization
		for o := range tbl.All(txn) {
			r.Objects++
			switch o.State {
			case "Error":
				r.Errors++
				r.LastError = "E2BIG"
			case "Pending":
				r.Pending++
			}
		}
		return r
	})
	srv := httptest.NewServer(http.StripPrefix("/v1/statedb", in.Handler()))
	defer srv.Close()
	get := func(path string, want int, out any) {
		t.Helper()
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != want {
			t.Fatalf("GET %s: %d, want %d", path, resp.StatusCode, want)
		}
		if out != nil {
			if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
				t.Fatalf("GET %s: %v", path, err)
			}
		}
	}
	var tables []TableInfo
	get("/v1/statedb/tables", http.StatusOK, &tables)
	if len(tables) != 1 {
		t.Fatalf("tables %+v", tables)
	}
	ti := tables[0]
	if ti.Name != "things" || ti.Objects != 3 || !ti.Reconciled || ti.Pending != 1 || ti.Errors != 1 || ti.LastError != "E2BIG" ||
		ti.Initialized || strings.Join(ti.PendingInitializers, ",") != "source" {
		t.Fatalf("summary %+v", ti)
	}
	var rows Rows
	get("/v1/statedb/rows/things", http.StatusOK, &rows)
	if strings.Join(rows.Header, ",") != "Name,State" || len(rows.Rows) != 3 || strings.Join(rows.Rows[1], ",") != "b,Error" {
		t.Fatalf("rows %+v", rows)
	}
	get("/v1/statedb/rows/nope", http.StatusNotFound, nil)
	var dump map[string][]thing
	get("/v1/statedb/dump/things", http.StatusOK, &dump)
	if len(dump["things"]) != 3 || dump["things"][2].Name != "c" {
		t.Fatalf("dump %+v", dump)
	}
}

// TestCountStatus: done and refreshing (realized, being checked again)
// count as realized, pending as pending, errors with the last message.
func TestCountStatus(t *testing.T) {
	statuses := []reconciler.Status{
		reconciler.StatusDone(), reconciler.StatusRefreshing(), reconciler.StatusPending(),
		reconciler.StatusError(errors.New("map full")),
	}
	r := CountStatus(func(yield func(reconciler.Status, statedb.Revision) bool) {
		for i, s := range statuses {
			if !yield(s, statedb.Revision(i)) {
				return
			}
		}
	}, func(s reconciler.Status) reconciler.Status { return s })
	if r.Objects != 4 || r.Pending != 1 || r.Errors != 1 || r.LastError != "map full" {
		t.Errorf("got %+v, want 4 objects, 1 pending, 1 error (map full)", r)
	}
}
