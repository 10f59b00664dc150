package hostdev

import (
	"bytes"
	"encoding/binary"
	"net"
	"net/netip"
	"os"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/tendril-net/tendril/pkg/datapath/maps"
)

// Services for clients outside the cluster over IPv6 (bpf/lib/nodeport.h)
// and ICMP errors about translated flows (bpf/lib/icmperr.h), with
// BPF_PROG_TEST_RUN on the node of nodeport_test.go given IPv6: the node's
// IPv6 address on its uplink, a route to the peer node's pod prefix through
// the peer's address (with a known MAC) and a default route.

var (
	client6   = netip.MustParseAddr("2001:db8::2")
	client6b  = netip.MustParseAddr("2001:db8:1::7")
	peerNode6 = netip.MustParseAddr("fd00:ff::12")
	lb6Addr   = netip.MustParseAddr("2001:db8:5::10")
	router    = netip.MustParseAddr("203.0.113.1")
	router6   = netip.MustParseAddr("2001:db8:ff::1")
)

// newNodePort6Node is newNodePortNode with IPv6 routes and the IPv6
// services: the same node ports on node6, and a load-balancer address with
// source ranges.
func newNodePort6Node(t testing.TB) *masqNode {
	n := newNodePortNode(t)
	if err := os.WriteFile("/proc/sys/net/ipv6/conf/all/forwarding", []byte("1"), 0o644); err != nil {
		t.Fatal(err)
	}
	up, err := netlink.LinkByIndex(n.uplink)
	if err != nil {
		t.Fatal(err)
	}
	// No duplicate address detection: the address is usable at once.
	if err := netlink.AddrAdd(up, &netlink.Addr{IPNet: &net.IPNet{IP: node6.AsSlice(), Mask: net.CIDRMask(64, 128)}, Flags: unix.IFA_F_NODAD}); err != nil {
		t.Fatal(err)
	}
	if err := netlink.RouteAdd(&netlink.Route{LinkIndex: n.uplink, Dst: &net.IPNet{IP: net.ParseIP("fd00:10:1::"), Mask: net.CIDRMask(64, 128)}, Gw: peerNode6.AsSlice()}); err != nil {
		t.Fatal(err)
	}
	if err := netlink.NeighAdd(&netlink.Neigh{LinkIndex: n.uplink, Family: netlink.FAMILY_V6, State: netlink.NUD_PERMANENT, IP: peerNode6.AsSlice(), HardwareAddr: peerMAC}); err != nil {
		t.Fatal(err)
	}
	// The world through a gateway whose MAC is not known yet.
	if err := netlink.RouteAdd(&netlink.Route{LinkIndex: n.uplink, Dst: &net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}, Gw: net.ParseIP("fd00:ff::1")}); err != nil {
		t.Fatal(err)
	}
	lb := n.l.Maps().LB
	for id, addr := range map[uint32]netip.Addr{11: pod6, 12: peerPod6} {
		if err := lb.BackendMap().Upsert(id, maps.Backend{Addr: addr, Port: backendPort}); err != nil {
			t.Fatal(err)
		}
	}
	ext := maps.SvcFlagExternal
	for _, s := range []struct {
		fe       maps.Frontend
		svc      maps.Service
		backends []uint32
	}{
		{maps.Frontend{Addr: node6, Port: npLocal, Proto: protoTCP}, maps.Service{ID: 11, RevNATID: 11, Flags: ext}, []uint32{11}},
		{maps.Frontend{Addr: node6, Port: npRemote, Proto: protoTCP}, maps.Service{ID: 12, RevNATID: 12, Flags: ext}, []uint32{12}},
		{maps.Frontend{Addr: node6, Port: npRemote, Proto: protoUDP}, maps.Service{ID: 13, RevNATID: 13, Flags: ext}, []uint32{12}},
		{maps.Frontend{Addr: node6, Port: npETPNone, Proto: protoTCP}, maps.Service{ID: 14, RevNATID: 14, Flags: ext | maps.SvcFlagExtLocal}, []uint32{12}},
		{maps.Frontend{Addr: node6, Port: npETPLocal, Proto: protoTCP}, maps.Service{ID: 15, RevNATID: 15, Flags: ext | maps.SvcFlagExtLocal, LocalCount: 1}, []uint32{11, 12, 11}},
		{maps.Frontend{Addr: lb6Addr, Port: 80, Proto: protoTCP}, maps.Service{ID: 16, RevNATID: 16, Flags: ext | maps.SvcFlagSourceRanges}, []uint32{11}},
	} {
		if err := lb.ApplyService(s.fe, s.svc, s.backends, 0); err != nil {
			t.Fatal(err)
		}
	}
	if err := lb.SrcRangeMap().Set(16, []netip.Prefix{netip.MustParsePrefix("2001:db8::/64")}, nil); err != nil {
		t.Fatal(err)
	}
	return n
}

