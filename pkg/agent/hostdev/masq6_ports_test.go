package hostdev

import (
	"net"
	"net/netip"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

var world6b = netip.MustParseAddr("2001:db8::7")

// TestPrivilegedMasqueradePortsIPv6 is TestPrivilegedMasqueradePorts for
// IPv6: a port a host socket listens on and a port a live mapping holds
// are never given; flows get the two others; the next flow is dropped
// with "Masquerade port range exhausted"; once a mapping's flow is gone,
// its port is taken over, with both halves of the old mapping removed.
func TestPrivilegedMasqueradePortsIPv6(t *testing.T) {
	const lo, hi = 62000, 62003
	n := newMasqNode(t, lo, hi)
	up, err := netlink.LinkByIndex(n.uplink)
	if err != nil {
		t.Fatal(err)
	}
	if err := netlink.AddrAdd(up, &netlink.Addr{IPNet: &net.IPNet{IP: node6.AsSlice(), Mask: net.CIDRMask(64, 128)}, Flags: unix.IFA_F_NODAD}); err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetUp(up); err != nil {
		t.Fatal(err)
	}
	list := checkMasqPorts(t, n, famV6)
	for _, m := range list {
		if m.Orphan {
			t.Fatalf("the taken-over mapping (or half of one) is still there: %+v", m)
		}
	}
	if c, _ := n.l.Maps().NAT.NATMap().Count(); c != 2*len(list) {
		t.Fatalf("NAT table has %d entries for %d mappings", c, len(list))
	}
}

// TestPrivilegedMasqueradePrefersFreshPortsIPv6 is
// TestPrivilegedMasqueradePrefersFreshPorts for IPv6.
func TestPrivilegedMasqueradePrefersFreshPortsIPv6(t *testing.T) {
	checkMasqFreshPorts(t, newMasqNode(t, 63000, 63001), famV6)
}
