package hostdev

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/tendril-net/tendril/pkg/datapath/maps"
)

// Direct server return over IPv6 (bpf/lib/nodeport_dsr.h, the DSR
// extension header) with BPF_PROG_TEST_RUN on the IPv6 NodePort tests'
// node (newNodePort6Node): as the node a client's request arrives at and
// as the backend's node.

// dsrExt6 is the Destination Options header as the forwarding node writes
// it: next header next, length 2, option 0x1b of 20 bytes (the
// frontend's port, then its address), two Pad1 bytes.
func dsrExt6(next uint8, fe netip.AddrPort) []byte {
	x := []byte{next, 2, 0x1b, 20, 0, 0}
	x = binary.BigEndian.AppendUint16(x[:4], fe.Port())
	a := fe.Addr().As16()
	return append(append(x, a[:]...), 0, 0)
}

// trim6 drops the Ethernet padding after an IPv6 packet.
func trim6(f []byte) []byte { return f[:54+int(binary.BigEndian.Uint16(f[18:]))] }

// withExt6 inserts the DSR header for fe right after the fixed IPv6
// header of f (the L4 checksum needs no change).
func withExt6(f []byte, fe netip.AddrPort) []byte {
	f = trim6(f)
	out := append(append(append([]byte{}, f[:54]...), dsrExt6(f[20], fe)...), f[54:]...)
	out[20] = 60
	binary.BigEndian.PutUint16(out[18:], binary.BigEndian.Uint16(f[18:])+24)
	return out
}

// withPayload6 appends n bytes of payload, fixing the lengths and the L4
// checksum (no extension header).
func withPayload6(f []byte, n int) []byte {
	f = append(append([]byte{}, trim6(f)...), make([]byte, n)...)
	binary.BigEndian.PutUint16(f[18:], uint16(len(f)-54))
	off := 54 + csumOffset6(f[20])
	if f[20] == protoUDP {
		binary.BigEndian.PutUint16(f[58:], uint16(len(f)-54))
	}
	f[off], f[off+1] = 0, 0
	binary.BigEndian.PutUint16(f[off:], ^l4Sum6(f))
	return f
}

// ext6Len is the length of a frame's DSR extension header: 24, or 0 when
// its next header is not a Destination Options header.
func ext6Len(f []byte) int {
	if f[20] != 60 {
		return 0
	}
	return (int(f[55]) + 1) * 8
}

// l4Sum6At is l4Sum6 behind the DSR extension header, if any.
func l4Sum6At(f []byte) uint16 {
	x := ext6Len(f)
	proto := f[20]
	if x > 0 {
		proto = f[54]
	}
	n := int(binary.BigEndian.Uint16(f[18:])) - x
	seg := f[54+x : 54+x+n]
	sum := uint32(sum16(0, f[22:54])) + uint32(proto) + uint32(n)
	return sum16(sum, seg)
}

// tuple6At is tuple6 behind the DSR extension header, if any (TCP, UDP).
func tuple6At(f []byte) (netip.AddrPort, netip.AddrPort) {
	l4 := 54 + ext6Len(f)
	src, dst := netip.AddrFrom16([16]byte(f[22:38])), netip.AddrFrom16([16]byte(f[38:54]))
	return netip.AddrPortFrom(src, binary.BigEndian.Uint16(f[l4:])), netip.AddrPortFrom(dst, binary.BigEndian.Uint16(f[l4+2:]))
}

