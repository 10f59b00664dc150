package hostdev

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/tendril-net/tendril/pkg/datapath/maps"
)

// Direct server return (--bpf-lb-mode=dsr, bpf/lib/nodeport_dsr.h) with
// BPF_PROG_TEST_RUN on the NodePort tests' node: as the node a client's
// request arrives at (the backend is the peer's pod) and as the backend's
// node (the backend is the local pod, the frontend the peer node's).

// dsrOpt is the option as the forwarding node writes it: type 0x9a,
// length 8, the frontend's port and address.
func dsrOpt(fe netip.AddrPort) []byte {
	o := []byte{0x9a, 8, 0, 0, 0, 0, 0, 0}
	binary.BigEndian.PutUint16(o[2:], fe.Port())
	a := fe.Addr().As4()
	copy(o[4:], a[:])
	return o
}

// loadDSR replaces the node's host programs by ones in dsr mode.
func (n *masqNode) loadDSR() {
	n.t.Helper()
	n.h.Close()
	h, err := Load(Options{BPFRoot: n.root, PortMin: 61000, PortMax: 61009, DSR: true, Maps: n.l.MapReplacements()}, nil)
	if err != nil {
		n.t.Fatal(err)
	}
	n.h = h
}

// ipLen is a frame's IPv4 header length.
func ipLen(f []byte) int { return int(f[14]&0xf) * 4 }

// trim drops the Ethernet padding after the IP packet.
func trim(f []byte) []byte { return f[:14+int(binary.BigEndian.Uint16(f[16:]))] }

// reframe fixes a frame's IPv4 total length, header checksum and L4
// checksum (and the UDP length) after its header or payload changed.
func reframe(f []byte) []byte {
	hl := ipLen(f)
	binary.BigEndian.PutUint16(f[16:], uint16(len(f)-14))
	f[24], f[25] = 0, 0
	binary.BigEndian.PutUint16(f[24:], ^sum16(0, f[14:14+hl]))
	l4 := f[14+hl:]
	off := csumOffset(f[23])
	if f[23] == protoUDP {
		binary.BigEndian.PutUint16(l4[4:], uint16(len(l4)))
	}
	l4[off], l4[off+1] = 0, 0
	binary.BigEndian.PutUint16(l4[off:], ^l4SumAt(f))
	return f
}

// withOption inserts an IPv4 option (a multiple of 4 bytes) first after
// the fixed header.
func withOption(f, opt []byte) []byte {
	f = trim(f)
	out := append(append(append([]byte{}, f[:34]...), opt...), f[34:]...)
	out[14] += byte(len(opt) / 4)
	return reframe(out)
}

// withTCPFlags sets a TCP frame's flags.
func withTCPFlags(f []byte, flags byte) []byte {
	f = append([]byte{}, trim(f)...)
	f[14+ipLen(f)+13] = flags
	return reframe(f)
}

// withPayload appends n bytes of payload.
func withPayload(f []byte, n int) []byte {
	return reframe(append(append([]byte{}, trim(f)...), make([]byte, n)...))
}

// l4SumAt is l4Sum for a header of any length.
func l4SumAt(f []byte) uint16 {
	hl := ipLen(f)
	total := int(binary.BigEndian.Uint16(f[16:]))
	seg := f[14+hl : 14+total]
	sum := uint32(sum16(0, f[26:34])) + uint32(f[23]) + uint32(len(seg))
	return sum16(sum, seg)
}

// checkSumsAt checks the IPv4 header and L4 checksums of a frame with
// options.
func checkSumsAt(t *testing.T, what string, f []byte) {
	t.Helper()
	if s := l4SumAt(f); s != 0xffff {
		t.Errorf("%s: L4 checksum wrong (sum %#x)", what, s)
	}
	if sum16(0, f[14:14+ipLen(f)]) != 0xffff {
		t.Errorf("%s: IPv4 header checksum wrong", what)
	}
}

