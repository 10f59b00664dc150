package nodemanager

import (
	"context"
	"fmt"
	"net/netip"
	"sort"
	"sync"
	"testing"

	"github.com/tendril-net/tendril/pkg/identity"
	"github.com/tendril-net/tendril/pkg/ipcache"
)

func TestCheckIdentity(t *testing.T) {
	for _, tt := range []struct {
		id int64
		ok bool
	}{
		{0, false}, {int64(identity.Host), false}, {int64(identity.World), false}, {int64(identity.RemoteNode), false},
		{int64(identity.KubeAPIServer), false}, {255, false}, {256, true}, {4321, true}, {65535, true}, {65536, false},
		{int64(identity.LocalScope) | 5, false}, {int64(identity.LocalScope | identity.InClusterCIDR | 7), false},
		// 2^32 + 300 would be 300 truncated to 32 bits: refused, not narrowed.
		{1<<32 + 300, false}, {1<<32 + int64(identity.Host), false}, {-1, false}, {-(1 << 32) + 300, false},
	} {
		got, err := CheckIdentity(tt.id)
		if (err == nil) != tt.ok {
			t.Errorf("CheckIdentity(%d) = %d, %v; want ok=%v", tt.id, got, err, tt.ok)
		}
		if err == nil && int64(got) != tt.id {
			t.Errorf("CheckIdentity(%d) = %d: changed", tt.id, got)
		}
	}
}

// remoteCache records the remote claims as ip=identity@owner.
type remoteCache struct {
	mu     sync.Mutex
	claims map[string]string
}

func (c *remoteCache) UpsertRemoteEndpoint(ip netip.Addr, e ipcache.Entry) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.claims[ip.String()+"@"+string(e.Owner)] = fmt.Sprint(uint32(e.Identity))
	return nil
}

func (c *remoteCache) DeleteRemoteEndpoint(ip netip.Addr, _ ipcache.Source, owner ipcache.Owner) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.claims, ip.String()+"@"+string(owner))
	return nil
}

func (c *remoteCache) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for k, v := range c.claims {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return fmt.Sprint(out)
}

func claim(ip string, id int64, node, nodeIP, owner string) Claim {
	c := Claim{IP: netip.MustParseAddr(ip), Identity: id, Node: node,
		Entry: ipcache.Entry{Source: ipcache.SourceKVStore, Owner: ipcache.Owner(owner)}}
	if nodeIP != "" {
		c.NodeIP = netip.MustParseAddr(nodeIP)
	}
	return c
}

