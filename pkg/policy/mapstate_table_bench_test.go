package policy_test

import (
	"encoding/binary"
	"fmt"
	"runtime"
	"strconv"
	"testing"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"
	"github.com/cilium/statedb/reconciler"

	"github.com/tendril-net/tendril/pkg/identity"
	"github.com/tendril-net/tendril/pkg/policy"
)

// These benchmarks price the per-endpoint policy map state as a statedb
// table (one row per endpoint and key, with a reconciler status, as the
// ipcache's rows have) against what the realization does today (the map
// state as a Go map, diffed against the realized one per endpoint). The
// numbers and the decision are in docs/architecture.md ("Per-endpoint
// policy map state").

type mapStateRow struct {
	Endpoint uint16
	Key      policy.Key
	Entry    policy.Entry
	Status   reconciler.Status
}

func (r *mapStateRow) TableHeader() []string { return []string{"Endpoint", "Key", "Status"} }
func (r *mapStateRow) TableRow() []string {
	return []string{strconv.Itoa(int(r.Endpoint)), fmt.Sprint(r.Key), r.Status.String()}
}

func mapStateRowKey(ep uint16, k policy.Key) index.Key {
	b := make([]byte, 0, 11)
	b = binary.BigEndian.AppendUint16(b, ep)
	b = binary.BigEndian.AppendUint32(b, uint32(k.Identity))
	b = append(b, k.Direction, k.Proto)
	b = binary.BigEndian.AppendUint16(b, k.Port)
	return append(b, k.PrefixLen)
}

var mapStateRowIndex = statedb.Index[*mapStateRow, index.Key]{
	Name: "endpoint-key",
	FromObject: func(r *mapStateRow) index.KeySet {
		return index.NewKeySet(mapStateRowKey(r.Endpoint, r.Key))
	},
	FromKey: func(k index.Key) index.Key { return k },
	Unique:  true,
}

// bigMapState is n entries: ingress allows of n identities on one port.
func bigMapState(n int) policy.MapState {
	m := make(policy.MapState, n)
	for i := range n {
		m[policy.Key{Identity: identity.NumericIdentity(256 + i), Direction: 0, Proto: 6, Port: 80, PrefixLen: 16}] = policy.Entry{Cookie: 1}
	}
	return m
}

func newMapStateTable(b *testing.B) (*statedb.DB, statedb.RWTable[*mapStateRow]) {
	db := statedb.New()
	tbl, err := statedb.NewTable(db, "policy-map-state", mapStateRowIndex)
	if err != nil {
		b.Fatal(err)
	}
	return db, tbl
}

func fillTable(db *statedb.DB, tbl statedb.RWTable[*mapStateRow], ep uint16, ms policy.MapState) {
	wtxn := db.WriteTxn(tbl)
	for k, e := range ms {
		_, _, _ = tbl.Insert(wtxn, &mapStateRow{Endpoint: ep, Key: k, Entry: e, Status: reconciler.StatusPending()})
	}
	wtxn.Commit()
}

// BenchmarkMapStateTableFill100k: one endpoint's 100,000 entries written
// into the table in one transaction (an endpoint's first regeneration, or
// every endpoint's after a restart). heap-B/row is what the table keeps.
func BenchmarkMapStateTableFill100k(b *testing.B) {
	ms := bigMapState(100_000)
	var before, after runtime.MemStats
	for b.Loop() {
		db, tbl := newMapStateTable(b)
		runtime.GC()
		runtime.ReadMemStats(&before)
		fillTable(db, tbl, 1, ms)
		runtime.GC()
		runtime.ReadMemStats(&after)
		runtime.KeepAlive(tbl)
	}
	b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/100_000, "heap-B/row")
}

// BenchmarkMapStateTableChange1k: a policy change that adds 1,000 entries
// to an endpoint holding 100,000, written as rows in one transaction (the
// table's part of a regeneration proportional to the change).
func BenchmarkMapStateTableChange1k(b *testing.B) {
	ms := bigMapState(100_000)
	db, tbl := newMapStateTable(b)
	fillTable(db, tbl, 1, ms)
	extra := make([]policy.Key, 1000)
	for i := range extra {
		extra[i] = policy.Key{Identity: identity.NumericIdentity(200_000 + i), Proto: 6, Port: 443, PrefixLen: 16}
	}
	for b.Loop() {
		wtxn := db.WriteTxn(tbl)
		for _, k := range extra {
			_, _, _ = tbl.Insert(wtxn, &mapStateRow{Endpoint: 1, Key: k, Entry: policy.Entry{Cookie: 2}, Status: reconciler.StatusPending()})
		}
		wtxn.Commit()
		wtxn = db.WriteTxn(tbl)
		for _, k := range extra {
			_, _, _ = tbl.Delete(wtxn, &mapStateRow{Endpoint: 1, Key: k})
		}
		wtxn.Commit()
	}
}

// BenchmarkMapStateDiff100k: today's path for the same change: the
// resolved map state diffed against the realized one (100,000 entries,
// 1,000 new), giving the map writes to make.
func BenchmarkMapStateDiff100k(b *testing.B) {
	cur := bigMapState(100_000)
	want := bigMapState(100_000)
	for i := range 1000 {
		want[policy.Key{Identity: identity.NumericIdentity(200_000 + i), Proto: 6, Port: 443, PrefixLen: 16}] = policy.Entry{Cookie: 2}
	}
	for b.Loop() {
		up, del := policy.Diff(cur, want)
		if len(up) != 1000 || len(del) != 0 {
			b.Fatalf("diff: %d upserts, %d deletes", len(up), len(del))
		}
	}
}

// BenchmarkMapStateMap100k: the Go map of 100,000 entries the realization
// keeps per endpoint today, for the heap it holds.
func BenchmarkMapStateMap100k(b *testing.B) {
	var before, after runtime.MemStats
	var ms policy.MapState
	for b.Loop() {
		runtime.GC()
		runtime.ReadMemStats(&before)
		ms = bigMapState(100_000)
		runtime.GC()
		runtime.ReadMemStats(&after)
	}
	runtime.KeepAlive(ms)
	b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/100_000, "heap-B/row")
}
