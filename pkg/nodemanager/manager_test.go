package nodemanager

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"os/exec"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/statedb/reconciler"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/tendril-net/tendril/pkg/k8s/apis/tendril.io/v1alpha1"
	"github.com/tendril-net/tendril/pkg/reconcile/reconciletest"
	"github.com/tendril-net/tendril/pkg/testutil"
)

// fakeCache records each node's claims on addresses.
type fakeCache struct {
	mu   sync.Mutex
	ips  map[string]bool // node=ip
	fail bool
}

func newFakeCache() *fakeCache { return &fakeCache{ips: map[string]bool{}} }

func (f *fakeCache) UpsertRemoteNode(node string, ip netip.Addr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail {
		return errors.New("map full")
	}
	f.ips[node+"="+ip.String()] = true
	return nil
}

func (f *fakeCache) UpsertRemoteHealth(node string, ip, host netip.Addr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail {
		return errors.New("map full")
	}
	f.ips[node+"="+ip.String()+"(health via "+host.String()+")"] = true
	return nil
}

func (f *fakeCache) DeleteRemoteNode(node string, ip netip.Addr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.ips, node+"="+ip.String())
	for c := range f.ips {
		if strings.HasPrefix(c, node+"="+ip.String()+"(health") {
			delete(f.ips, c)
		}
	}
	return nil
}

func (f *fakeCache) setFail(v bool) {
	f.mu.Lock()
	f.fail = v
	f.mu.Unlock()
}

// claims is every node's claim as node=ip.
func (f *fakeCache) claims() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for c := range f.ips {
		out = append(out, c)
	}
	sort.Strings(out)
	return fmt.Sprint(out)
}

// fakeRoutes is a routing table that fails on demand.
type fakeRoutes struct {
	mu     sync.Mutex
	routes map[netip.Prefix]netip.Addr
	fail   error
}

func (f *fakeRoutes) Replace(dst netip.Prefix, via netip.Addr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail != nil {
		return f.fail
	}
	f.routes[dst] = via
	return nil
}

func (f *fakeRoutes) Delete(dst netip.Prefix) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail != nil {
		return f.fail
	}
	delete(f.routes, dst)
	return nil
}

func (f *fakeRoutes) List() (map[netip.Prefix]netip.Addr, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return maps.Clone(f.routes), nil
}

func (f *fakeRoutes) setFail(err error) {
	f.mu.Lock()
	f.fail = err
	f.mu.Unlock()
}

func (f *fakeRoutes) String() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return formatRoutes(f.routes)
}