// tupleAt is tuple for a header of any length (TCP, UDP).
func tupleAt(f []byte) (netip.AddrPort, netip.AddrPort) {
	l4 := 14 + ipLen(f)
	src, dst := netip.AddrFrom4([4]byte(f[26:30])), netip.AddrFrom4([4]byte(f[30:34]))
	return netip.AddrPortFrom(src, binary.BigEndian.Uint16(f[l4:])), netip.AddrPortFrom(dst, binary.BigEndian.Uint16(f[l4+2:]))
}

// dsrEntry reads the backend node's record of a DSR flow.
func (n *masqNode) dsrEntry(client, backend netip.AddrPort, proto uint8) (netip.AddrPort, bool) {
	n.t.Helper()
	list, err := n.l.Maps().NAT.DSRMap().List()
	if err != nil {
		n.t.Fatal(err)
	}
	for _, f := range list {
		if f.Proto == proto && netip.AddrPortFrom(f.Client, f.ClientPort) == client && netip.AddrPortFrom(f.Backend, f.BackendPort) == backend {
			if f.Created == 0 || f.Created > maps.MonotonicNow() {
				n.t.Fatalf("record %+v: creation time %d, want the datapath's clock at the packet", f, f.Created)
			}
			return netip.AddrPortFrom(f.Frontend, f.FrontendPort), true
		}
	}
	return netip.AddrPort{}, false
}

// TestPrivilegedNodePortDSRForward: in dsr mode a request to a node port
// whose backend is on the peer keeps the client's source; a TCP SYN and
// every UDP datagram carry the frontend in the option (header length,
// total length and both checksums right), a TCP flow's later segments go
// without it, all sent to the peer's MAC; no NAT mapping is made for
// them. A client inside the cluster goes the SNAT way.
func TestPrivilegedNodePortDSRForward(t *testing.T) {
	n := newNodePortNode(t)
	n.loadDSR()
	fe := ap(node, npRemote)
	for _, tc := range []struct {
		name   string
		frame  []byte
		option bool
	}{
		{"TCP SYN", frame(client, node, protoTCP, 40000, npRemote, 0), true},
		{"TCP ACK", withTCPFlags(frame(client, node, protoTCP, 40000, npRemote, 0), 0x10), false},
		{"TCP SYN again", frame(client, node, protoTCP, 40000, npRemote, 0), true},
		{"UDP", frame(client, node, protoUDP, 40000, npRemote, 0), true},
		{"UDP again", frame(client, node, protoUDP, 40000, npRemote, 0), true},
	} {
		in := trim(tc.frame)
		ret, out := n.ingress(tc.frame)
		if ret != 7 { // TC_ACT_REDIRECT
			t.Fatalf("%s: verdict %d, want redirect", tc.name, ret)
		}
		out = trim(out)
		checkSumsAt(t, tc.name, out)
		if src, dst := tupleAt(out); src != ap(client, 40000) || dst != ap(peerPod, backendPort) {
			t.Fatalf("%s: %s -> %s, want %s -> %s", tc.name, src, dst, ap(client, 40000), ap(peerPod, backendPort))
		}
		if !bytes.Equal(out[0:6], peerMAC) {
			t.Fatalf("%s: destination MAC %x, want the peer's %s", tc.name, out[0:6], peerMAC)
		}
		wantHL := 20
		if tc.option {
			wantHL = 28
		}
		if ipLen(out) != wantHL || len(out) != len(in)+wantHL-20 {
			t.Fatalf("%s: IP header %d bytes, frame %d bytes (in %d), want a %d-byte header", tc.name, ipLen(out), len(out), len(in), wantHL)
		}
		if tc.option && !bytes.Equal(out[34:42], dsrOpt(fe)) {
			t.Fatalf("%s: option % x, want % x", tc.name, out[34:42], dsrOpt(fe))
		}
		// The payload moved as a whole.
		l4hl := 8
		if in[23] == protoTCP {
			l4hl = 20
		}
		if !bytes.Equal(out[14+wantHL+l4hl:], in[34+l4hl:]) {
			t.Fatalf("%s: payload changed", tc.name)
		}
	}
	if list, _ := n.l.Maps().NAT.NATMap().List(); len(list) != 0 {
		t.Fatalf("NAT mappings %+v, want none for outside clients in dsr mode", list)
	}
	if got := n.metric(maps.ReasonNodeport, maps.DirIngress); got != 5 {
		t.Fatalf("translated packets %d, want 5", got)
	}
	// A client inside the cluster (here a pod of this node) goes the
	// SNAT way: the backend's reply to it may not leave its node by the
	// uplink.
	ret, out := n.ingress(frame(pod, node, protoTCP, 40003, npRemote, 0))
	if src, dst := tupleAt(out); ret != 7 || ipLen(out) != 20 || src.Addr() != node || !inRange(src.Port(), 61000, 61009) || dst != ap(peerPod, backendPort) {
		t.Fatalf("in-cluster client: verdict %d, %s -> %s (header %d), want SNAT to %s", ret, src, dst, ipLen(out), node)
	}
	// A local backend is no business of DSR: as in snat mode.
	ret, out = n.ingress(frame(client, node, protoTCP, 40001, npLocal, 0))
	if src, dst := tupleAt(out); ret != 0 || ipLen(out) != 20 || src != ap(client, 40001) || dst != ap(pod, backendPort) {
		t.Fatalf("local backend: verdict %d, %s -> %s, header %d", ret, src, dst, ipLen(out))
	}
}

