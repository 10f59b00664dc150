package nodemanager

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os/exec"
	"sort"
	"sync"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/tendril-net/tendril/pkg/k8s/apis/tendril.io/v1alpha1"
	"github.com/tendril-net/tendril/pkg/testutil"
)

// fakeCache records each node's claims on addresses.
type fakeCache struct {
	mu   sync.Mutex
	ips  map[nodeAddr]bool
	fail bool
}

func (f *fakeCache) UpsertRemoteNode(node string, ip netip.Addr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail {
		return errors.New("map full")
	}
	f.ips[nodeAddr{node, ip}] = true
	return nil
}

func (f *fakeCache) DeleteRemoteNode(node string, ip netip.Addr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.ips, nodeAddr{node, ip})
	return nil
}

// list is the claimed addresses, each once.
func (f *fakeCache) list() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	seen := map[string]bool{}
	var out []string
	for na := range f.ips {
		if s := na.ip.String(); !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	sort.Strings(out)
	return fmt.Sprint(out)
}

// claims is every node's claim as node=ip.
func (f *fakeCache) claims() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for na := range f.ips {
		out = append(out, na.node+"="+na.ip.String())
	}
	sort.Strings(out)
	return fmt.Sprint(out)
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

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

// TestPrivilegedRoutesToPeers runs the manager in a network namespace of
// its own with a link on a 172.31.9.0/24 "node network": routes to peers'
// pod CIDRs appear via their addresses, follow changes, disappear with the
// peer, and a stale route (a peer deleted while the agent was down) goes
// at the first reconciliation. Failed ipcache writes are retried.
func TestPrivilegedRoutesToPeers(t *testing.T) {
	testutil.Privileged(t)
	name := "tdr-nm-test"
	_ = exec.Command("ip", "netns", "del", name).Run()
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	ns, err := netns.GetFromName(name)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	nl, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer nl.Close()
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

	cache := &fakeCache{ips: map[nodeAddr]bool{}}
	m := New(Config{LocalNode: "a", InstallRoutes: true}, nl, cache, quiet())
	routes := func() string {
		rs, err := m.installedRoutes()
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, r := range rs {
			out = append(out, r.Dst.String()+" via "+r.Gw.String())
		}
		sort.Strings(out)
		return fmt.Sprint(out)
	}

	m.UpsertPeer(Peer{Name: "a", IPs: []netip.Addr{netip.MustParseAddr("172.31.9.1")}, PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.9.1.0/24")}})
	m.UpsertPeer(Peer{Name: "b", IPs: []netip.Addr{netip.MustParseAddr("172.31.9.2")}, PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.9.2.0/24")}})
	m.UpsertPeer(Peer{Name: "c", IPs: []netip.Addr{netip.MustParseAddr("172.31.9.3")}, PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.9.3.0/24")}})
	if err := m.Reconcile(); err != nil {
		t.Fatal(err)
	}
	if got, want := routes(), "[10.9.2.0/24 via 172.31.9.2 10.9.3.0/24 via 172.31.9.3]"; got != want {
		t.Fatalf("routes %s, want %s (own node skipped, stale removed)", got, want)
	}
	if got := cache.list(); got != "[172.31.9.2 172.31.9.3]" {
		t.Fatalf("ipcache %s", got)
	}

	// c moves to another address; b goes away.
	m.UpsertPeer(Peer{Name: "c", IPs: []netip.Addr{netip.MustParseAddr("172.31.9.30")}, PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.9.3.0/24")}})
	m.DeletePeer("b")
	if err := m.Reconcile(); err != nil {
		t.Fatal(err)
	}
	if got, want := routes(), "[10.9.3.0/24 via 172.31.9.30]"; got != want {
		t.Fatalf("routes %s, want %s", got, want)
	}
	if got := cache.list(); got != "[172.31.9.30]" {
		t.Fatalf("ipcache %s", got)
	}

	// A failing ipcache write is reported and retried by the next pass.
	cache.fail = true
	m.UpsertPeer(Peer{Name: "d", IPs: []netip.Addr{netip.MustParseAddr("172.31.9.4")}})
	if err := m.Reconcile(); err == nil {
		t.Fatal("a failed ipcache write was not reported")
	}
	cache.fail = false
	if err := m.Reconcile(); err != nil {
		t.Fatal(err)
	}
	if got := cache.list(); got != "[172.31.9.30 172.31.9.4]" {
		t.Fatalf("ipcache after retry %s", got)
	}

	// A pod CIDR without an address of its family is an error, not a
	// route to nowhere.
	m.UpsertPeer(Peer{Name: "e", IPs: []netip.Addr{netip.MustParseAddr("172.31.9.5")}, PodCIDRs: []netip.Prefix{netip.MustParsePrefix("fd00:e::/112")}})
	if err := m.Reconcile(); err == nil {
		t.Fatal("an IPv6 pod CIDR with only an IPv4 node address was accepted")
	}
}

// TestAddressMovesBetweenNodes: a node is replaced by one with the same
// address (a rebuilt VM). Each node claims the address as itself, so
// removing the old node withdraws only its own claim.
func TestAddressMovesBetweenNodes(t *testing.T) {
	cache := &fakeCache{ips: map[nodeAddr]bool{}}
	m := New(Config{LocalNode: "a"}, nil, cache, quiet())
	ip := netip.MustParseAddr("172.31.9.7")
	m.UpsertPeer(Peer{Name: "old", IPs: []netip.Addr{ip}})
	m.UpsertPeer(Peer{Name: "new", IPs: []netip.Addr{ip}})
	if err := m.Reconcile(); err != nil {
		t.Fatal(err)
	}
	if got, want := cache.claims(), "[new=172.31.9.7 old=172.31.9.7]"; got != want {
		t.Fatalf("claims %s, want %s", got, want)
	}
	m.DeletePeer("old")
	if err := m.Reconcile(); err != nil {
		t.Fatal(err)
	}
	if got, want := cache.claims(), "[new=172.31.9.7]"; got != want {
		t.Fatalf("after the old node went: claims %s, want %s", got, want)
	}
}
