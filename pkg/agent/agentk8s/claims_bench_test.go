package agentk8s

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"runtime"
	"runtime/pprof"
	"testing"
	"time"

	"github.com/cilium/statedb"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tendril-net/tendril/pkg/ipcache"
	"github.com/tendril-net/tendril/pkg/ipcache/ipcachetest"
	"github.com/tendril-net/tendril/pkg/k8s"
	v1alpha1 "github.com/tendril-net/tendril/pkg/k8s/apis/tendril.io/v1alpha1"
	"github.com/tendril-net/tendril/pkg/k8s/watchers"
	"github.com/tendril-net/tendril/pkg/nodemanager"
	"github.com/tendril-net/tendril/pkg/testutil"
)

// BenchmarkRemoteClaimMemory: the live heap of the claim path at bench/scale's
// 1,000-node point: 50,000 other nodes' TendrilEndpoints (50 a node, one
// address each) through the handler, the claim gate (judged against 1,000
// peers' pod CIDRs) and the ipcache's table with its reconciler done, as
// the agent wires them (the gate's accepted claims queued into the
// ipcache). The cached objects exist before the first reading: what is
// measured is what the claim path holds beside the informer's cache.
// Run it with -benchtime 1x (and -count for repeats): in one process a
// second iteration starts while the first one's tables are still being
// released, and reads less.
func BenchmarkRemoteClaimMemory(b *testing.B) {
	const nodes, perNode = 1000, 50
	objs := make([]watchers.Event[*k8s.CachedEndpoint], 0, nodes*perNode)
	for n := range nodes {
		nodeIP := fmt.Sprintf("172.18.%d.%d", n/256, n%256)
		for p := range perNode {
			tep := &v1alpha1.TendrilEndpoint{
				ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("app-%d-7d9f8c6b5-%05d", n%200, n*perNode+p), Namespace: fmt.Sprintf("ns-%d", n%50)},
				Status: v1alpha1.EndpointStatus{ID: int64(p + 1), State: "ready",
					Identity: &v1alpha1.EndpointIdentity{ID: int64(20000 + (n*perNode+p)%1000)},
					Networking: &v1alpha1.EndpointNetworking{NodeIP: nodeIP,
						Addressing: []v1alpha1.AddressPair{{IPv4: fmt.Sprintf("10.%d.%d.%d", 65+n/256, n%256, p+2)}}}},
			}
			o := k8s.NewCachedEndpoint(tep)
			objs = append(objs, watchers.Event[*k8s.CachedEndpoint]{Kind: watchers.Upsert, Key: o.Namespace + "/" + o.Name, Object: o})
		}
	}
	notLocal := func(netip.Addr) bool { return false }
	for range b.N {
		db := statedb.New()
		tables, err := nodemanager.NewTables(db)
		if err != nil {
			b.Fatal(err)
		}
		wtxn := db.WriteTxn(tables.Nodes)
		for n := range nodes {
			ip := netip.AddrFrom4([4]byte{172, 18, byte(n / 256), byte(n % 256)})
			if _, _, err := tables.Nodes.Insert(wtxn, &nodemanager.Peer{Name: fmt.Sprintf("node-%d", n), IPs: []netip.Addr{ip}, NodeIPs: []netip.Addr{ip},
				PodCIDRs: []netip.Prefix{netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(65 + n/256), byte(n % 256), 0}), 24)}}); err != nil {
				b.Fatal(err)
			}
		}
		wtxn.Commit()
		cache, stop := ipcachetest.Run(b, nopBackend{})
		gate := nodemanager.NewClaimGate(nodemanager.ClaimGateParams{DB: db, Nodes: tables.Nodes, Cache: queuedCache{cache}, Log: quietLog()})
		ctx, cancel := context.WithCancel(context.Background())
		runDone := make(chan struct{})
		go func() { _ = gate.Run(ctx); close(runDone) }()
		ready := make(chan struct{})
		gate.Synced(func() { close(ready) })
		<-ready

		start := testutil.HeapAfterGC()
		k := &Module{gate: gate}
		for _, ev := range objs {
			k.claimRemote(ev, "172.30.0.1", notLocal)
		}
		ipcachetest.Synced(b, cache)
		if got := len(cache.List()); got != len(objs) {
			b.Fatalf("ipcache holds %d prefixes, want %d", got, len(objs))
		}
		// The reconciler's last status writes settle.
		time.Sleep(100 * time.Millisecond)
		b.ReportMetric(float64(testutil.HeapAfterGC()-start)/(1<<20), "heap-MiB")
		if path := os.Getenv("TENDRIL_CLAIM_HEAP_PROFILE"); path != "" {
			// What holds it (go tool pprof -sample_index=inuse_space);
			// exact with -test.memprofilerate=1.
			writeHeapProfile(b, path)
		}
		runtime.KeepAlive(k)
		runtime.KeepAlive(gate)
		cancel()
		<-runDone
		stop()
	}
	runtime.KeepAlive(objs)
}

// queuedCache is the ipcache as the agent's datapath gives it to the gate
// (agentdatapath.UpsertRemoteEndpoint): single-address prefixes, queued.
type queuedCache struct{ c *ipcache.IPCache }

func (q queuedCache) UpsertRemoteEndpoint(ip netip.Addr, e ipcache.Entry) error {
	return q.c.UpsertQueued(netip.PrefixFrom(ip, ip.BitLen()), e)
}

func (q queuedCache) DeleteRemoteEndpoint(ip netip.Addr, src ipcache.Source, owner ipcache.Owner) error {
	q.c.DeleteQueued(netip.PrefixFrom(ip, ip.BitLen()), src, owner)
	return nil
}

// nopBackend is a BPF map that holds nothing: the benchmark measures the
// table, not the map.
type nopBackend struct{}

func (nopBackend) Upsert(netip.Prefix, ipcache.Entry) error { return nil }
func (nopBackend) Delete(netip.Prefix) error                { return nil }
func (nopBackend) Prefixes() ([]netip.Prefix, error)        { return nil, nil }

func writeHeapProfile(b *testing.B, path string) {
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	if err := pprof.WriteHeapProfile(f); err != nil {
		b.Fatal(err)
	}
}

func quietLog() *slog.Logger { return slog.New(slog.DiscardHandler) }
