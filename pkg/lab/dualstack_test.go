package lab

import (
	"net/netip"
	"testing"
)

// TestNodeAddressing6: a dual-stack lab's node IPv6 addresses are valid,
// distinct, inside their gateway's /64 (flat: one /64 for every node;
// routed: one per node), for every node count lab up accepts.
func TestNodeAddressing6(t *testing.T) {
	for _, topology := range []string{TopologyFlat, TopologyRouted} {
		seen := map[netip.Addr]bool{}
		subnets := map[netip.Prefix]bool{}
		for i := 1; i <= 200; i++ {
			a, g := nodeAddressing6(topology, i)
			addr, err := netip.ParseAddr(a)
			if err != nil || !addr.Is6() {
				t.Fatalf("%s node %d: address %q: %v", topology, i, a, err)
			}
			gw, err := netip.ParseAddr(g)
			if err != nil || !gw.Is6() {
				t.Fatalf("%s node %d: gateway %q: %v", topology, i, g, err)
			}
			sub := netip.PrefixFrom(gw, NodeSubnet6Bits).Masked()
			if !sub.Contains(addr) || addr == gw {
				t.Fatalf("%s node %d: %s not a host of its gateway's %s", topology, i, addr, sub)
			}
			if seen[addr] {
				t.Fatalf("%s node %d: address %s given twice", topology, i, addr)
			}
			seen[addr] = true
			subnets[sub] = true
		}
		want := 1
		if topology == TopologyRouted {
			want = 200
		}
		if len(subnets) != want {
			t.Errorf("%s: %d IPv6 subnets for 200 nodes, want %d", topology, len(subnets), want)
		}
	}
	if a, g := nodeAddressing6(TopologyFlat, 1); a != "fd00:172:30::11" || g != WorldGateway6 {
		t.Errorf("flat node 1: %s via %s", a, g)
	}
	for _, f := range []string{"", IPFamilyIPv4, IPFamilyDual} {
		if err := ValidateIPFamily(f); err != nil {
			t.Errorf("%q refused: %v", f, err)
		}
	}
	if err := ValidateIPFamily("ipv6"); err == nil {
		t.Error("ip family ipv6 (single-stack IPv6) accepted")
	}
	for _, c := range []string{ClusterCIDR6, ServiceCIDR6} {
		if p, err := netip.ParsePrefix(c); err != nil || !p.Addr().Is6() || p != p.Masked() {
			t.Errorf("%s: not an IPv6 prefix (%v)", c, err)
		}
	}
}