// TestPrivilegedNodePortDSRIPv6Forward: in dsr mode an IPv6 request to a
// node port whose backend is on the peer keeps the client's source and
// gets the backend as destination; a TCP SYN and every UDP datagram carry
// the frontend in the DSR extension header (next headers and payload
// length right, the L4 checksum right), a TCP flow's later segments go
// without it, all sent to the peer's MAC; no NAT mapping is made. A
// client inside the cluster goes the SNAT way, a local backend as in snat
// mode.
func TestPrivilegedNodePortDSRIPv6Forward(t *testing.T) {
	n := newNodePort6Node(t)
	n.loadDSR()
	fe := netip.AddrPortFrom(node6, npRemote)
	syn := frame6(client6, node6, protoTCP, 40000, npRemote, 0)
	ack := append([]byte{}, syn...)
	ack[54+13] = 0x10
	binary.BigEndian.PutUint16(ack[54+16:], 0)
	binary.BigEndian.PutUint16(ack[54+16:], ^l4Sum6(ack))
	for _, tc := range []struct {
		name  string
		frame []byte
		ext   bool
	}{
		{"TCP SYN", syn, true},
		{"TCP ACK", ack, false},
		{"UDP", frame6(client6, node6, protoUDP, 40000, npRemote, 0), true},
		{"UDP with payload", withPayload6(frame6(client6, node6, protoUDP, 40000, npRemote, 0), 301), true},
	} {
		in := trim6(tc.frame)
		ret, out := n.ingress(tc.frame)
		if ret != 7 { // TC_ACT_REDIRECT
			t.Fatalf("%s: verdict %d, want redirect", tc.name, ret)
		}
		out = trim6(out)
		if s := l4Sum6At(out); s != 0xffff {
			t.Errorf("%s: L4 checksum wrong (sum %#x)", tc.name, s)
		}
		if src, dst := tuple6At(out); src != netip.AddrPortFrom(client6, 40000) || dst != netip.AddrPortFrom(peerPod6, backendPort) {
			t.Fatalf("%s: %s -> %s, want %s -> %s", tc.name, src, dst, netip.AddrPortFrom(client6, 40000), netip.AddrPortFrom(peerPod6, backendPort))
		}
		if !bytes.Equal(out[0:6], peerMAC) {
			t.Fatalf("%s: destination MAC %x, want the peer's %s", tc.name, out[0:6], peerMAC)
		}
		want := 0
		if tc.ext {
			want = 24
		}
		if ext6Len(out) != want || len(out) != len(in)+want {
			t.Fatalf("%s: extension header %d bytes, frame %d bytes (in %d), want a %d-byte header", tc.name, ext6Len(out), len(out), len(in), want)
		}
		if tc.ext && !bytes.Equal(out[54:78], dsrExt6(in[20], fe)) {
			t.Fatalf("%s: extension header % x, want % x", tc.name, out[54:78], dsrExt6(in[20], fe))
		}
		if !tc.ext && out[20] != in[20] {
			t.Fatalf("%s: next header %d, want %d", tc.name, out[20], in[20])
		}
		// The L4 segment moved as a whole but for the destination port
		// and the checksum.
		l4 := in[54:]
		got := out[54+want:]
		off := csumOffset6(in[20])
		if len(got) != len(l4) || !bytes.Equal(got[:2], l4[:2]) || !bytes.Equal(got[4:off], l4[4:off]) || !bytes.Equal(got[off+2:], l4[off+2:]) {
			t.Fatalf("%s: L4 segment changed: % x, want % x", tc.name, got, l4)
		}
	}
	if list, _ := n.l.Maps().NAT.NATMap().List(); len(list) != 0 {
		t.Fatalf("NAT mappings %+v, want none for outside clients in dsr mode", list)
	}
	// A client inside the cluster (a pod of this node) goes the SNAT
	// way: the backend's reply to it may not leave its node by the
	// uplink.
	ret, out := n.ingress(frame6(pod6, node6, protoTCP, 40003, npRemote, 0))
	if src, dst := tuple6(out); ret != 7 || ext6Len(out) != 0 || src.Addr() != node6 || !inRange(src.Port(), 61000, 61009) || dst != netip.AddrPortFrom(peerPod6, backendPort) {
		t.Fatalf("in-cluster client: verdict %d, %s -> %s (ext %d), want SNAT to %s", ret, src, dst, ext6Len(out), node6)
	}
	// A local backend is no business of DSR.
	ret, out = n.ingress(frame6(client6, node6, protoTCP, 40001, npLocal, 0))
	if src, dst := tuple6(out); ret != 0 || ext6Len(out) != 0 || src != netip.AddrPortFrom(client6, 40001) || dst != netip.AddrPortFrom(pod6, backendPort) {
		t.Fatalf("local backend: verdict %d, %s -> %s, ext %d", ret, src, dst, ext6Len(out))
	}
}