func checkSums6(t *testing.T, what string, f []byte) {
	t.Helper()
	if s := l4Sum6(f); s != 0xffff {
		t.Errorf("%s: L4 checksum wrong (sum %#x)", what, s)
	}
}

// TestPrivilegedNodePortIPv6LocalBackend: a client's packet to a node port
// on the node's IPv6 address whose backend is on this node is DNATed to
// the pod, its source kept; the conntrack entry carries the reverse NAT
// ID; the pod's reply leaving the uplink gets the node port as source
// instead of masquerade.
func TestPrivilegedNodePortIPv6LocalBackend(t *testing.T) {
	checkNodePortLocalBackend(t, newNodePort6Node(t), famV6)
}

// TestPrivilegedNodePortIPv6RemoteBackend: to a backend on another node
// the packet leaves with the node's IPv6 address and a port of the
// masquerade range, sent to the peer (FIB: its MAC); the backend's reply
// gets the client as destination and the node port as source; TCP and
// UDP; the mappings are in the IPv6 NAT table flagged as the service's.
func TestPrivilegedNodePortIPv6RemoteBackend(t *testing.T) {
	checkNodePortRemoteBackend(t, newNodePort6Node(t), famV6)
}

// TestPrivilegedNodePortIPv6ExternalLocal: externalTrafficPolicy Local
// sends IPv6 clients only to this node's backend, source kept; a node
// without one drops them with their reason.
func TestPrivilegedNodePortIPv6ExternalLocal(t *testing.T) {
	checkNodePortExternalLocal(t, newNodePort6Node(t), famV6)
}

// TestPrivilegedNodePortIPv6SourceRanges: an IPv6 load-balancer address
// with source ranges admits a client inside them and drops one outside
// with its reason.
func TestPrivilegedNodePortIPv6SourceRanges(t *testing.T) {
	checkNodePortSourceRanges(t, newNodePort6Node(t), famV6)
}

// TestPrivilegedNodePortIPv6Off: with --enable-node-port=false (the
// programs attached for masquerade only) a request from outside to a node
// port on the node's IPv6 address is left to the host untouched, as over
// IPv4 (TestPrivilegedNodePortWithoutMasquerade), and no flow is recorded
// for it; the same requests are translated with node ports on.
func TestPrivilegedNodePortIPv6Off(t *testing.T) {
	n := newNodePort6Node(t)
	reqs := [][]byte{
		frame6(client6, node6, protoTCP, 40000, npLocal, 0),
		frame6(client6, node6, protoTCP, 40001, npRemote, 0),
		frame6(client6, node6, protoUDP, 40002, npRemote, 0),
	}
	if ret, out := n.ingress(reqs[0]); ret != 0 || bytes.Equal(out[:len(reqs[0])], reqs[0]) {
		t.Fatalf("node port on: verdict %d, translated %v: want it translated", ret, !bytes.Equal(out[:len(reqs[0])], reqs[0]))
	}

	n.h.Close()
	var err error
	n.h, err = Load(Options{BPFRoot: n.root, PortMin: 61000, PortMax: 61009, NoNodePort: true, Maps: n.l.MapReplacements()}, nil)
	if err != nil {
		t.Fatal(err)
	}
	flows := n.l.MapReplacements()["tdr_lb6_flows_v1"]
	if flows == nil {
		t.Fatal("no tdr_lb6_flows_v1 among the loaded maps")
	}
	before := mapEntries(t, flows)
	for _, f := range reqs[1:] {
		if ret, out := n.ingress(f); ret != 0 || !bytes.Equal(out[:len(f)], f) {
			src, dst := tuple6(out)
			t.Errorf("node port with --enable-node-port=false: verdict %d, changed %v (%s -> %s): want it untouched", ret, !bytes.Equal(out[:len(f)], f), src, dst)
		}
	}
	if after := mapEntries(t, flows); after != before {
		t.Errorf("node port with --enable-node-port=false: %d IPv6 flows recorded, want none", after-before)
	}
}

