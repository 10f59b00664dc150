package loader

import (
	"bytes"
	"net/netip"
	"testing"

	"github.com/tendril-net/tendril/pkg/datapath/maps"
)

// TestPrivilegedServiceHairpin: a pod reaching itself through a ClusterIP
// (its own address the only backend) per packet: its SYN comes back into
// it (redirect, the pod's MAC) from the hairpin address 169.254.42.1 to its
// own backend port, although its ingress is enforced with no rule (a pod's
// traffic with itself is not its policy's business); its SYN-ACK to the
// hairpin address comes back into it from the frontend, to its own
// address; checksums stay valid; later packets of the flow go the same
// way. A packet to the hairpin address that answers no translated flow is
// not rewritten.
func TestPrivilegedServiceHairpin(t *testing.T) {
	n := newTestNode(t)
	n.addDirectEndpoints()
	from, _ := n.l.Programs()
	fe := netip.MustParseAddrPort("10.96.0.60:80")
	self := netip.AddrPortFrom(podB, 8080)
	hairpin := netip.AddrPortFrom(netip.MustParseAddr("169.254.42.1"), 40000)
	n.lbService(tcpFE("10.96.0.60", 80), maps.Service{ID: 1, RevNATID: 1}, 1, self)

	check := func(what string, verdict uint32, out []byte, wantSrc, wantDst netip.AddrPort) {
		t.Helper()
		if verdict != actRedirect {
			t.Fatalf("%s = %d, want redirect back into the pod", what, verdict)
		}
		if src, dst := frameTuple(out); src != wantSrc || dst != wantDst {
			t.Errorf("%s: %s -> %s, want %s -> %s", what, src, dst, wantSrc, wantDst)
		}
		if !bytes.Equal(out[0:6], macB) || !bytes.Equal(out[6:12], hostMACB) {
			t.Errorf("%s: MACs %x -> %x, want the pod's", what, out[6:12], out[0:6])
		}
		checkChecksums(t, what, out)
	}
	verdict, out := n.runOut(from, n.ifidx2, withL4Checksum(packet(podB, fe.Addr(), l4{proto: 6, sport: 40000, dport: 80, tcpFlags: 0x02})))
	check("SYN to its own service", verdict, out, hairpin, self)
	verdict, out = n.runOut(from, n.ifidx2, withL4Checksum(packet(podB, hairpin.Addr(), l4{proto: 6, sport: 8080, dport: 40000, tcpFlags: 0x12})))
	check("SYN-ACK to the hairpin address", verdict, out, fe, netip.AddrPortFrom(podB, 40000))
	verdict, out = n.runOut(from, n.ifidx2, withL4Checksum(packet(podB, fe.Addr(), l4{proto: 6, sport: 40000, dport: 80, tcpFlags: 0x10, payload: []byte("data")})))
	check("established packet", verdict, out, hairpin, self)

	// No flow behind it: left to the host as any packet to a non-local
	// address.
	verdict, out = n.runOut(from, n.ifidx2, withL4Checksum(packet(podB, hairpin.Addr(), l4{proto: 6, sport: 8080, dport: 41000, tcpFlags: 0x12})))
	if _, dst := frameTuple(out); verdict == actRedirect || dst != netip.AddrPortFrom(hairpin.Addr(), 41000) {
		t.Errorf("packet to the hairpin address of no flow: verdict %d to %s, want it untouched", verdict, dst)
	}
}
