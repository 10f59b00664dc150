package hostdev

import (
	"net"
	"net/netip"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/tendril-net/tendril/pkg/datapath/maps"
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
	ln, err := net.Listen("tcp", "[fd00:ff::11]:62000")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	otherPod := netip.MustParseAddr("fd00:10::9")
	other := maps.NATMapping{Proto: protoTCP, Pod: otherPod, PodPort: 45000, Remote: world6, RemotePort: 80,
		Node: node6, NodePort: 62001, Created: maps.MonotonicNow()}
	if err := n.l.Maps().NAT.NATMap().Upsert(other); err != nil {
		t.Fatal(err)
	}
	otherCT := maps.CTEntry{Proto: protoTCP, Src: otherPod, SrcPort: 45000, Dst: world6, DstPort: 80, Expires: maps.MonotonicNow() + 60e9, Flags: maps.CTFlagSeenReply}
	if err := n.l.Maps().CTMap().Upsert(otherCT); err != nil {
		t.Fatal(err)
	}
	got := map[uint16]bool{}
	for i := range 2 {
		f := frame6(pod6, world6, protoTCP, uint16(41000+i), 80, 0)
		n.fromPod(f)
		ret, out := n.egress(f)
		if ret != 0 {
			t.Fatalf("flow %d: verdict %d", i, ret)
		}
		src, _ := tuple6(out)
		if src.Port() == 62000 || src.Port() == 62001 || got[src.Port()] || !inRange(src.Port(), lo, hi) {
			t.Fatalf("flow %d got port %d (taken: host socket 62000, mapping 62001, earlier %v)", i, src.Port(), got)
		}
		got[src.Port()] = true
	}
	// Another destination has its own ports.
	f := frame6(pod6, world6b, protoTCP, 41000, 80, 0)
	n.fromPod(f)
	if ret, _ := n.egress(f); ret != 0 {
		t.Fatalf("flow to another destination: verdict %d", ret)
	}
	drops := n.metric(maps.ReasonMasqNoPort, maps.DirEgress)
	full := frame6(pod6, world6, protoTCP, 41009, 80, 0)
	n.fromPod(full)
	if ret, _ := n.egress(full); ret != 2 {
		t.Fatalf("flow beyond the range: verdict %d, want a drop", ret)
	}
	if n.metric(maps.ReasonMasqNoPort, maps.DirEgress) != drops+1 {
		t.Fatalf("exhaustion not counted under %q", maps.ReasonName(maps.ReasonMasqNoPort))
	}
	// The other flow ends: its port is taken over.
	if err := n.l.Maps().CTMap().Delete(otherCT); err != nil {
		t.Fatal(err)
	}
	other.Created = maps.MonotonicNow() - 3e9
	if err := n.l.Maps().NAT.NATMap().Upsert(other); err != nil {
		t.Fatal(err)
	}
	ret, out := n.egress(full)
	if ret != 0 {
		t.Fatalf("flow after a mapping's flow ended: verdict %d", ret)
	}
	if src, _ := tuple6(out); src.Port() != 62001 {
		t.Fatalf("flow got port %d, want the freed 62001", src.Port())
	}
	list, _ := n.l.Maps().NAT.NATMap().List()
	for _, m := range list {
		if m.Pod == otherPod || m.Orphan {
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
	n := newMasqNode(t, 63000, 63001)
	dead := maps.NATMapping{Proto: protoTCP, Pod: netip.MustParseAddr("fd00:10::9"), PodPort: 45000, Remote: world6, RemotePort: 80,
		Node: node6, NodePort: 63000, Created: maps.MonotonicNow() - 5e9}
	if err := n.l.Maps().NAT.NATMap().Upsert(dead); err != nil {
		t.Fatal(err)
	}
	for i, want := range []uint16{63001, 63000} {
		f := frame6(pod6, world6, protoTCP, uint16(42000+i), 80, 0)
		n.fromPod(f)
		ret, out := n.egress(f)
		if ret != 0 {
			t.Fatalf("flow %d: verdict %d", i, ret)
		}
		if src, _ := tuple6(out); src.Port() != want {
			t.Fatalf("flow %d got port %d, want %d", i, src.Port(), want)
		}
	}
	list, _ := n.l.Maps().NAT.NATMap().List()
	if len(list) != 2 {
		t.Fatalf("%d mappings, want the two new ones: %+v", len(list), list)
	}
	for _, m := range list {
		if m.Pod != pod6 || m.Orphan {
			t.Fatalf("mapping %+v: the dead one (or half of it) is left", m)
		}
	}
}