func formatRoutes(rs map[netip.Prefix]netip.Addr) string {
	var out []string
	for dst, via := range rs {
		out = append(out, dst.String()+" via "+via.String())
	}
	sort.Strings(out)
	return fmt.Sprint(out)
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// startManager runs a Manager (statedb, jobs, both reconcilers with a
// short backoff) in a hive of its own, stopped when the test ends.
// initializers are registered before the start, as the agent does.
func startManager(t testing.TB, routes RouteBackend, cache IPCache, initializers ...string) (*Manager, []func()) {
	t.Helper()
	var m *Manager
	var dones []func()
	reconciletest.Start(t, "nodemanager-test", func(d reconciletest.Deps) error {
		var err error
		m, err = New(Params{LocalNode: "a", DB: d.DB, Jobs: d.Jobs, Log: d.Log, ModuleID: d.ModuleID,
			Routes: routes, IPCache: cache,
			Options: []reconciler.Option{reconciler.WithRetry(10*time.Millisecond, 50*time.Millisecond)}})
		if err != nil {
			return err
		}
		for _, name := range initializers {
			dones = append(dones, m.AddInitializer(name))
		}
		return nil
	})
	return m, dones
}

// eventually waits up to 10 s for cond, failing with what it last said.
func eventually(t *testing.T, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ok, msg := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal(msg)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// peerStatus is a peer's reconciliation status as the dump prints it.
func peerStatus(m *Manager, name string) string {
	p, _, ok := m.nodes.Get(m.db.ReadTxn(), PeerNameIndex.Query(name))
	if !ok {
		return "absent"
	}
	return p.Status.String()
}

func routeStatus(m *Manager, dst string) string {
	r, _, ok := m.routes.Get(m.db.ReadTxn(), RoutePrefixIndex.Query(netip.MustParsePrefix(dst)))
	if !ok {
		return "absent"
	}
	return r.Status.String()
}

func mustUpsert(t *testing.T, m *Manager, name string, ips []string, cidrs ...string) {
	t.Helper()
	p := Peer{Name: name}
	for _, ip := range ips {
		p.IPs = append(p.IPs, netip.MustParseAddr(ip))
	}
	for _, c := range cidrs {
		p.PodCIDRs = append(p.PodCIDRs, netip.MustParsePrefix(c))
	}
	if err := m.UpsertPeer(p); err != nil {
		t.Fatal(err)
	}
}

func TestPeerFromNodeAndTendrilNode(t *testing.T) {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "b"},
		Spec: corev1.NodeSpec{PodCIDRs: []string{"10.244.1.0/24"}},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{
			{Type: corev1.NodeHostName, Address: "b"}, {Type: corev1.NodeExternalIP, Address: "198.51.100.2"},
			{Type: corev1.NodeInternalIP, Address: "172.30.0.12"}}}}
	p := PeerFromNode(n)
	if fmt.Sprint(p.IPs) != "[172.30.0.12 198.51.100.2]" || fmt.Sprint(p.PodCIDRs) != "[10.244.1.0/24]" {
		t.Fatalf("peer %+v", p)
	}
	tn := &v1alpha1.TendrilNode{Spec: v1alpha1.NodeSpec{IPAM: v1alpha1.IPAMSpec{PodCIDRs: []string{"10.244.1.0/24", "fd00:b::/112"}}}}
	p = MergeTendrilNode(p, tn)
	if fmt.Sprint(p.PodCIDRs) != "[10.244.1.0/24 fd00:b::/112]" {
		t.Fatalf("merged %+v", p)
	}
	// Without node addresses the TendrilNode's (not the router IP) serve.
	p = MergeTendrilNode(Peer{Name: "c"}, &v1alpha1.TendrilNode{Spec: v1alpha1.NodeSpec{Addresses: []v1alpha1.NodeAddress{
		{Type: "TendrilInternalIP", IP: "10.244.2.1"}, {Type: "InternalIP", IP: "172.30.0.13"}}}})
	if fmt.Sprint(p.IPs) != "[172.30.0.13]" {
		t.Fatalf("addresses from TendrilNode %+v", p)
	}
}