// TestPrivilegedNodePortDSRMTU: where the option would exceed the route's
// MTU, a UDP datagram goes the SNAT way (node address and a masquerade
// port; the client still hears the frontend), a TCP SYN is dropped with
// its reason.
func TestPrivilegedNodePortDSRMTU(t *testing.T) {
	n := newNodePortNode(t)
	n.loadDSR()
	up, err := netlink.LinkByIndex(n.uplink)
	if err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetMTU(up, 1000); err != nil {
		t.Fatal(err)
	}
	// 1000 bytes of IP packet fit as they are, not with the option.
	udp := withPayload(frame(client, node, protoUDP, 40000, npRemote, 0), 1000-20-8-4)
	ret, out := n.ingress(udp)
	if ret != 7 {
		t.Fatalf("UDP at the MTU: verdict %d, want redirect", ret)
	}
	out = trim(out)
	checkSumsAt(t, "UDP at the MTU", out)
	if src, dst := tupleAt(out); ipLen(out) != 20 || src.Addr() != node || !inRange(src.Port(), 61000, 61009) || dst != ap(peerPod, backendPort) {
		t.Fatalf("UDP at the MTU: %s -> %s (header %d), want SNAT to %s", src, dst, ipLen(out), node)
	}
	// One byte less: DSR.
	ret, out = n.ingress(withPayload(frame(client, node, protoUDP, 40002, npRemote, 0), 1000-20-8-4-8))
	if src, _ := tupleAt(out); ret != 7 || ipLen(out) != 28 || src != ap(client, 40002) {
		t.Fatalf("UDP below the MTU: verdict %d, source %s, header %d, want DSR", ret, src, ipLen(out))
	}
	syn := withPayload(frame(client, node, protoTCP, 40001, npRemote, 0), 1000-20-20-4)
	if ret, _ := n.ingress(syn); ret != 2 {
		t.Fatalf("TCP SYN at the MTU: verdict %d, want drop", ret)
	}
	if got := n.metric(maps.ReasonDsrMtuExceeded, maps.DirIngress); got != 1 {
		t.Fatalf("drops for the MTU %d, want 1", got)
	}
}

