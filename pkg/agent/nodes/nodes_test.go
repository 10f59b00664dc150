package nodes

import (
	"context"
	"net/netip"
	"testing"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"

	"github.com/tendril-net/tendril/pkg/agent/agentendpoints"
	"github.com/tendril-net/tendril/pkg/agent/agentk8s"
	"github.com/tendril-net/tendril/pkg/dbinspect"
	"github.com/tendril-net/tendril/pkg/health"
	"github.com/tendril-net/tendril/pkg/lifecycle"
	"github.com/tendril-net/tendril/pkg/nodemanager"
	"github.com/tendril-net/tendril/pkg/option"
)

// claims is an ipcache that reports each remote-node claim on a channel.
type claims chan string

func (c claims) UpsertRemoteNode(node string, ip netip.Addr) error {
	c <- node + "=" + ip.String()
	return nil
}

func (c claims) UpsertRemoteHealth(node string, ip, _ netip.Addr) error {
	c <- node + "=" + ip.String() + "(health)"
	return nil
}

func (c claims) DeleteRemoteNode(string, netip.Addr) error { return nil }

// world is what the cell takes from the rest of the agent: the
// Kubernetes client (nil: standalone) and the node manager's other
// dependencies, routes off (no netlink handle).
func world(client *agentk8s.Client, cache IPCache) cell.Cell {
	return cell.Group(
		statedb.Cell,
		job.Cell,
		cell.Provide(
			func() *agentk8s.Client { return client },
			agentk8s.DefaultConfig,
			func() option.LocalNode { return option.LocalNode{Name: "node-a"} },
			func() agentendpoints.Config { return agentendpoints.Config{} },
			func() *agentendpoints.Module { return nil },
			func() IPCache { return cache },
			health.NewRegistry,
			dbinspect.New,
		),
	)
}

// start builds and starts the hive, stopped when the test ends.
func start(t *testing.T, cells ...cell.Cell) {
	t.Helper()
	h := hive.New(append([]cell.Cell{cell.Invoke(func(lifecycle.InvokedAll) {})}, cells...)...)
	log := hivetest.Logger(t)
	if err := h.Start(log, context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := h.Stop(log, context.Background()); err != nil {
			t.Error(err)
		}
	})
}

// TestStandalone: without Kubernetes the tables are still provided, by
// type, empty and initialized (a reader needs no case for their absence);
// Sources says nothing fills them and there is no writer.
func TestStandalone(t *testing.T) {
	var (
		db     *statedb.DB
		peers  statedb.Table[*nodemanager.Peer]
		routes statedb.Table[*nodemanager.Route]
		src    Sources
		m      *nodemanager.Manager
	)
	start(t, world(nil, nil), Cell, cell.Invoke(func(d *statedb.DB, p statedb.Table[*nodemanager.Peer],
		r statedb.Table[*nodemanager.Route], s Sources, mgr *nodemanager.Manager) {
		db, peers, routes, src, m = d, p, r, s, mgr
	}))
	if peers == nil || routes == nil {
		t.Fatal("the nodes and routes tables are not provided")
	}
	if peers.Name() != nodemanager.NodesTableName || routes.Name() != nodemanager.RoutesTableName {
		t.Fatalf("tables %q and %q, want %q and %q", peers.Name(), routes.Name(), nodemanager.NodesTableName, nodemanager.RoutesTableName)
	}
	if !src.None() {
		t.Fatalf("sources %+v without a Kubernetes client, want none", src)
	}
	if m != nil {
		t.Fatal("a node manager without a source of nodes")
	}
	txn := db.ReadTxn()
	if init, _ := peers.Initialized(txn); !init {
		t.Fatalf("nodes table not initialized without a source; pending %v", peers.PendingInitializers(txn))
	}
	if n := peers.NumObjects(txn) + routes.NumObjects(txn); n != 0 {
		t.Fatalf("%d objects in the tables of a standalone agent", n)
	}
}

// TestManagerWritesWhatReadersSee: with Kubernetes the node manager
// writes the tables; a reader that took the table by type wakes on the
// peer's insertion (its watch channel, no polling), and the nodes
// reconciler claims the peer's address in the ipcache.
func TestManagerWritesWhatReadersSee(t *testing.T) {
	cache := make(claims, 8)
	var (
		db    *statedb.DB
		peers statedb.Table[*nodemanager.Peer]
		src   Sources
		m     *nodemanager.Manager
		done  func()
	)
	start(t, world(&agentk8s.Client{}, cache), Cell, cell.Invoke(func(d *statedb.DB, p statedb.Table[*nodemanager.Peer],
		s Sources, mgr *nodemanager.Manager) {
		db, peers, src, m = d, p, s, mgr
		if mgr != nil {
			done = mgr.AddInitializer("test-source")
		}
	}))
	if m == nil {
		t.Fatal("no node manager with a Kubernetes client")
	}
	if src.None() || !src.Kubernetes {
		t.Fatalf("sources %+v with a Kubernetes client, want Kubernetes", src)
	}
	txn := db.ReadTxn()
	init, initWatch := peers.Initialized(txn)
	if init {
		t.Fatal("nodes table initialized before its source's listing")
	}
	_, watch := peers.AllWatch(txn)

	ip := netip.MustParseAddr("172.31.0.2")
	if err := m.UpsertPeer(nodemanager.Peer{Name: "node-b", IPs: []netip.Addr{ip},
		PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.2.0/24")}}); err != nil {
		t.Fatal(err)
	}
	<-watch
	p, _, found := peers.Get(db.ReadTxn(), nodemanager.PeerNameIndex.Query("node-b"))
	if !found || len(p.PodCIDRs) != 1 || p.PodCIDRs[0].String() != "10.0.2.0/24" {
		t.Fatalf("reader sees %+v (found %v), want node-b with 10.0.2.0/24", p, found)
	}
	if got, want := <-cache, "node-b="+ip.String(); got != want {
		t.Fatalf("ipcache claim %q, want %q", got, want)
	}
	done()
	<-initWatch
}