// TestHealthEndpointIPs: a TendrilNode's TendrilHealthIP addresses are
// read apart from the node's own (never a node address, even without
// others), and a reader takes only those inside the node's accepted pod
// CIDRs, not the CIDR's network address, one per family: a node cannot
// make every agent probe an address outside its pods' range.
func TestHealthEndpointIPs(t *testing.T) {
	tn := &v1alpha1.TendrilNode{Spec: v1alpha1.NodeSpec{
		IPAM: v1alpha1.IPAMSpec{PodCIDRs: []string{"10.244.1.0/24", "fd00:b::/112"}},
		Addresses: []v1alpha1.NodeAddress{
			{Type: "InternalIP", IP: "172.30.0.12"},
			{Type: v1alpha1.NodeAddressHealthIP, IP: "172.30.0.13"}, // another node's address
			{Type: v1alpha1.NodeAddressHealthIP, IP: "10.244.1.0"},  // the network address
			{Type: v1alpha1.NodeAddressHealthIP, IP: "10.244.1.9"},
			{Type: v1alpha1.NodeAddressHealthIP, IP: "10.244.1.10"}, // a second IPv4
			{Type: v1alpha1.NodeAddressHealthIP, IP: "not-an-ip"},
			{Type: v1alpha1.NodeAddressHealthIP, IP: "fd00:b::5"},
		}}}
	p := MergeTendrilNode(Peer{Name: "b"}, tn)
	if fmt.Sprint(p.IPs) != "[172.30.0.12]" {
		t.Fatalf("node addresses %v: a health address became one", p.IPs)
	}
	if got := fmt.Sprint(p.HealthEndpointIPs()); got != "[10.244.1.9 fd00:b::5]" {
		t.Fatalf("accepted health addresses %s, want [10.244.1.9 fd00:b::5]", got)
	}
	// Only the accepted pod CIDRs count: with the IPv6 one refused, its
	// health address goes too.
	p.PodCIDRs = p.PodCIDRs[:1]
	if got := fmt.Sprint(p.HealthEndpointIPs()); got != "[10.244.1.9]" {
		t.Fatalf("accepted health addresses %s with the IPv6 pod CIDR refused", got)
	}
	p.PodCIDRs = nil
	if got := p.HealthEndpointIPs(); len(got) != 0 {
		t.Fatalf("health addresses %v without an accepted pod CIDR", got)
	}
}