func TestClaimGate(t *testing.T) {
	m, dones := startManager(t, nil, nil, "nodes")
	cache := &remoteCache{claims: map[string]string{}}
	var mu sync.Mutex
	reasons := map[string]int{}
	g := NewClaimGate(ClaimGateParams{DB: m.db, Nodes: m.nodes, Cache: cache, Log: quiet(), OnRejected: func(r string) {
		mu.Lock()
		reasons[r]++
		mu.Unlock()
	}})
	ctx, cancel := context.WithCancel(context.Background())
	runDone := make(chan struct{})
	go func() { _ = g.Run(ctx); close(runDone) }()
	t.Cleanup(func() { cancel(); <-runDone })
	synced := make(chan struct{})
	g.Synced(func() { close(synced) })

	mustUpsert(t, m, "b", []string{"172.31.9.2"}, "10.9.2.0/24")
	// Before the nodes' listing is in, nothing is judged on its node.
	g.Upsert(claim("10.9.2.10", 4321, "b", "", "k/good"))
	g.Upsert(claim("10.9.2.11", int64(identity.Host), "b", "", "k/reserved"))
	if got := cache.String(); got != "[]" {
		t.Fatalf("claims in the ipcache before the nodes synced: %s", got)
	}
	select {
	case <-synced:
		t.Fatal("Synced done before the nodes synced")
	default:
	}
	dones[0]()
	<-synced
	eventually(t, func() (bool, string) {
		got, want := cache.String(), "[10.9.2.10@k/good=4321]"
		return got == want, fmt.Sprintf("ipcache %s, want %s", got, want)
	})

	// Forged: another node's CIDR, a node's own address, an unknown
	// node, a host IP that is not the node's, truncation bait.
	mustUpsert(t, m, "c", []string{"172.31.9.3"}, "10.9.3.0/24")
	// The claims come after the gate has seen c (else they are refused
	// as of an unknown node first, then accepted: counted twice).
	eventually(t, func() (bool, string) {
		g.mu.Lock()
		defer g.mu.Unlock()
		return g.view.byName["c"] != nil, "the gate has not seen node c"
	})
	g.Upsert(claim("10.9.3.10", 4321, "b", "", "k/other-cidr"))
	g.Upsert(claim("172.31.9.3", 4321, "b", "", "k/node-ip"))
	g.Upsert(claim("10.9.5.10", 4321, "e", "", "k/unknown"))
	g.Upsert(claim("10.9.2.12", 1<<32+300, "b", "", "k/truncated"))
	hostIP := claim("10.9.2.13", 4321, "b", "", "k/host-ip")
	hostIP.Entry.HostIP = netip.MustParseAddr("172.31.9.3")
	g.Upsert(hostIP)
	// TendrilEndpoint style: the node by its address or its router IP.
	g.Upsert(claim("10.9.3.20", 5000, "", "172.31.9.3", "tep/by-node-ip"))
	g.Upsert(claim("10.9.3.21", 5000, "", "10.9.3.1", "tep/by-router-ip"))
	g.Upsert(claim("10.9.2.22", 5000, "", "10.9.3.1", "tep/wrong-node"))
	eventually(t, func() (bool, string) {
		got, want := cache.String(), "[10.9.2.10@k/good=4321 10.9.3.20@tep/by-node-ip=5000 10.9.3.21@tep/by-router-ip=5000]"
		return got == want, fmt.Sprintf("ipcache %s, want %s", got, want)
	})
	mu.Lock()
	want := map[string]int{ClaimReasonIdentity: 2, ClaimReasonOutside: 2, ClaimReasonNodeAddress: 1, ClaimReasonUnknownNode: 1, ClaimReasonHostIP: 1}
	if fmt.Sprint(reasons) != fmt.Sprint(want) {
		t.Errorf("rejections %v, want %v", reasons, want)
	}
	mu.Unlock()

	// The unknown node joins: its claim is accepted. b loses its CIDR:
	// its claims leave the ipcache. A deleted claim goes.
	mustUpsert(t, m, "e", []string{"172.31.9.5"}, "10.9.5.0/24")
	mustUpsert(t, m, "b", []string{"172.31.9.2"})
	g.Delete(netip.MustParseAddr("10.9.3.20"), ipcache.SourceKVStore, "tep/by-node-ip")
	eventually(t, func() (bool, string) {
		got, want := cache.String(), "[10.9.3.21@tep/by-router-ip=5000 10.9.5.10@k/unknown=4321]"
		return got == want, fmt.Sprintf("ipcache %s, want %s", got, want)
	})

	// A newer node claims an address inside c's pod CIDR as its own: c
	// keeps the CIDR, and the address is no node's. The pod c has there
	// is not refused as "a node's address" (before, any node could cut
	// any pod off so), nor is the address that node's host IP.
	mustUpsert(t, m, "x", []string{"10.9.3.30"}, "10.9.8.0/24")
	eventually(t, func() (bool, string) {
		g.mu.Lock()
		defer g.mu.Unlock()
		return g.view.byName["x"] != nil, "the gate has not seen node x"
	})
	g.Upsert(claim("10.9.3.30", 5001, "c", "", "k/pod-at-claimed"))
	xHost := claim("10.9.8.10", 5002, "x", "", "k/x-host")
	xHost.Entry.HostIP = netip.MustParseAddr("10.9.3.30")
	g.Upsert(xHost)
	eventually(t, func() (bool, string) {
		got, want := cache.String(), "[10.9.3.21@tep/by-router-ip=5000 10.9.3.30@k/pod-at-claimed=5001 10.9.5.10@k/unknown=4321]"
		return got == want, fmt.Sprintf("ipcache %s, want %s", got, want)
	})
	mu.Lock()
	defer mu.Unlock()
	if reasons[ClaimReasonHostIP] != 2 || reasons[ClaimReasonNodeAddress] != 1 {
		t.Errorf("rejections %v: want x's host IP refused, the pod's claim not", reasons)
	}
}