// TestPrivilegedNodePortDSRIPv6MTU: where the extension header would
// exceed the route's MTU, a UDP datagram goes the SNAT way (delivered; the
// client still hears the frontend), a TCP SYN is answered with an ICMPv6
// Packet Too Big from the frontend announcing the MTU less the header,
// quoting the client's packet as it was sent (to the frontend), its
// checksum right, back to the MAC it came from; the SYN counts as a drop
// for the MTU.
func TestPrivilegedNodePortDSRIPv6MTU(t *testing.T) {
	n := newNodePort6Node(t)
	n.loadDSR()
	up, err := netlink.LinkByIndex(n.uplink)
	if err != nil {
		t.Fatal(err)
	}
	const mtu = 1300
	if err := netlink.LinkSetMTU(up, mtu); err != nil {
		t.Fatal(err)
	}
	// mtu bytes of IP packet fit as they are, not with the header.
	udp := withPayload6(frame6(client6, node6, protoUDP, 40000, npRemote, 0), mtu-40-8-4)
	ret, out := n.ingress(udp)
	if ret != 7 {
		t.Fatalf("UDP at the MTU: verdict %d, want redirect", ret)
	}
	out = trim6(out)
	checkSums6(t, "UDP at the MTU", out)
	if src, dst := tuple6(out); ext6Len(out) != 0 || src.Addr() != node6 || !inRange(src.Port(), 61000, 61009) || dst != netip.AddrPortFrom(peerPod6, backendPort) {
		t.Fatalf("UDP at the MTU: %s -> %s (ext %d), want SNAT to %s", src, dst, ext6Len(out), node6)
	}
	// 24 bytes less: DSR.
	ret, out = n.ingress(withPayload6(frame6(client6, node6, protoUDP, 40002, npRemote, 0), mtu-40-8-4-24))
	if src, _ := tuple6At(out); ret != 7 || ext6Len(out) != 24 || src != netip.AddrPortFrom(client6, 40002) {
		t.Fatalf("UDP below the MTU: verdict %d, source %s, ext %d, want DSR", ret, src, ext6Len(out))
	}
	syn := withPayload6(frame6(client6, node6, protoTCP, 40001, npRemote, 0), mtu-40-20-4)
	syn[0], syn[6] = 0x02, 0x02 // distinct MACs: the answer swaps them
	syn[5], syn[11] = 0xaa, 0xbb
	ret, out = n.ingress(syn)
	if ret != 7 {
		t.Fatalf("TCP SYN at the MTU: verdict %d, want a redirect (the Packet Too Big)", ret)
	}
	out = trim6(out)
	if out[20] != protoICMPv6 || out[54] != 2 || out[55] != 0 {
		t.Fatalf("TCP SYN at the MTU: answer next header %d, type %d code %d, want an ICMPv6 Packet Too Big", out[20], out[54], out[55])
	}
	if got := binary.BigEndian.Uint32(out[58:]); got != mtu-24 {
		t.Fatalf("Packet Too Big announces MTU %d, want %d", got, mtu-24)
	}
	if len(out)-14 > 1280 || len(out) < 14+48+40+20 {
		t.Fatalf("Packet Too Big of %d bytes, want the quoted headers within 1280", len(out)-14)
	}
	checkICMPError(t, "Packet Too Big", out, node6, client6, netip.AddrPortFrom(client6, 40001), netip.AddrPortFrom(node6, npRemote))
	if !bytes.Equal(out[0:6], syn[6:12]) || !bytes.Equal(out[6:12], syn[0:6]) {
		t.Fatalf("Packet Too Big MACs %x -> %x, want the SYN's swapped", out[6:12], out[0:6])
	}
	if got := n.metric(maps.ReasonDsrMtuExceeded, maps.DirIngress); got != 1 {
		t.Fatalf("drops for the MTU %d, want 1", got)
	}
}