// TestPrivilegedRoutesToPeers runs the manager in a network namespace of
// its own with a link on a 172.31.9.0/24 "node network": routes to peers'
// pod CIDRs appear via their addresses, follow changes, disappear with the
// peer, and a stale route (a peer deleted while the agent was down) goes
// only once the sources have synced. Failed ipcache writes are retried
// without any other event.
func TestPrivilegedRoutesToPeers(t *testing.T) {
	testutil.Privileged(t)
	name := "tdr-nm-test"
	nl := routeTestNetns(t, name)
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "lab0"}, PeerName: "lab0p"}
	if err := nl.LinkAdd(veth); err != nil {
		t.Fatal(err)
	}
	for _, l := range []string{"lab0", "lab0p", "lo"} {
		link, err := nl.LinkByName(l)
		if err != nil {
			t.Fatal(err)
		}
		if err := nl.LinkSetUp(link); err != nil {
			t.Fatal(err)
		}
	}
	link, _ := nl.LinkByName("lab0")
	addr, _ := netlink.ParseAddr("172.31.9.1/24")
	if err := nl.AddrAdd(link, addr); err != nil {
		t.Fatal(err)
	}
	// A stale route of a peer that is gone.
	stale := &netlink.Route{Dst: prefixNet(netip.MustParsePrefix("10.9.99.0/24")), Gw: net.ParseIP("172.31.9.99"),
		Protocol: RouteProtocol, Table: unix.RT_TABLE_MAIN}
	if err := nl.RouteAdd(stale); err != nil {
		t.Fatal(err)
	}

	backend := NetlinkRoutes{Handle: func() *netlink.Handle { return nl }}
	routes := func() string {
		rs, err := backend.List()
		if err != nil {
			t.Fatal(err)
		}
		return formatRoutes(rs)
	}
	cache := newFakeCache()
	m, dones := startManager(t, backend, cache, "nodes", "tendrilnodes")

	mustUpsert(t, m, "a", []string{"172.31.9.1"}, "10.9.1.0/24")
	mustUpsert(t, m, "b", []string{"172.31.9.2"}, "10.9.2.0/24")
	mustUpsert(t, m, "c", []string{"172.31.9.3"}, "10.9.3.0/24")
	eventually(t, func() (bool, string) {
		got := routes()
		want := "[10.9.2.0/24 via 172.31.9.2 10.9.3.0/24 via 172.31.9.3 10.9.99.0/24 via 172.31.9.99]"
		return got == want, fmt.Sprintf("routes %s, want %s (own node skipped, stale kept before sync)", got, want)
	})
	// Not pruned while one source has not synced, even when asked.
	dones[0]()
	m.Prune()
	time.Sleep(200 * time.Millisecond)
	if got := routes(); !strings.Contains(got, "10.9.99.0/24") {
		t.Fatalf("stale route pruned before every source synced: %s", got)
	}
	dones[1]()
	eventually(t, func() (bool, string) {
		got, want := routes(), "[10.9.2.0/24 via 172.31.9.2 10.9.3.0/24 via 172.31.9.3]"
		return got == want, fmt.Sprintf("routes %s, want %s (stale pruned after sync)", got, want)
	})
	if got, want := cache.claims(), "[b=172.31.9.2 c=172.31.9.3]"; got != want {
		t.Fatalf("ipcache %s, want %s", got, want)
	}
	if s := routeStatus(m, "10.9.2.0/24"); !strings.HasPrefix(s, "Done") {
		t.Fatalf("route status %q", s)
	}

	// c moves to another address; b goes away.
	mustUpsert(t, m, "c", []string{"172.31.9.30"}, "10.9.3.0/24")
	if err := m.DeletePeer("b"); err != nil {
		t.Fatal(err)
	}
	eventually(t, func() (bool, string) {
		got, want := routes(), "[10.9.3.0/24 via 172.31.9.30]"
		return got == want, fmt.Sprintf("routes %s, want %s", got, want)
	})
	eventually(t, func() (bool, string) {
		got, want := cache.claims(), "[c=172.31.9.30]"
		return got == want, fmt.Sprintf("ipcache %s, want %s", got, want)
	})

	// A failing ipcache write shows in the node's status and is retried
	// until it succeeds, with no other event.
	cache.setFail(true)
	mustUpsert(t, m, "d", []string{"172.31.9.4"})
	eventually(t, func() (bool, string) {
		s := peerStatus(m, "d")
		return strings.Contains(s, "map full"), "status of d: " + s
	})
	cache.setFail(false)
	eventually(t, func() (bool, string) {
		got, want := cache.claims(), "[c=172.31.9.30 d=172.31.9.4]"
		return got == want && strings.HasPrefix(peerStatus(m, "d"), "Done"), fmt.Sprintf("ipcache after retry %s, want %s (status %s)", got, want, peerStatus(m, "d"))
	})

	// A pod CIDR without an address of its family is an error in the
	// node's status, not a route to nowhere.
	mustUpsert(t, m, "e", []string{"172.31.9.5"}, "fd00:e::/112")
	eventually(t, func() (bool, string) {
		s := peerStatus(m, "e")
		return strings.Contains(s, "no address of the family"), "status of e: " + s
	})
	if got := routes(); strings.Contains(got, "fd00:e::") {
		t.Fatalf("route to nowhere: %s", got)
	}
}

// TestRouteWriteRetried: a route the kernel refuses is in Error with the
// message and is retried with backoff until the kernel takes it, with no
// other event; the prune waits for the initializers.
func TestRouteWriteRetried(t *testing.T) {
	backend := &fakeRoutes{routes: map[netip.Prefix]netip.Addr{
		netip.MustParsePrefix("10.9.99.0/24"): netip.MustParseAddr("172.31.9.99")}}
	backend.setFail(errors.New("network is unreachable"))
	m, dones := startManager(t, backend, nil, "nodes")
	mustUpsert(t, m, "b", []string{"172.31.9.2"}, "10.9.2.0/24")
	eventually(t, func() (bool, string) {
		s := routeStatus(m, "10.9.2.0/24")
		return strings.Contains(s, "network is unreachable"), "route status " + s
	})
	backend.setFail(nil)
	eventually(t, func() (bool, string) {
		got := backend.String()
		want := "[10.9.2.0/24 via 172.31.9.2 10.9.99.0/24 via 172.31.9.99]"
		return got == want && strings.HasPrefix(routeStatus(m, "10.9.2.0/24"), "Done"),
			fmt.Sprintf("routes %s, want %s (status %s)", got, want, routeStatus(m, "10.9.2.0/24"))
	})
	m.Prune()
	time.Sleep(200 * time.Millisecond)
	if got := backend.String(); !strings.Contains(got, "10.9.99.0/24") {
		t.Fatalf("pruned before the source synced: %s", got)
	}
	dones[0]()
	eventually(t, func() (bool, string) {
		got, want := backend.String(), "[10.9.2.0/24 via 172.31.9.2]"
		return got == want, fmt.Sprintf("routes %s, want %s", got, want)
	})
}