// TestClaimWithoutNodesTable: with no nodes table (kvstore without
// Kubernetes) a claim is judged on its identity alone: a cluster identity
// passes, a reserved one does not.
func TestClaimWithoutNodesTable(t *testing.T) {
	cache := &remoteCache{claims: map[string]string{}}
	var reasons []string
	g := NewClaimGate(ClaimGateParams{NoNodes: true, Cache: cache, Log: quiet(), OnRejected: func(r string) { reasons = append(reasons, r) }})
	g.setView(&nodeView{none: true}, true)
	g.Upsert(claim("10.9.2.10", 4321, "b", "", "k/good"))
	g.Upsert(claim("10.9.2.11", int64(identity.Host), "b", "", "k/reserved"))
	if got, want := cache.String(), "[10.9.2.10@k/good=4321]"; got != want {
		t.Fatalf("ipcache %s, want %s", got, want)
	}
	if fmt.Sprint(reasons) != "["+ClaimReasonIdentity+"]" {
		t.Fatalf("rejections %v, want the reserved identity's", reasons)
	}
}

// TestClaimGateNoNodeSource: the gate tells "nothing fills the nodes
// table" (NoNodes: kvstore without Kubernetes; claims judged on their
// identity alone) from an empty nodes table (no node known: refused),
// both with the table present.
func TestClaimGateNoNodeSource(t *testing.T) {
	for _, tt := range []struct {
		name    string
		noNodes bool
		want    string
		reasons []string
	}{
		{"no source", true, "[10.9.2.10@k/good=4321]", []string{ClaimReasonIdentity}},
		{"empty table", false, "[]", []string{ClaimReasonUnknownNode, ClaimReasonIdentity}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			m, _ := startManager(t, nil, nil)
			cache := &remoteCache{claims: map[string]string{}}
			reasons := make(chan string, 4)
			g := NewClaimGate(ClaimGateParams{DB: m.db, Nodes: m.nodes, NoNodes: tt.noNodes, Cache: cache, Log: quiet(),
				OnRejected: func(r string) { reasons <- r }})
			ctx, cancel := context.WithCancel(context.Background())
			runDone := make(chan struct{})
			go func() { _ = g.Run(ctx); close(runDone) }()
			t.Cleanup(func() { cancel(); <-runDone })
			synced := make(chan struct{})
			g.Synced(func() { close(synced) })
			<-synced
			g.Upsert(claim("10.9.2.10", 4321, "b", "", "k/good"))
			g.Upsert(claim("10.9.2.11", int64(identity.Host), "b", "", "k/reserved"))
			if got := cache.String(); got != tt.want {
				t.Fatalf("ipcache %s, want %s", got, tt.want)
			}
			close(reasons)
			var got []string
			for r := range reasons {
				got = append(got, r)
			}
			if fmt.Sprint(got) != fmt.Sprint(tt.reasons) {
				t.Fatalf("rejections %v, want %v", got, tt.reasons)
			}
		})
	}
}

