package nodemanager

import (
	"fmt"
	"net/netip"
	"testing"
)

// TestOwnAddresses: a node's address is taken as its own only if no one
// else owns it: not this node's, not claimed by a second node, not inside
// this node's or another node's pod CIDR (inside its own: its router IP),
// the cluster pool or the service CIDR, and a unicast address.
func TestOwnAddresses(t *testing.T) {
	r := Rules{
		Pools:    []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("fd00:10::/48")},
		Reserved: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12")},
		Local: func() ([]netip.Prefix, []netip.Addr) {
			return []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24")}, []netip.Addr{netip.MustParseAddr("192.168.1.1")}
		},
	}
	mk := func(name, cidr string, addrs ...string) *Peer {
		p := &Peer{Name: name, PodCIDRs: []netip.Prefix{netip.MustParsePrefix(cidr)}}
		for _, a := range addrs {
			p.IPs = append(p.IPs, netip.MustParseAddr(a))
		}
		return p
	}
	b := mk("b", "10.244.2.0/24", "192.168.1.2", "10.244.2.1", "192.168.1.2", "::ffff:192.168.1.20")
	c := mk("c", "10.244.3.0/24", "192.168.1.3", "192.168.1.9", "2001:db8::3")
	bad := mk("bad", "10.244.4.0/24",
		"192.168.1.1",  // this node's
		"192.168.1.9",  // c's too
		"10.244.1.5",   // this node's pods'
		"10.244.3.7",   // c's pods'
		"10.244.9.9",   // the pool's
		"fd00:10::1",   // the pool's (IPv6)
		"10.96.0.10",   // a service's
		"127.0.0.1",    // loopback
		"0.0.0.0",      // unspecified
		"224.0.0.1",    // multicast
		"169.254.0.1",  // link-local
		"fe80::1",      // link-local
		"192.168.1.44", // its own
	)
	own, refused := r.OwnAddresses([]*Peer{b, c, bad})
	for name, want := range map[string]string{
		"b":   "[192.168.1.2 10.244.2.1 192.168.1.20]",
		"c":   "[192.168.1.3 2001:db8::3]",
		"bad": "[192.168.1.44]",
	} {
		if got := fmt.Sprint(own[name]); got != want {
			t.Errorf("%s's own addresses %s, want %s", name, got, want)
		}
	}
	reasons := map[string]string{}
	for _, rj := range refused["bad"] {
		reasons[rj.Addr.String()] = rj.Reason
	}
	for addr, want := range map[string]string{
		"192.168.1.1": AddrReasonLocal, "192.168.1.9": AddrReasonShared, "10.244.1.5": AddrReasonPodCIDR,
		"10.244.3.7": AddrReasonPodCIDR, "10.244.9.9": AddrReasonPool, "fd00:10::1": AddrReasonPool,
		"10.96.0.10": AddrReasonService, "127.0.0.1": AddrReasonNotUnicast, "0.0.0.0": AddrReasonNotUnicast,
		"224.0.0.1": AddrReasonNotUnicast, "169.254.0.1": AddrReasonNotUnicast, "fe80::1": AddrReasonNotUnicast,
	} {
		if reasons[addr] != want {
			t.Errorf("bad's %s refused as %q, want %q", addr, reasons[addr], want)
		}
	}
	if len(refused["c"]) != 1 || refused["c"][0].Reason != AddrReasonShared {
		t.Errorf("c's refused %v, want the shared address only", refused["c"])
	}
	if len(refused["b"]) != 0 {
		t.Errorf("b's refused %v, want none", refused["b"])
	}
	// Without rules (no Kubernetes options): only what needs none.
	own, _ = Rules{}.OwnAddresses([]*Peer{bad})
	if got := fmt.Sprint(own["bad"]); got != "[192.168.1.1 192.168.1.9 10.244.1.5 10.244.3.7 10.244.9.9 fd00:10::1 10.96.0.10 192.168.1.44]" {
		t.Errorf("without rules: %s", got)
	}
}