// TestSamePodCIDRTwoPeers: two peers naming one pod CIDR (a node rebuilt
// under a new name before the old Node is deleted): the route goes to one
// of them whatever the event order, and to the other when that one goes.
func TestSamePodCIDRTwoPeers(t *testing.T) {
	for _, order := range [][]string{{"old", "new"}, {"new", "old"}} {
		backend := &fakeRoutes{routes: map[netip.Prefix]netip.Addr{}}
		m, _ := startManager(t, backend, nil)
		hops := map[string]string{"old": "172.31.9.7", "new": "172.31.9.8"}
		for _, n := range order {
			mustUpsert(t, m, n, []string{hops[n]}, "10.9.7.0/24")
		}
		eventually(t, func() (bool, string) {
			got, want := backend.String(), "[10.9.7.0/24 via 172.31.9.8]"
			return got == want, fmt.Sprintf("order %v: routes %s, want %s", order, got, want)
		})
		if err := m.DeletePeer("new"); err != nil {
			t.Fatal(err)
		}
		eventually(t, func() (bool, string) {
			got, want := backend.String(), "[10.9.7.0/24 via 172.31.9.7]"
			return got == want, fmt.Sprintf("order %v: after new went: routes %s, want %s", order, got, want)
		})
		if err := m.DeletePeer("old"); err != nil {
			t.Fatal(err)
		}
		eventually(t, func() (bool, string) {
			got := backend.String()
			return got == "[]", fmt.Sprintf("order %v: after both went: routes %s", order, got)
		})
	}
}

// TestAddressMovesBetweenNodes: a node is replaced by one with the same
// address (a rebuilt VM). Each node claims the address as itself, so
// removing the old node withdraws only its own claim.
func TestAddressMovesBetweenNodes(t *testing.T) {
	cache := newFakeCache()
	m, _ := startManager(t, nil, cache)
	mustUpsert(t, m, "old", []string{"172.31.9.7"})
	mustUpsert(t, m, "new", []string{"172.31.9.7"})
	eventually(t, func() (bool, string) {
		got, want := cache.claims(), "[new=172.31.9.7 old=172.31.9.7]"
		return got == want, fmt.Sprintf("claims %s, want %s", got, want)
	})
	if err := m.DeletePeer("old"); err != nil {
		t.Fatal(err)
	}
	eventually(t, func() (bool, string) {
		got, want := cache.claims(), "[new=172.31.9.7]"
		return got == want, fmt.Sprintf("after the old node went: claims %s, want %s", got, want)
	})
	// Without a routes backend no route is desired at all.
	if n := len(m.PeerRoutes()); n != 0 {
		t.Fatalf("%d routes desired without a routes backend", n)
	}
}

// TestUnchangedPeerNotRewritten: a resync of an unchanged Node leaves the
// peer's object (and its Done status) as it is.
func TestUnchangedPeerNotRewritten(t *testing.T) {
	m, _ := startManager(t, &fakeRoutes{routes: map[netip.Prefix]netip.Addr{}}, newFakeCache())
	mustUpsert(t, m, "b", []string{"172.31.9.2"}, "10.9.2.0/24")
	eventually(t, func() (bool, string) {
		s := peerStatus(m, "b")
		return strings.HasPrefix(s, "Done"), "status " + s
	})
	rev := m.nodes.Revision(m.db.ReadTxn())
	mustUpsert(t, m, "b", []string{"172.31.9.2"}, "10.9.2.0/24")
	if got := m.nodes.Revision(m.db.ReadTxn()); got != rev {
		t.Fatalf("unchanged peer rewritten: revision %d -> %d", rev, got)
	}
}