// TestClaimGateOwnerClaims: the gate holds an owner's claims (a
// dual-stack pod's two addresses) as one list: Retain withdraws those the
// object no longer lists and keeps the rest, Delete takes one address
// and leaves the owner's others, and a claim refused for its identity
// withdraws what its owner claimed on the address before. Every step is
// judged against the node's pod CIDRs as a single claim is.
func TestClaimGateOwnerClaims(t *testing.T) {
	m, _ := startManager(t, nil, nil)
	mustUpsert(t, m, "b", []string{"172.31.9.2"}, "10.9.2.0/24", "fd00:9:2::/64")
	cache := &remoteCache{claims: map[string]string{}}
	var mu sync.Mutex
	var reasons []string
	g := NewClaimGate(ClaimGateParams{DB: m.db, Nodes: m.nodes, Cache: cache, Log: quiet(), OnRejected: func(r string) {
		mu.Lock()
		reasons = append(reasons, r)
		mu.Unlock()
	}})
	ctx, cancel := context.WithCancel(context.Background())
	runDone := make(chan struct{})
	go func() { _ = g.Run(ctx); close(runDone) }()
	t.Cleanup(func() { cancel(); <-runDone })
	synced := make(chan struct{})
	g.Synced(func() { close(synced) })
	<-synced
	eventually(t, func() (bool, string) {
		g.mu.Lock()
		defer g.mu.Unlock()
		return g.view.byName["b"] != nil, "the gate has not seen node b"
	})
	for _, ip := range []string{"10.9.2.10", "fd00:9:2::10", "10.9.3.10"} {
		g.Upsert(claim(ip, 4321, "", "172.31.9.2", "tep/x/pod"))
	}
	want := "[10.9.2.10@tep/x/pod=4321 fd00:9:2::10@tep/x/pod=4321]"
	if got := cache.String(); got != want {
		t.Fatalf("ipcache %s, want %s (the address outside b's CIDRs refused)", got, want)
	}
	// The object now lists its IPv4 address only (and the refused one).
	v4, out := netip.MustParseAddr("10.9.2.10"), netip.MustParseAddr("10.9.3.10")
	g.Retain(ipcache.SourceKVStore, "tep/x/pod", func(ip netip.Addr) bool { return ip == v4 || ip == out })
	if got, want := cache.String(), "[10.9.2.10@tep/x/pod=4321]"; got != want {
		t.Fatalf("after Retain: ipcache %s, want %s", got, want)
	}
	// Another owner's claim stays when this one's go.
	g.Upsert(claim("10.9.2.11", 4321, "", "172.31.9.2", "tep/x/other"))
	g.Delete(out, ipcache.SourceKVStore, "tep/x/pod")
	if got, want := cache.String(), "[10.9.2.10@tep/x/pod=4321 10.9.2.11@tep/x/other=4321]"; got != want {
		t.Fatalf("after Delete of the refused address: ipcache %s, want %s", got, want)
	}
	// The owner's claim changed to an identity another node may not
	// claim: refused, and the claim it made before is withdrawn.
	g.Upsert(claim("10.9.2.12", 4321, "", "172.31.9.2", "tep/x/pod"))
	g.Upsert(claim("10.9.2.12", 1<<32+300, "", "172.31.9.2", "tep/x/pod"))
	if got, want := cache.String(), "[10.9.2.10@tep/x/pod=4321 10.9.2.11@tep/x/other=4321]"; got != want {
		t.Fatalf("after a truncation-bait identity: ipcache %s, want %s", got, want)
	}
	g.Retain(ipcache.SourceKVStore, "tep/x/pod", func(netip.Addr) bool { return false })
	if got, want := cache.String(), "[10.9.2.11@tep/x/other=4321]"; got != want {
		t.Fatalf("after the object went: ipcache %s, want %s", got, want)
	}
	g.mu.Lock()
	held := len(g.claims)
	g.mu.Unlock()
	if held != 1 {
		t.Fatalf("the gate holds %d owners, want 1", held)
	}
	mu.Lock()
	defer mu.Unlock()
	if fmt.Sprint(reasons) != fmt.Sprint([]string{ClaimReasonOutside, ClaimReasonIdentity}) {
		t.Fatalf("rejections %v", reasons)
	}
}