// mapEntries counts the entries of m.
func mapEntries(t *testing.T, m *ebpf.Map) int {
	t.Helper()
	var (
		k, v []byte
		n    int
	)
	it := m.Iterate()
	for it.Next(&k, &v) {
		n++
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	return n
}

// icmpError6 builds an ICMPv6 error of type typ (1 unreachable, 2 packet
// too big, 3 time exceeded) from src to dst quoting the IPv6 packet of
// frame q, its checksum right.
func icmpError6(src, dst netip.Addr, typ uint8, q []byte) []byte {
	quoted := q[14:]
	icmp := append([]byte{typ, 0, 0, 0, 0, 0, 0x05, 0x00}, quoted...) // MTU 1280 for "packet too big"
	ip := make([]byte, 40)
	ip[0] = 0x60
	binary.BigEndian.PutUint16(ip[4:], uint16(len(icmp)))
	ip[6] = protoICMPv6
	ip[7] = 64
	s, d := src.As16(), dst.As16()
	copy(ip[8:], s[:])
	copy(ip[24:], d[:])
	eth := make([]byte, 14)
	binary.BigEndian.PutUint16(eth[12:], 0x86DD)
	f := append(append(eth, ip...), icmp...)
	binary.BigEndian.PutUint16(f[56:], ^l4Sum6(f))
	return f
}

// quoted6 is the tuple an ICMPv6 error frame quotes (TCP/UDP).
func quoted6(f []byte) (netip.AddrPort, netip.AddrPort) {
	in := f[14+40+8:]
	src, dst := netip.AddrFrom16([16]byte(in[8:24])), netip.AddrFrom16([16]byte(in[24:40]))
	return netip.AddrPortFrom(src, binary.BigEndian.Uint16(in[40:])), netip.AddrPortFrom(dst, binary.BigEndian.Uint16(in[42:]))
}

// quoted4 is the tuple an ICMP error frame quotes (TCP/UDP).
func quoted4(f []byte) (netip.AddrPort, netip.AddrPort) {
	in := f[14+20+8:]
	ihl := int(in[0]&0xf) * 4
	src, dst := netip.AddrFrom4([4]byte(in[12:16])), netip.AddrFrom4([4]byte(in[16:20]))
	return netip.AddrPortFrom(src, binary.BigEndian.Uint16(in[ihl:])), netip.AddrPortFrom(dst, binary.BigEndian.Uint16(in[ihl+2:]))
}

func outer6(f []byte) (netip.Addr, netip.Addr) {
	return netip.AddrFrom16([16]byte(f[22:38])), netip.AddrFrom16([16]byte(f[38:54]))
}

func outer4(f []byte) (netip.Addr, netip.Addr) {
	return netip.AddrFrom4([4]byte(f[26:30])), netip.AddrFrom4([4]byte(f[30:34]))
}

// checkICMPError checks an ICMP or ICMPv6 error frame (the family of
// src): its outer addresses src -> dst, the tuple it quotes qs -> qd, and
// its checksums.
func checkICMPError(t *testing.T, what string, f []byte, src, dst netip.Addr, qs, qd netip.AddrPort) {
	t.Helper()
	outer, quoted, sums := outer4, quoted4, checkICMP4
	if src.Is6() {
		outer, quoted, sums = outer6, quoted6, checkSums6
	}
	if s, d := outer(f); s != src || d != dst {
		t.Fatalf("%s: %s -> %s, want %s -> %s", what, s, d, src, dst)
	}
	if s, d := quoted(f); s != qs || d != qd {
		t.Fatalf("%s: quotes %s -> %s, want %s -> %s", what, s, d, qs, qd)
	}
	sums(t, what, f)
}

// checkICMP4 checks an ICMP error frame's checksums: the outer and quoted
// IPv4 headers' and the ICMP message's.
func checkICMP4(t *testing.T, what string, f []byte) {
	t.Helper()
	if sum16(0, f[14:34]) != 0xffff || sum16(0, f[42:62]) != 0xffff {
		t.Errorf("%s: outer or quoted IPv4 header checksum wrong", what)
	}
	if sum16(0, f[34:]) != 0xffff {
		t.Errorf("%s: ICMP checksum wrong", what)
	}
}

// TestPrivilegedMasqueradeICMPv6Errors: an ICMPv6 "packet too big" about a
// masqueraded IPv6 flow reaches the pod quoting the pod's own tuple, its
// checksum right; one about no mapping passes untouched.
func TestPrivilegedMasqueradeICMPv6Errors(t *testing.T) {
	n := newMasqNode(t, 61000, 61999)
	out := frame6(pod6, world6, protoUDP, 40001, 53, 0)
	n.fromPod(out)
	_, left := n.egress(out)
	ret, got := n.ingress(icmpError6(router6, node6, 2, left))
	if ret != 0 {
		t.Fatalf("verdict %d", ret)
	}
	checkICMPError(t, "ICMPv6 error", got, router6, pod6, ap(pod6, 40001), ap(world6, 53))
	if got := n.metric(maps.ReasonMasqReply, maps.DirIngress); got != 1 {
		t.Fatalf("masquerade replies counted %d, want 1", got)
	}
	stray := frame6(node6, world6, protoUDP, 61999, 53, 0)
	e := icmpError6(router6, node6, 1, stray)
	if ret, g := n.ingress(e); ret != 0 || !bytes.Equal(g, e) {
		t.Fatalf("error about no mapping: verdict %d, changed %v", ret, !bytes.Equal(g, e))
	}
}

// TestPrivilegedNodePortICMPErrors: ICMP and ICMPv6 errors about service
// flows from outside. About the packet sent on to a remote backend (from
// the node's address and a masquerade port): sent back to the client,
// from the frontend, quoting the client's packet to the frontend. About a
// remote backend's reply (from the frontend to the client): sent to the
// backend, from the node, quoting the reply as the backend sent it. About
// a local backend's reply: delivered to the pod, quoting the pod's own
// reply. Every checksum right; counted.
func TestPrivilegedNodePortICMPErrors(t *testing.T) {
	n := newNodePort6Node(t)

	// IPv4, remote backend: the backend's node says port unreachable.
	ret, fwd := n.ingress(frame(client, node, protoUDP, 40000, npRemote, 0))
	if ret != 7 {
		t.Fatalf("IPv4 to the remote backend: verdict %d", ret)
	}
	ret, got := n.ingress(icmpError(peerPod, node, fwd))
	if ret != 7 {
		t.Fatalf("IPv4 error about the remote backend's flow: verdict %d, want redirect to the client", ret)
	}
	checkICMPError(t, "IPv4 error to the client", got, node, client, ap(client, 40000), ap(node, npRemote))

	// IPv4, the remote backend's reply (sent to the client from the node
	// port): a router on the client's path says it does not fit; the
	// backend gets the error about its reply as it sent it.
	fwdSrc, _ := tuple(fwd)
	ret, reply := n.ingress(frame(peerPod, node, protoUDP, backendPort, fwdSrc.Port(), 0))
	if s, d := tuple(reply); ret != 7 || s != ap(node, npRemote) || d != ap(client, 40000) {
		t.Fatalf("IPv4 remote backend's reply: verdict %d, %s -> %s", ret, s, d)
	}
	ret, got = n.ingress(icmpError(router, node, reply))
	if ret != 7 {
		t.Fatalf("IPv4 error about the remote backend's reply: verdict %d, want redirect to the backend", ret)
	}
	checkICMPError(t, "IPv4 error to the remote backend", got, node, peerPod, ap(peerPod, backendPort), fwdSrc)
	if !bytes.Equal(got[0:6], peerMAC) {
		t.Fatalf("IPv4 error to the backend: destination MAC %x, want the peer's %s", got[0:6], peerMAC)
	}

	// IPv4, local backend: a router on the client's path says its reply
	// does not fit.
	n.ingress(frame(client, node, protoTCP, 40001, npLocal, 0))
	ret, reply = n.egress(frame(pod, client, protoTCP, backendPort, 40001, 0))
	if s, _ := tuple(reply); ret != 0 || s != ap(node, npLocal) {
		t.Fatalf("IPv4 local backend's reply: verdict %d, from %s", ret, s)
	}
	ret, got = n.ingress(icmpError(router, node, reply))
	if ret != 0 {
		t.Fatalf("IPv4 error about the local backend's reply: verdict %d", ret)
	}
	checkICMPError(t, "IPv4 error to the pod", got, router, pod, ap(pod, backendPort), ap(client, 40001))

	// IPv6, remote backend.
	ret, fwd = n.ingress(frame6(client6, node6, protoUDP, 40000, npRemote, 0))
	if ret != 7 {
		t.Fatalf("IPv6 to the remote backend: verdict %d", ret)
	}
	ret, got = n.ingress(icmpError6(peerPod6, node6, 1, fwd))
	if ret != 7 {
		t.Fatalf("IPv6 error about the remote backend's flow: verdict %d, want redirect to the client", ret)
	}
	checkICMPError(t, "IPv6 error to the client", got, node6, client6, ap(client6, 40000), ap(node6, npRemote))

	// IPv6, the remote backend's reply: packet too big.
	fwdSrc6, _ := tuple6(fwd)
	ret, reply = n.ingress(frame6(peerPod6, node6, protoUDP, backendPort, fwdSrc6.Port(), 0))
	if s, d := tuple6(reply); ret != 7 || s != ap(node6, npRemote) || d != ap(client6, 40000) {
		t.Fatalf("IPv6 remote backend's reply: verdict %d, %s -> %s", ret, s, d)
	}
	ret, got = n.ingress(icmpError6(router6, node6, 2, reply))
	if ret != 7 {
		t.Fatalf("IPv6 error about the remote backend's reply: verdict %d, want redirect to the backend", ret)
	}
	checkICMPError(t, "IPv6 error to the remote backend", got, node6, peerPod6, ap(peerPod6, backendPort), fwdSrc6)

	// IPv6, local backend: packet too big.
	n.ingress(frame6(client6, node6, protoTCP, 40001, npLocal, 0))
	ret, reply = n.egress(frame6(pod6, client6, protoTCP, backendPort, 40001, 0))
	if s, _ := tuple6(reply); ret != 0 || s != ap(node6, npLocal) {
		t.Fatalf("IPv6 local backend's reply: verdict %d, from %s", ret, s)
	}
	ret, got = n.ingress(icmpError6(router6, node6, 2, reply))
	if ret != 0 {
		t.Fatalf("IPv6 error about the local backend's reply: verdict %d", ret)
	}
	checkICMPError(t, "IPv6 error to the pod", got, router6, pod6, ap(pod6, backendPort), ap(client6, 40001))

	if got := n.metric(maps.ReasonNodeportICMPError, maps.DirIngress); got != 6 {
		t.Fatalf("service ICMP errors counted %d, want 6", got)
	}
	// An error about a flow of no service (nor masquerade): untouched.
	e := icmpError6(router6, node6, 1, frame6(node6, client6, protoTCP, 30999, 40000, 0))
	if ret, g := n.ingress(e); ret != 0 || !bytes.Equal(g, e) {
		t.Fatalf("error about no service flow: verdict %d, changed %v", ret, !bytes.Equal(g, e))
	}
}

// TestPrivilegedNodePortBackendICMPErrors: an ICMP or ICMPv6 error a local
// backend sends to an outside client about the client's packet (as DNATed
// to it) leaves from the frontend, quoting the client's packet to the
// frontend, checksums right, counted; an error from the pod about a flow
// this node did not translate leaves untouched.
func TestPrivilegedNodePortBackendICMPErrors(t *testing.T) {
	n := newNodePort6Node(t)
	ret, in := n.ingress(frame(client, node, protoTCP, 40002, npLocal, 0))
	if ret != 0 {
		t.Fatalf("IPv4 to the local backend: verdict %d", ret)
	}
	ret, got := n.egress(icmpError(pod, client, in))
	if ret != 0 {
		t.Fatalf("IPv4 error from the backend: verdict %d", ret)
	}
	checkICMPError(t, "IPv4 error from the backend", got, node, client, ap(client, 40002), ap(node, npLocal))

	ret, in = n.ingress(frame6(client6, node6, protoTCP, 40002, npLocal, 0))
	if ret != 0 {
		t.Fatalf("IPv6 to the local backend: verdict %d", ret)
	}
	ret, got = n.egress(icmpError6(pod6, client6, 1, in))
	if ret != 0 {
		t.Fatalf("IPv6 error from the backend: verdict %d", ret)
	}
	checkICMPError(t, "IPv6 error from the backend", got, node6, client6, ap(client6, 40002), ap(node6, npLocal))
	if got := n.metric(maps.ReasonNodeportICMPError, maps.DirEgress); got != 2 {
		t.Fatalf("backend ICMP errors counted %d, want 2", got)
	}

	// About a packet of no translated flow (the client reached the pod's
	// own address): untouched.
	e := icmpError6(pod6, client6, 1, frame6(client6, pod6, protoTCP, 40003, backendPort, 0))
	if ret, g := n.egress(e); ret != 0 || !bytes.Equal(g, e) {
		t.Fatalf("error about no translated flow: verdict %d, changed %v", ret, !bytes.Equal(g, e))
	}
}