// TestPrivilegedHostilePodCIDRNoRoute: a peer whose TendrilNode names the
// default route, or a pod CIDR inside another node's, gets no route in a
// real routing table, while a legitimate peer does.
func TestPrivilegedHostilePodCIDRNoRoute(t *testing.T) {
	testutil.Privileged(t)
	name := "tdr-nm-hostile"
	nl := routeTestNetns(t, name)
	if err := nl.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "lab0"}, PeerName: "lab0p"}); err != nil {
		t.Fatal(err)
	}
	for _, l := range []string{"lab0", "lab0p", "lo"} {
		link, err := nl.LinkByName(l)
		if err != nil {
			t.Fatal(err)
		}
		if err := nl.LinkSetUp(link); err != nil {
			t.Fatal(err)
		}
	}
	link, _ := nl.LinkByName("lab0")
	addr, _ := netlink.ParseAddr("172.31.9.1/24")
	if err := nl.AddrAdd(link, addr); err != nil {
		t.Fatal(err)
	}
	backend := NetlinkRoutes{Handle: func() *netlink.Handle { return nl }}
	m, _ := startManager(t, backend, newFakeCache())

	// The hostile ones first: a claim made before the legitimate one
	// must not win by arriving first either.
	mustUpsert(t, m, "evil", []string{"172.31.9.66"}, "0.0.0.0/0")
	mustUpsert(t, m, "thief", []string{"172.31.9.67"}, "10.9.2.0/25")
	mustUpsert(t, m, "b", []string{"172.31.9.2"}, "10.9.2.0/24")
	// With no creation times the order is by name: b's claim holds
	// whatever order the events came in.
	eventually(t, func() (bool, string) {
		rs, err := nl.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
		if err != nil {
			return false, err.Error()
		}
		var got []string
		for _, r := range rs {
			dst := "default"
			if r.Dst != nil {
				dst = r.Dst.String()
			}
			if r.Gw != nil {
				got = append(got, dst+" via "+r.Gw.String())
			}
		}
		sort.Strings(got)
		want := "[10.9.2.0/24 via 172.31.9.2]"
		return fmt.Sprint(got) == want, fmt.Sprintf("gateway routes in the main table %v, want %s", got, want)
	})
}

// routeTestNetns makes a fresh named network namespace for a route test
// and returns a netlink handle in it; both go when the test ends.
func routeTestNetns(t *testing.T, name string) *netlink.Handle {
	t.Helper()
	_ = exec.Command("ip", "netns", "del", name).Run()
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	ns, err := netns.GetFromName(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close() })
	nl, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nl.Close() })
	return nl
}

