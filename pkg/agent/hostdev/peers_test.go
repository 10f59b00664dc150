package hostdev

import (
	"context"
	"fmt"
	"net/netip"
	"testing"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	"github.com/cilium/statedb"

	"github.com/tendril-net/tendril/pkg/lifecycle"
	"github.com/tendril-net/tendril/pkg/nodemanager"
)

// TestPeerCIDRsFollowTheNodesTable: the peers' pod CIDRs kept off
// masquerade follow the nodes table as the hive provides it by type: a
// peer inserted (or changed, or removed) is applied on the table's own
// event, without polling for the table.
func TestPeerCIDRsFollowTheNodesTable(t *testing.T) {
	var (
		db     *statedb.DB
		tables nodemanager.Tables
		peers  statedb.Table[*nodemanager.Peer]
	)
	h := hive.New(
		cell.Invoke(func(lifecycle.InvokedAll) {}),
		statedb.Cell,
		cell.Module("nodes-test", "The nodes table under test",
			cell.ProvidePrivate(nodemanager.NewTables),
			cell.Provide(func(t nodemanager.Tables) statedb.Table[*nodemanager.Peer] { return t.Nodes }),
			cell.Invoke(func(d *statedb.DB, t nodemanager.Tables) { db, tables = d, t }),
		),
		// The consumer takes the table by type, as the cell does.
		cell.Invoke(func(p statedb.Table[*nodemanager.Peer]) { peers = p }),
	)
	log := hivetest.Logger(t)
	if err := h.Start(log, context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := h.Stop(log, context.Background()); err != nil {
			t.Error(err)
		}
	})
	ctx, cancel := context.WithCancel(context.Background())
	applied := make(chan string)
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		followPeerCIDRs(ctx, db, peers, func(cidrs []netip.Prefix) {
			select {
			case applied <- fmt.Sprint(cidrs):
			case <-ctx.Done():
			}
		})
	}()
	t.Cleanup(func() { cancel(); <-stopped })

	if got := <-applied; got != "[]" {
		t.Fatalf("first pass %s, want []", got)
	}
	write := func(f func(statedb.WriteTxn) error) {
		t.Helper()
		wtxn := db.WriteTxn(tables.Nodes)
		if err := f(wtxn); err != nil {
			wtxn.Abort()
			t.Fatal(err)
		}
		wtxn.Commit()
	}
	b := &nodemanager.Peer{Name: "node-b", PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.2.0/24")}}
	write(func(w statedb.WriteTxn) error { _, _, err := tables.Nodes.Insert(w, b); return err })
	if got, want := <-applied, "[10.0.2.0/24]"; got != want {
		t.Fatalf("after node-b joined %s, want %s", got, want)
	}
	c := &nodemanager.Peer{Name: "node-c", PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.1.0/24"), netip.MustParsePrefix("fd00:0:1::/64")}}
	write(func(w statedb.WriteTxn) error { _, _, err := tables.Nodes.Insert(w, c); return err })
	if got, want := <-applied, "[10.0.1.0/24 10.0.2.0/24 fd00:0:1::/64]"; got != want {
		t.Fatalf("after node-c joined %s, want %s", got, want)
	}
	write(func(w statedb.WriteTxn) error { _, _, err := tables.Nodes.Delete(w, b); return err })
	if got, want := <-applied, "[10.0.1.0/24 fd00:0:1::/64]"; got != want {
		t.Fatalf("after node-b left %s, want %s", got, want)
	}
}
