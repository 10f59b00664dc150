package linux

import (
	"crypto/rand"
	"encoding/hex"
	"net"
	"os/exec"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/tendril-net/tendril/pkg/testutil"
)

// nodeNetns creates a named network namespace standing in for a node and
// returns a Host working in it.
func nodeNetns(t *testing.T) (*Host, *netlink.Handle, netns.NsHandle) {
	t.Helper()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	name := "tdrlnx-" + hex.EncodeToString(b)
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v: %s", name, err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	ns, err := netns.GetFromName(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close() })
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return NewHost(h, ns, nil), h, ns
}

func TestPrivilegedEnsureHostDevice(t *testing.T) {
	testutil.Privileged(t)
	host, h, _ := nodeNetns(t)
	v4, v6 := net.ParseIP("10.77.0.1"), net.ParseIP("fd00:77::1")

	for i := range 2 { // the second call must be a no-op, not an error
		if _, err := host.EnsureHostDevice(v4, v6); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	link, err := h.LinkByName(HostDeviceName)
	if err != nil {
		t.Fatal(err)
	}
	if link.Attrs().Flags&net.FlagUp == 0 {
		t.Errorf("%s is not up", HostDeviceName)
	}
	assertAddrs(t, h, link, "10.77.0.1/32", "fd00:77::1/128")
	for _, s := range [][]string{{"net", "ipv4", "ip_forward"}, {"net", "ipv6", "conf", "all", "forwarding"}} {
		if v, err := host.Sysctl().Get(s...); err != nil || v != "1" {
			t.Errorf("%s = %q (%v), want 1", strings.Join(s, "."), v, err)
		}
	}

	// A new pod CIDR (new router address) replaces the old one.
	if _, err := host.EnsureHostDevice(net.ParseIP("10.78.0.1"), nil); err != nil {
		t.Fatal(err)
	}
	assertAddrs(t, h, link, "10.78.0.1/32")

	if _, err := host.EnsureHostDevice(net.ParseIP("fd00::1"), nil); err == nil {
		t.Error("an IPv6 address as router IPv4 was accepted")
	}
}

func TestPrivilegedEndpointRoutes(t *testing.T) {
	testutil.Privileged(t)
	host, h, _ := nodeNetns(t)
	la := netlink.NewLinkAttrs()
	la.Name = "tdrlnx-a"
	if err := h.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: "tdrlnx-b"}); err != nil {
		t.Fatal(err)
	}
	a, _ := h.LinkByName("tdrlnx-a")
	b, _ := h.LinkByName("tdrlnx-b")
	for _, l := range []netlink.Link{a, b} {
		if err := h.LinkSetUp(l); err != nil {
			t.Fatal(err)
		}
	}
	if err := host.ConfigureHostVeth("tdrlnx-a", net.ParseIP("fd00:77::1")); err != nil {
		t.Fatal(err)
	}
	proxies, err := h.NeighProxyList(a.Attrs().Index, netlink.FAMILY_V6)
	if err != nil {
		t.Fatal(err)
	}
	if len(proxies) != 1 || !proxies[0].IP.Equal(net.ParseIP("fd00:77::1")) {
		t.Errorf("proxy NDP entries on host veth: %v, want the router fd00:77::1", proxies)
	}
	if v, _ := host.Sysctl().Get("net", "ipv4", "conf", "tdrlnx-a", "rp_filter"); v != "0" {
		t.Errorf("rp_filter of host veth = %q, want 0", v)
	}
	ip4, ip6 := net.ParseIP("10.77.0.9"), net.ParseIP("fd00:77::9")
	for _, ip := range []net.IP{ip4, ip6} {
		if err := host.UpsertEndpointRoute(ip, a.Attrs().Index); err != nil {
			t.Fatal(err)
		}
	}
	// Upsert moves the route: the address now belongs to a newer endpoint.
	if err := host.UpsertEndpointRoute(ip4, b.Attrs().Index); err != nil {
		t.Fatal(err)
	}
	routes := routeMap(t, host)
	if routes["10.77.0.9/32"] != b.Attrs().Index || routes["fd00:77::9/128"] != a.Attrs().Index || len(routes) != 2 {
		t.Fatalf("routes = %v, want 10.77.0.9/32 via %d and fd00:77::9/128 via %d", routes, b.Attrs().Index, a.Attrs().Index)
	}
	// Deleting with the old endpoint's interface must keep the newer route.
	if err := host.DeleteEndpointRoute(ip4, a.Attrs().Index); err != nil {
		t.Fatal(err)
	}
	if _, ok := routeMap(t, host)["10.77.0.9/32"]; !ok {
		t.Fatal("deleting the old endpoint's route removed the new endpoint's route")
	}
	for _, ip := range []net.IP{ip4, ip6} {
		if err := host.DeleteEndpointRoute(ip, 0); err != nil {
			t.Fatal(err)
		}
		if err := host.DeleteEndpointRoute(ip, 0); err != nil { // idempotent
			t.Fatal(err)
		}
	}
	if r := routeMap(t, host); len(r) != 0 {
		t.Fatalf("routes left after delete: %v", r)
	}
	if err := host.UpsertEndpointRoute(ip4, 0); err == nil {
		t.Error("a route without an interface was accepted")
	}

	if ok, err := host.LinkExists("tdrlnx-a"); !ok || err != nil {
		t.Errorf("LinkExists(tdrlnx-a) = %v, %v", ok, err)
	}
	if ok, err := host.LinkExists("tdrlnx-none"); ok || err != nil {
		t.Errorf("LinkExists(tdrlnx-none) = %v, %v", ok, err)
	}
}

func routeMap(t *testing.T, host *Host) map[string]int {
	t.Helper()
	rs, err := host.EndpointRoutes()
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]int{}
	for _, r := range rs {
		m[r.Dst.String()] = r.LinkIndex
	}
	return m
}

func assertAddrs(t *testing.T, h *netlink.Handle, link netlink.Link, want ...string) {
	t.Helper()
	addrs, err := h.AddrList(link, netlink.FAMILY_ALL)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, a := range addrs {
		if !a.IP.IsLinkLocalUnicast() {
			got = append(got, a.IPNet.String())
		}
	}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("addresses of %s = %v, want %v", HostDeviceName, got, want)
	}
}