// TestWireGuardKeyFromTendrilNode: a node's published WireGuard key is
// checked as it is read; a malformed one is kept as the peer's KeyError,
// never as its key, and a key that changes (rotation) changes the table's
// peer.
func TestWireGuardKeyFromTendrilNode(t *testing.T) {
	const good = "xTIBA5rboUvnH4htodjb6e697QjLERt1NAB4mZqp8Dg="
	tn := func(key string) *v1alpha1.TendrilNode {
		return &v1alpha1.TendrilNode{Spec: v1alpha1.NodeSpec{Encryption: v1alpha1.NodeEncryption{WireGuardPublicKey: key}}}
	}
	if p := MergeTendrilNode(Peer{Name: "b"}, tn(good)); p.WireGuardKey != good || p.KeyError != "" {
		t.Fatalf("valid key: %+v", p)
	}
	for _, bad := range []string{"not-a-key", "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=", good[:43] + "==", "xTIBA5rboUvnH4htodjb6e697QjLERt1NAB4mZqp8Dh="} {
		if p := MergeTendrilNode(Peer{Name: "b"}, tn(bad)); p.WireGuardKey != "" || p.KeyError == "" {
			t.Errorf("malformed key %q: %+v", bad, p)
		}
	}
	if p := MergeTendrilNode(Peer{Name: "b"}, tn("")); p.WireGuardKey != "" || p.KeyError != "" {
		t.Fatalf("no key: %+v", p)
	}

	m, _ := startManager(t, nil, nil)
	b := Peer{Name: "b", IPs: []netip.Addr{netip.MustParseAddr("172.30.0.12")}, PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24")}}
	if err := m.UpsertPeer(MergeTendrilNode(b, tn(good))); err != nil {
		t.Fatal(err)
	}
	if ps := m.Peers(); len(ps) != 1 || ps[0].WireGuardKey != good {
		t.Fatalf("peers %+v", ps)
	}
	const rotated = "HIgo9xNzJMWLKASShiTqIybxZ0U3wGLiUeJ1PKf8ykw="
	if err := m.UpsertPeer(MergeTendrilNode(b, tn(rotated))); err != nil {
		t.Fatal(err)
	}
	if ps := m.Peers(); len(ps) != 1 || ps[0].WireGuardKey != rotated {
		t.Fatalf("after rotation, peers %+v", ps)
	}
	if err := m.UpsertPeer(MergeTendrilNode(b, tn("garbage"))); err != nil {
		t.Fatal(err)
	}
	if ps := m.Peers(); len(ps) != 1 || ps[0].WireGuardKey != "" || ps[0].KeyError == "" {
		t.Fatalf("after a malformed key, peers %+v", ps)
	}
}

// TestHealthEndpointClaims: a peer's health endpoint address inside its
// accepted pod CIDR is claimed in the ipcache as the health identity on
// that node (its primary address, of either family: the tunnel's remote,
// as for its pods); one outside its pod CIDR is not; a changed or
// withdrawn address's claim goes.
func TestHealthEndpointClaims(t *testing.T) {
	cache := newFakeCache()
	m, _ := startManager(t, nil, cache)
	upsert := func(health ...string) {
		t.Helper()
		p := Peer{Name: "b", IPs: []netip.Addr{netip.MustParseAddr("172.31.9.2")}, PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.9.2.0/24")}}
		for _, h := range health {
			p.HealthIPs = append(p.HealthIPs, netip.MustParseAddr(h))
		}
		if err := m.UpsertPeer(p); err != nil {
			t.Fatal(err)
		}
	}
	expect := func(what, want string) {
		t.Helper()
		eventually(t, func() (bool, string) {
			got := cache.claims()
			return got == want, fmt.Sprintf("%s: claims %s, want %s", what, got, want)
		})
	}
	upsert("10.9.2.2", "10.9.3.2")
	expect("health endpoint published", "[b=10.9.2.2(health via 172.31.9.2) b=172.31.9.2]")
	upsert("10.9.2.5")
	expect("health endpoint moved", "[b=10.9.2.5(health via 172.31.9.2) b=172.31.9.2]")
	upsert()
	expect("health endpoint withdrawn", "[b=172.31.9.2]")
	// Dual stack: the IPv6 health address names the node's primary
	// (IPv4) address too.
	dual := Peer{Name: "b", IPs: []netip.Addr{netip.MustParseAddr("172.31.9.2"), netip.MustParseAddr("fd00:31::2")},
		PodCIDRs:  []netip.Prefix{netip.MustParsePrefix("10.9.2.0/24"), netip.MustParsePrefix("fd00:9:2::/64")},
		HealthIPs: []netip.Addr{netip.MustParseAddr("10.9.2.2"), netip.MustParseAddr("fd00:9:2::2")}}
	if err := m.UpsertPeer(dual); err != nil {
		t.Fatal(err)
	}
	expect("dual stack", "[b=10.9.2.2(health via 172.31.9.2) b=172.31.9.2 b=fd00:31::2 b=fd00:9:2::2(health via 172.31.9.2)]")
	if err := m.DeletePeer("b"); err != nil {
		t.Fatal(err)
	}
	expect("node gone", "[]")
}

// TestPrivilegedDeviceRouteSource: a route to a peer's pod CIDR through
// the tunnel's (or the encryption's) device carries as its source the
// address this node reaches the peer's node from, in both families. The
// device has no address; without the source, IPv6's selection took the
// longest matching prefix, the router address in this node's own pod
// CIDR (on another device), which no other node knows.
func TestPrivilegedDeviceRouteSource(t *testing.T) {
	testutil.Privileged(t)
	nl := routeTestNetns(t, "tdr-nm-src")
	// Veth pairs (this kernel has no dummy module), both ends up for a
	// carrier.
	add := func(name string, addrs ...string) {
		t.Helper()
		if err := nl.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: name + "p"}); err != nil {
			t.Fatal(err)
		}
		peer, err := nl.LinkByName(name + "p")
		if err != nil {
			t.Fatal(err)
		}
		if err := nl.LinkSetUp(peer); err != nil {
			t.Fatal(err)
		}
		link, err := nl.LinkByName(name)
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range addrs {
			addr, _ := netlink.ParseAddr(a)
			addr.Flags = unix.IFA_F_NODAD
			if err := nl.AddrAdd(link, addr); err != nil {
				t.Fatal(err)
			}
		}
		if err := nl.LinkSetUp(link); err != nil {
			t.Fatal(err)
		}
	}
	// The underlay, the host device with the router addresses of this
	// node's pod CIDRs, and the tunnel device (no address).
	add("eth0", "172.31.7.11/24", "fd00:172:31::11/64")
	add("host0", "10.7.1.1/32", "fd00:10:7:1::1/128")
	add("tun0")

	backend := NetlinkRoutes{Handle: func() *netlink.Handle { return nl }, Device: "tun0"}
	for _, c := range []struct{ dst, via, pod, wantSrc string }{
		{"10.7.0.0/24", "172.31.7.12", "10.7.0.2", "172.31.7.11"},
		{"fd00:10:7::/64", "fd00:172:31::12", "fd00:10:7::2", "fd00:172:31::11"},
	} {
		if err := backend.Replace(netip.MustParsePrefix(c.dst), netip.MustParseAddr(c.via)); err != nil {
			t.Fatal(err)
		}
		rs, err := nl.RouteGet(net.ParseIP(c.pod))
		if err != nil || len(rs) == 0 {
			t.Fatalf("route get %s: %v", c.pod, err)
		}
		tun, _ := nl.LinkByName("tun0")
		if rs[0].LinkIndex != tun.Attrs().Index {
			t.Errorf("route to %s: link %d, want tun0 (%d)", c.pod, rs[0].LinkIndex, tun.Attrs().Index)
		}
		if got := rs[0].Src.String(); got != c.wantSrc {
			t.Errorf("route to %s: source %s, want %s (the address towards the peer's node %s)", c.pod, got, c.wantSrc, c.via)
		}
	}
	// No route to the peer's node: no route to its pods either (an
	// error, retried by the reconciler), never one with no source.
	if err := nl.RouteDel(&netlink.Route{Dst: prefixNet(netip.MustParsePrefix("fd00:172:31::/64")), LinkIndex: mustLinkIndex(t, nl, "eth0")}); err != nil {
		t.Fatal(err)
	}
	if err := backend.Replace(netip.MustParsePrefix("fd00:10:8::/64"), netip.MustParseAddr("fd00:172:31::13")); err == nil {
		t.Errorf("a route to a pod CIDR whose node has no route was installed")
	}
}

func mustLinkIndex(t *testing.T, nl *netlink.Handle, name string) int {
	t.Helper()
	l, err := nl.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	return l.Attrs().Index
}