// TestPrivilegedNodePortDSRIPv6Backend: on the backend's node an IPv6
// packet with the DSR header for a local pod loses the header (the pod
// gets the client's packet as the client sent it to the backend) and its
// flow's frontend is recorded; the pod's reply leaves with the frontend
// as source. A packet with the header for an address that is no local
// pod's passes unchanged and records nothing.
func TestPrivilegedNodePortDSRIPv6Backend(t *testing.T) {
	n := newNodePort6Node(t)
	n.loadDSR()
	fe := netip.AddrPortFrom(peerNode6, 30090)
	client := netip.AddrPortFrom(client6, 40000)
	backend := netip.AddrPortFrom(pod6, backendPort)
	for _, proto := range []uint8{protoTCP, protoUDP} {
		plain := trim6(frame6(client6, pod6, proto, 40000, backendPort, 0))
		ret, out := n.ingress(withExt6(plain, fe))
		if ret != 0 || !bytes.Equal(trim6(out), plain) {
			t.Fatalf("proto %d: verdict %d, stripped to the client's packet %v: want it", proto, ret, bytes.Equal(trim6(out), plain))
		}
		if got, ok := n.dsrEntry(client, backend, proto); !ok || got != fe {
			t.Fatalf("proto %d: recorded frontend %s (%v), want %s", proto, got, ok, fe)
		}
		ret, out = n.egress(frame6(pod6, client6, proto, backendPort, 40000, 0))
		if ret != 0 {
			t.Fatalf("proto %d reply: verdict %d", proto, ret)
		}
		checkSums6(t, "reply", out)
		if src, dst := tuple6(out); src != fe || dst != client {
			t.Fatalf("proto %d reply: %s -> %s, want %s -> %s", proto, src, dst, fe, client)
		}
	}
	if got := n.metric(maps.ReasonNodeportReply, maps.DirEgress); got != 2 {
		t.Fatalf("DSR replies %d, want 2", got)
	}
	// The header for an address no local pod has: unchanged, not
	// recorded.
	other := withExt6(frame6(client6, peerPod6, protoTCP, 40002, backendPort, 0), fe)
	if ret, out := n.ingress(other); ret != 0 || !bytes.Equal(trim6(out), other) {
		t.Fatalf("another node's pod: verdict %d or changed", ret)
	}
	if _, ok := n.dsrEntry(netip.AddrPortFrom(client6, 40002), netip.AddrPortFrom(peerPod6, backendPort), protoTCP); ok {
		t.Fatal("the header for another node's pod was recorded")
	}
}

// TestPrivilegedNodePortDSRIPv6OffInSNATMode: a node in snat mode honours
// no DSR header (an outside sender could choose the source of a pod's
// replies): the packet passes as it is, nothing is recorded, and an IPv6
// request to a remote backend is SNATed without the header.
func TestPrivilegedNodePortDSRIPv6OffInSNATMode(t *testing.T) {
	n := newNodePort6Node(t)
	in := withExt6(frame6(client6, pod6, protoTCP, 40000, backendPort, 0), netip.AddrPortFrom(peerNode6, 30090))
	if ret, out := n.ingress(in); ret != 0 || !bytes.Equal(trim6(out), in) {
		t.Fatalf("verdict %d or changed", ret)
	}
	if _, ok := n.dsrEntry(netip.AddrPortFrom(client6, 40000), netip.AddrPortFrom(pod6, backendPort), protoTCP); ok {
		t.Fatal("snat mode recorded a DSR header")
	}
	ret, out := n.ingress(frame6(client6, node6, protoTCP, 40001, npRemote, 0))
	if src, dst := tuple6(out); ret != 7 || ext6Len(out) != 0 || src.Addr() != node6 || dst != netip.AddrPortFrom(peerPod6, backendPort) {
		t.Fatalf("snat mode: verdict %d, %s -> %s (ext %d), want SNAT", ret, src, dst, ext6Len(out))
	}
}