// TestPrivilegedNodePortDSRBackend: on the backend's node a packet with
// the option for a local pod passes unchanged (the pod's policy sees the
// client) and its flow's frontend is recorded; the pod's reply leaves with
// the frontend as source, not masqueraded. A packet without the option,
// or with it for an address that is no local pod's, records nothing, and
// its reply is masqueraded as any pod traffic to the world.
func TestPrivilegedNodePortDSRBackend(t *testing.T) {
	n := newNodePortNode(t)
	n.loadDSR()
	fe := ap(peerNode, 30090)
	for _, proto := range []uint8{protoTCP, protoUDP} {
		in := withOption(frame(client, pod, proto, 40000, backendPort, 0), dsrOpt(fe))
		ret, out := n.ingress(in)
		if ret != 0 || !bytes.Equal(trim(out), in) {
			t.Fatalf("proto %d: verdict %d, changed %v: want it passed as is", proto, ret, !bytes.Equal(trim(out), in))
		}
		if got, ok := n.dsrEntry(ap(client, 40000), ap(pod, backendPort), proto); !ok || got != fe {
			t.Fatalf("proto %d: recorded frontend %s (%v), want %s", proto, got, ok, fe)
		}
		ret, out = n.egress(frame(pod, client, proto, backendPort, 40000, 0))
		if ret != 0 {
			t.Fatalf("proto %d reply: verdict %d", proto, ret)
		}
		checkSums(t, "reply", out)
		if src, dst := tuple(out); src != fe || dst != ap(client, 40000) {
			t.Fatalf("proto %d reply: %s -> %s, want %s -> %s", proto, src, dst, fe, ap(client, 40000))
		}
	}
	if list, _ := n.l.Maps().NAT.NATMap().List(); len(list) != 0 {
		t.Fatalf("NAT mappings %+v, want none: DSR replies are not masqueraded", list)
	}
	if got := n.metric(maps.ReasonNodeportReply, maps.DirEgress); got != 2 {
		t.Fatalf("DSR replies %d, want 2", got)
	}
	// No option: unchanged, nothing recorded, the reply masqueraded.
	plain := trim(frame(client2, pod, protoTCP, 40001, backendPort, 0))
	if ret, out := n.ingress(plain); ret != 0 || !bytes.Equal(trim(out), plain) {
		t.Fatalf("without the option: verdict %d or changed", ret)
	}
	if _, ok := n.dsrEntry(ap(client2, 40001), ap(pod, backendPort), protoTCP); ok {
		t.Fatal("a packet without the option was recorded")
	}
	if _, out := n.egress(frame(pod, client2, protoTCP, backendPort, 40001, 0)); func() bool { s, _ := tuple(out); return s.Addr() != node }() {
		s, _ := tuple(out)
		t.Fatalf("reply of a flow without the option left as %s, want masqueraded to %s", s, node)
	}
	// The option for an address no local pod has: not recorded.
	other := withOption(frame(client, peerPod, protoTCP, 40002, backendPort, 0), dsrOpt(fe))
	n.ingress(other)
	if _, ok := n.dsrEntry(ap(client, 40002), ap(peerPod, backendPort), protoTCP); ok {
		t.Fatal("the option for another node's pod was recorded")
	}
}

// TestPrivilegedNodePortDSROffInSNATMode: a node in snat mode honours no
// option (an outside sender could choose the source of a pod's replies):
// nothing recorded, the reply masqueraded.
func TestPrivilegedNodePortDSROffInSNATMode(t *testing.T) {
	n := newNodePortNode(t)
	in := withOption(frame(client, pod, protoTCP, 40000, backendPort, 0), dsrOpt(ap(peerNode, 30090)))
	if ret, out := n.ingress(in); ret != 0 || !bytes.Equal(trim(out), in) {
		t.Fatalf("verdict %d or changed", ret)
	}
	if _, ok := n.dsrEntry(ap(client, 40000), ap(pod, backendPort), protoTCP); ok {
		t.Fatal("snat mode recorded a DSR option")
	}
	if _, out := n.egress(frame(pod, client, protoTCP, backendPort, 40000, 0)); func() bool { s, _ := tuple(out); return s.Addr() != node }() {
		t.Fatal("reply not masqueraded in snat mode")
	}
}
