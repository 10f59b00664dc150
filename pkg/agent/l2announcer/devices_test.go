package l2announcer

import (
	"fmt"
	"net"
	"net/netip"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/tendril-net/tendril/pkg/loadbalancer"
	"github.com/tendril-net/tendril/pkg/testutil"
	"github.com/tendril-net/tendril/pkg/testutil/netlab"
)

// TestPrivilegedReadDevicesGateways: in a real network namespace, the
// device's gateways (the default route's next hop first, then the other
// routes' through it) are read with its subnet, and an external IP equal
// to the default gateway is refused even by a policy that admits external
// IPs on the whole subnet, while another address of the subnet is placed.
func TestPrivilegedReadDevicesGateways(t *testing.T) {
	testutil.Privileged(t)
	n, err := netlab.NewNode("l2gw")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close() })
	leave, err := n.Enter()
	if err != nil {
		t.Fatal(err)
	}
	defer leave()
	netlab.AddVeth(t, "l2up0", "l2up1")
	link, err := netlink.LinkByName("l2up0")
	if err != nil {
		t.Fatal(err)
	}
	if err := netlink.AddrAdd(link, &netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP("172.30.9.11"), Mask: net.CIDRMask(24, 32)}}); err != nil {
		t.Fatal(err)
	}
	_, other, _ := net.ParseCIDR("10.99.0.0/16")
	for _, r := range []netlink.Route{
		{LinkIndex: link.Attrs().Index, Dst: other, Gw: net.ParseIP("172.30.9.254")},
		{LinkIndex: link.Attrs().Index, Gw: net.ParseIP("172.30.9.1")},
	} {
		if err := netlink.RouteAdd(&r); err != nil {
			t.Fatalf("route %v: %v", r, err)
		}
	}
	devs, err := ReadDevices([]string{"l2up0", "missing0"})
	if err != nil {
		t.Fatal(err)
	}
	if len(devs) != 1 || fmt.Sprint(devs[0].Prefixes, devs[0].Gateways) != "[172.30.9.11/24] [172.30.9.1 172.30.9.254]" {
		t.Fatalf("devices %+v: want l2up0 with 172.30.9.11/24, gateways 172.30.9.1 (default) and 172.30.9.254", devs)
	}
	p := &Policy{Pool: "ext", Node: true, ExternalIPs: true, Services: everything.Policies[0].Services,
		Blocks: []AddrRange{{From: netip.MustParseAddr("172.30.9.0"), To: netip.MustParseAddr("172.30.9.255")}}}
	s := svc("hijack", 1, nil, []netip.Addr{netip.MustParseAddr("172.30.9.1"), netip.MustParseAddr("172.30.9.50")}, nil)
	w, refused := Wants("node-1", []*loadbalancer.Service{s}, nil, devs, Cluster{Policies: []*Policy{p}})
	if got := placed(w); got != "hijack=172.30.9.50@l2up0" {
		t.Fatalf("placed %q, want only 172.30.9.50", got)
	}
	mustRefuse(t, refused, "hijack", netip.MustParseAddr("172.30.9.1"), "gateway of l2up0's subnet")
}
