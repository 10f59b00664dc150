package tunnel

import (
	"bytes"
	"encoding/binary"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/tendril-net/tendril/pkg/datapath/bpf"
	"github.com/tendril-net/tendril/pkg/datapath/maps"
)

const (
	tcActShot   = 2
	genevePort  = 6081
	geneveEncap = 20 + 8 + 8 + 14 // outer IPv4, UDP, Geneve, inner Ethernet
)

// newGeneveNode is a bench node (pod A, the uplink with the host
// programs) in Geneve-in-eBPF mode: the uplink has the node's address
// (192.168.50.1/24, so the FIB routes the peer node 192.168.50.2 out of
// it), forwarding is on (the FIB lookup from a pod's ingress is a
// forwarding one), from_geneve sits in the host programs' tail-call slot
// and tdr_tunnel_v1 has TUNNEL_F_GENEVE_BPF.
func newGeneveNode(t testing.TB) *benchNode {
	t.Helper()
	n := newBenchNode(t, false)
	up, err := netlink.LinkByIndex(n.uplink)
	if err != nil {
		t.Fatal(err)
	}
	a, _ := netlink.ParseAddr(nodeAddr.String() + "/24")
	if err := netlink.AddrAdd(up, a); err != nil {
		t.Fatal(err)
	}
	// /proc/sys/net is the opening thread's namespace: the test's, locked.
	if err := os.WriteFile("/proc/sys/net/ipv4/conf/all/forwarding", []byte("1"), 0o644); err != nil {
		t.Fatal(err)
	}
	if n.overlay, err = Load(n.l.MapReplacements(), "", false); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.overlay.Close() })
	r := n.l.MapReplacements()
	if err := SetGeneveBPF(r[bpf.OverlayMapTdrTunnelV1], r[bpf.OverlayMapTdrOverlayCallsV1], n.overlay); err != nil {
		t.Fatal(err)
	}
	return n
}

// runOut runs prog on pkt as if it came in on ifindex: the verdict and
// the packet as the program left it.
func runOut(t testing.TB, prog *ebpf.Program, ifindex int, pkt []byte) (uint32, []byte) {
	t.Helper()
	var ctx struct{ Fields [11]uint32 }
	ctx.Fields[10] = uint32(ifindex)
	out := make([]byte, len(pkt)+256)
	opts := &ebpf.RunOptions{Data: pkt, DataOut: out, Context: ctx}
	ret, err := prog.Run(opts)
	if err != nil {
		t.Fatal(err)
	}
	return ret, opts.DataOut
}

// geneveFrame is the Geneve packet (IPv4 underlay, UDP 6081, VNI vni,
// with opts as its options) from src to dst carrying inner (an Ethernet
// frame).
func geneveFrame(src, dst netip.Addr, vni uint32, opts []byte, inner []byte) []byte {
	udp := make([]byte, 8+8, 8+8+len(opts)+len(inner))
	binary.BigEndian.PutUint16(udp[0:], 51234)
	binary.BigEndian.PutUint16(udp[2:], genevePort)
	binary.BigEndian.PutUint16(udp[4:], uint16(8+8+len(opts)+len(inner)))
	udp[8] = byte(len(opts) / 4)
	binary.BigEndian.PutUint16(udp[10:], 0x6558)
	binary.BigEndian.PutUint32(udp[12:], vni<<8)
	udp = append(append(udp, opts...), inner...)
	return append(ipHeader(src, dst, 17, 64, len(udp)), udp...)
}

func ipv4Checksum(h []byte) uint16 {
	var s uint32
	for i := 0; i < len(h); i += 2 {
		s += uint32(binary.BigEndian.Uint16(h[i:]))
	}
	for s>>16 != 0 {
		s = s&0xffff + s>>16
	}
	return ^uint16(s)
}

// TestPrivilegedGeneveBPF runs Geneve built and stripped in eBPF
// (bpf/lib/geneve.h) under BPF_PROG_TEST_RUN, IPv4 and IPv6 inside:
//   - from_pod on pod A's packet for another node's pod redirects it with
//     outer Ethernet/IPv4 (the node's address to the owner node, a valid
//     header checksum, TTL 64)/UDP 6081/Geneve (version 0, Ethernet
//     inside, A's identity as the VNI) pushed in front of the pod's own
//     frame, unchanged;
//   - from_netdev on the owner node's Geneve packet to pod A strips it to
//     the inner IP packet behind the outer Ethernet header (its type the
//     inner's) and from_geneve (tail call) delivers it into the pod
//     (redirect), options skipped;
//   - dropped: Geneve from an address of no node (counted as such), an
//     inner source of this node's own pod, a critical option of no known
//     type, and with the tail-call slot empty.
func TestPrivilegedGeneveBPF(t *testing.T) {
	n := newGeneveNode(t)
	for _, f := range benchFamilies {
		// No t.Run: the test's goroutine is the one locked in the
		// namespace the context's ifindex is resolved in.
		func() {
			in := tcpFrame(f.pod, f.remote, 40000, benchPort)
			v, out := runOut(t, n.fromPod, n.ifA, in)
			if v != tcActRedirect {
				t.Fatalf(f.name+": from_pod verdict %d, want redirect (%d)", v, tcActRedirect)
			}
			if len(out) != len(in)+geneveEncap {
				t.Fatalf("encapsulated %d bytes, want %d + %d", len(out), len(in), geneveEncap)
			}
			if et := binary.BigEndian.Uint16(out[12:]); et != 0x0800 {
				t.Errorf("outer Ethernet type %#x, want IPv4", et)
			}
			ip := out[14:34]
			src, _ := netip.AddrFromSlice(ip[12:16])
			dst, _ := netip.AddrFromSlice(ip[16:20])
			if ip[0] != 0x45 || ip[9] != 17 || ip[8] != 64 || src != nodeAddr || dst != peerNode ||
				int(binary.BigEndian.Uint16(ip[2:])) != len(out)-14 || ipv4Checksum(ip) != 0 {
				t.Errorf("outer IPv4 header % x: want 45, UDP, TTL 64, %s -> %s, length %d, a valid checksum", ip, nodeAddr, peerNode, len(out)-14)
			}
			udp := out[34:42]
			if binary.BigEndian.Uint16(udp[2:]) != genevePort || int(binary.BigEndian.Uint16(udp[4:])) != len(out)-34 ||
				binary.BigEndian.Uint16(udp[0:]) < 49152 {
				t.Errorf("outer UDP header % x: want an ephemeral source port, to %d, length %d", udp, genevePort, len(out)-34)
			}
			g := out[42:50]
			if g[0] != 0 || g[1] != 0 || binary.BigEndian.Uint16(g[2:]) != 0x6558 || binary.BigEndian.Uint32(g[4:])>>8 != idA {
				t.Errorf("Geneve header % x: want version 0, no options, Ethernet inside, VNI %d", g, idA)
			}
			if !bytes.Equal(out[50:], in) {
				t.Errorf("inner frame changed:\n got % x\nwant % x", out[50:], in)
			}
		}()
		func() {
			inner := tcpFrame(f.remote, f.pod, benchPort, 40000)
			// An option of some class (not critical): skipped.
			opt := []byte{0x01, 0x4b, 0x7f, 0x01, 1, 2, 3, 4}
			pkt := geneveFrame(peerNode, nodeAddr, idRemote, opt, inner)
			v, out := runOut(t, n.fromNetdev, n.uplink, pkt)
			if v != tcActRedirect {
				t.Fatalf(f.name+": from_netdev verdict %d, want redirect into the pod (%d)", v, tcActRedirect)
			}
			// The addresses are the pod's (direct delivery sets them).
			if !bytes.Equal(out[12:14], inner[12:14]) {
				t.Errorf("Ethernet header % x, want the inner packet's type % x", out[:14], inner[12:14])
			}
			// from_geneve's direct delivery takes one off the TTL or hop
			// limit and fixes the checksum: the rest is the inner packet.
			got, want := append([]byte(nil), out[14:]...), append([]byte(nil), inner[14:]...)
			if f.pod.Is4() {
				got[8], got[10], got[11], want[10], want[11] = want[8], 0, 0, 0, 0
			} else {
				got[7] = want[7]
			}
			if !bytes.Equal(got, want) {
				t.Errorf("decapsulated packet:\n got % x\nwant % x", out[14:], inner[14:])
			}
		}()
	}
	{
		notANode := n.counter(30, maps.DirIngress) // REASON_TUNNEL_NOT_A_NODE
		before := notANode()
		stranger := netip.MustParseAddr("192.168.50.9")
		if v, _ := runOut(t, n.fromNetdev, n.uplink, geneveFrame(stranger, nodeAddr, idRemote, nil, tcpFrame(remotePod, podA, benchPort, 40000))); v != tcActShot {
			t.Errorf("Geneve from %s (no node): verdict %d, want drop", stranger, v)
		}
		if notANode() != before+1 {
			t.Errorf("Geneve from no node: counted %d, want 1", notANode()-before)
		}
		if v, _ := runOut(t, n.fromNetdev, n.uplink, geneveFrame(peerNode, nodeAddr, idRemote, nil, tcpFrame(podA, podA, benchPort, 40000))); v != tcActShot {
			t.Errorf("Geneve with this node's pod as inner source: verdict %d, want drop", v)
		}
		crit := geneveFrame(peerNode, nodeAddr, idRemote, []byte{0x01, 0x4b, 0xff, 0x01, 1, 2, 3, 4}, tcpFrame(remotePod, podA, benchPort, 40000))
		crit[14+20+8+1] |= 0x40
		if v, _ := runOut(t, n.fromNetdev, n.uplink, crit); v != tcActShot {
			t.Errorf("Geneve with a critical option of no known type: verdict %d, want drop", v)
		}
		calls := n.l.MapReplacements()[bpf.OverlayMapTdrOverlayCallsV1]
		if err := calls.Delete(uint32(0)); err != nil {
			t.Fatal(err)
		}
		if v, _ := runOut(t, n.fromNetdev, n.uplink, geneveFrame(peerNode, nodeAddr, idRemote, nil, tcpFrame(remotePod, podA, benchPort, 40000))); v != tcActShot {
			t.Errorf("Geneve with no overlay program to take it: verdict %d, want drop", v)
		}
	}
}

// TestPrivilegedGeneveCarrier: the carrier of Geneve in eBPF and
// to_overlay on it, the host's own packets to other nodes' pods (the
// routes to their pod CIDRs go to the carrier):
//   - GeneveModule answers without an error and leaves no probe device;
//     EnsureCarrier makes tendril_geneve an ifb, up, without ARP, its MTU
//     1450, and keeps it on a second call;
//   - to_overlay run as the carrier's egress on the node's packet to a
//     remote pod (IPv4 and IPv6 inside) redirects it with outer
//     Ethernet/IPv4 (the node's address to the owner node)/UDP 6081/
//     Geneve (the host's identity, 1, as the VNI) in front of the frame,
//     unchanged, and counts it as sent to the overlay;
//   - dropped: a packet for an address of no owner node, ARP;
//   - the kernel's path: with the programs attached to the carrier (TCX)
//     and a route to the peer's pod CIDR on it, a UDP datagram the node
//     sends from a socket to a remote pod leaves the uplink as Geneve to
//     the owner node (read on the uplink's peer), the datagram inside.
func TestPrivilegedGeneveCarrier(t *testing.T) {
	n := newGeneveNode(t)
	if _, err := GeneveModule(n.nl); err != nil {
		t.Fatalf("probe for the Geneve module: %v", err)
	}
	if _, err := n.nl.LinkByName(probeName); err == nil {
		t.Errorf("the probe device %s was left", probeName)
	}
	if _, err := EnsureCarrier(n.nl, false); err != nil {
		t.Fatal(err)
	}
	carrier, err := n.nl.LinkByName("tendril_geneve")
	if err != nil {
		t.Fatal(err)
	}
	a := carrier.Attrs()
	if _, ok := carrier.(*netlink.Ifb); !ok || a.Name != "tendril_geneve" || a.MTU != 1450 || a.Flags&net.FlagUp == 0 || a.RawFlags&unix.IFF_NOARP == 0 {
		t.Errorf("carrier %s of kind %s, MTU %d, flags %v: want tendril_geneve, ifb, 1450, up, no ARP", a.Name, carrier.Type(), a.MTU, a.Flags)
	}
	again, err := EnsureCarrier(n.nl, false)
	if err != nil {
		t.Fatal(err)
	}
	if again.Attrs().Index != a.Index {
		t.Errorf("second EnsureCarrier: ifindex %d, want the same %d", again.Attrs().Index, a.Index)
	}
	sent := n.counter(maps.ReasonToOverlay, maps.DirEgress)
	for _, f := range []struct {
		name         string
		host, remote netip.Addr
	}{{"IPv4", nodeAddr, remotePod}, {"IPv6", nodeAddr6, remote6}} {
		before := sent()
		in := tcpFrame(f.host, f.remote, 40000, benchPort)
		v, out := runOut(t, n.overlay.To, a.Index, in)
		if v != tcActRedirect {
			t.Fatalf("%s: to_overlay on the carrier: verdict %d, want redirect (%d)", f.name, v, tcActRedirect)
		}
		if len(out) != len(in)+geneveEncap {
			t.Fatalf("%s: encapsulated %d bytes, want %d + %d", f.name, len(out), len(in), geneveEncap)
		}
		ip := out[14:34]
		src, _ := netip.AddrFromSlice(ip[12:16])
		dst, _ := netip.AddrFromSlice(ip[16:20])
		if binary.BigEndian.Uint16(out[12:]) != 0x0800 || ip[0] != 0x45 || ip[9] != 17 || src != nodeAddr || dst != peerNode || ipv4Checksum(ip) != 0 {
			t.Errorf("%s: outer header % x: want IPv4/UDP %s -> %s, a valid checksum", f.name, out[:34], nodeAddr, peerNode)
		}
		if binary.BigEndian.Uint16(out[36:]) != genevePort {
			t.Errorf("%s: outer UDP to %d, want %d", f.name, binary.BigEndian.Uint16(out[36:]), genevePort)
		}
		if g := out[42:50]; binary.BigEndian.Uint16(g[2:]) != 0x6558 || binary.BigEndian.Uint32(g[4:])>>8 != 1 {
			t.Errorf("%s: Geneve header % x: want Ethernet inside, VNI 1 (the host)", f.name, g)
		}
		if !bytes.Equal(out[50:], in) {
			t.Errorf("%s: inner frame changed:\n got % x\nwant % x", f.name, out[50:], in)
		}
		if sent() != before+1 {
			t.Errorf("%s: counted %d as sent to the overlay, want 1", f.name, sent()-before)
		}
	}
	if v, _ := runOut(t, n.overlay.To, a.Index, tcpFrame(nodeAddr, world, 40000, benchPort)); v != tcActShot {
		t.Errorf("host packet to %s (no owner node): verdict %d, want drop", world, v)
	}
	arp := make([]byte, 14+28)
	copy(arp, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 2, 0, 0, 0, 0, 1, 0x08, 0x06})
	copy(arp[14:], []byte{0, 1, 8, 0, 6, 4, 0, 1})
	if v, _ := runOut(t, n.overlay.To, a.Index, arp); v != tcActShot {
		t.Errorf("ARP on the carrier: verdict %d, want drop", v)
	}
	carrierSends(t, n, a.Index)
	hostReceives(t, n)
}

// hostReceives attaches from_netdev to the uplink, sends a Geneve packet
// with a remote pod's UDP datagram for the node into the uplink (from its
// peer) and reads the datagram from a socket of the node.
func hostReceives(t *testing.T, n *benchNode) {
	t.Helper()
	lk, err := link.AttachTCX(link.TCXOptions{Interface: n.uplink, Program: n.fromNetdev, Attach: ebpf.AttachTCXIngress})
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Close()
	up, err := n.nl.LinkByIndex(n.uplink)
	if err != nil {
		t.Fatal(err)
	}
	peer, err := n.nl.LinkByName("tdrbupp0")
	if err != nil {
		t.Fatal(err)
	}
	us, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(us)
	if err := unix.Bind(us, &unix.SockaddrInet4{Port: 5202, Addr: nodeAddr.As4()}); err != nil {
		t.Fatal(err)
	}
	if err := unix.SetsockoptTimeval(us, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: 2}); err != nil {
		t.Fatal(err)
	}
	payload := []byte("from a remote pod to the node")
	udp := make([]byte, 8, 8+len(payload))
	binary.BigEndian.PutUint16(udp[0:], 40000)
	binary.BigEndian.PutUint16(udp[2:], 5202)
	binary.BigEndian.PutUint16(udp[4:], uint16(8+len(payload)))
	udp = append(udp, payload...)
	inner := append(ipHeader(remotePod, nodeAddr, 17, 64, len(udp)), udp...)
	pkt := geneveFrame(peerNode, nodeAddr, idRemote, nil, inner)
	copy(pkt[0:6], up.Attrs().HardwareAddr)
	copy(pkt[6:12], peer.Attrs().HardwareAddr)
	ps, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(ps)
	to := &unix.SockaddrLinklayer{Ifindex: peer.Attrs().Index, Halen: 6}
	copy(to.Addr[:], up.Attrs().HardwareAddr)
	if err := unix.Sendto(ps, pkt, 0, to); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 256)
	k, from, err := unix.Recvfrom(us, buf, 0)
	if err != nil {
		t.Fatalf("the node's socket got no datagram from the Geneve packet: %v", err)
	}
	src, _ := from.(*unix.SockaddrInet4)
	if src == nil || netip.AddrFrom4(src.Addr) != remotePod || src.Port != 40000 || !bytes.Equal(buf[:k], payload) {
		t.Errorf("the node read %q from %+v, want %q from %s:40000", buf[:k], from, payload, remotePod)
	}
}

// carrierSends attaches the overlay programs to the carrier, routes the
// peer's pod CIDR to it, sends a UDP datagram from a socket of the node
// to a remote pod and reads what leaves the uplink (on its peer).
func carrierSends(t *testing.T, n *benchNode, carrier int) {
	t.Helper()
	root, err := os.MkdirTemp("/sys/fs/bpf", "tendril-carrier-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = Detach(root); _ = os.RemoveAll(root) })
	if err := n.overlay.Attach(carrier, root); err != nil {
		t.Fatal(err)
	}
	peer, err := n.nl.LinkByName("tdrbupp0")
	if err != nil {
		t.Fatal(err)
	}
	if err := n.nl.LinkSetUp(peer); err != nil {
		t.Fatal(err)
	}
	// Until the kernel's link watcher has seen both ends' carrier the
	// uplink's qdisc is noop, which drops what is redirected to it: CI
	// under load lost the one datagram that way.
	waitOperUp(t, n, n.uplink, peer.Attrs().Index)
	// The owner node's MAC known: the FIB lookup resolves it.
	if err := n.nl.NeighSet(&netlink.Neigh{LinkIndex: n.uplink, State: netlink.NUD_PERMANENT, IP: peerNode.AsSlice(),
		HardwareAddr: peer.Attrs().HardwareAddr}); err != nil {
		t.Fatal(err)
	}
	if err := n.nl.RouteReplace(&netlink.Route{LinkIndex: carrier, Scope: netlink.SCOPE_LINK,
		Dst: &net.IPNet{IP: net.IP{10, 2, 0, 0}, Mask: net.CIDRMask(24, 32)}}); err != nil {
		t.Fatal(err)
	}
	ps, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, int(htons(unix.ETH_P_ALL)))
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(ps)
	if err := unix.Bind(ps, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: peer.Attrs().Index}); err != nil {
		t.Fatal(err)
	}
	if err := unix.SetsockoptTimeval(ps, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: 2}); err != nil {
		t.Fatal(err)
	}
	us, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(us)
	payload := []byte("from the node to a remote pod")
	send := func() {
		if err := unix.Sendto(us, payload, 0, &unix.SockaddrInet4{Port: 5201, Addr: remotePod.As4()}); err != nil {
			t.Fatalf("send to %s: %v", remotePod, err)
		}
	}
	send()
	// A datagram is sent again on each 2 s without an answer, five times
	// at most: the path is what is tested, and a loaded CI machine's
	// link watcher may activate the links' queues after the first.
	buf := make([]byte, 2048)
	for tries := 1; ; {
		k, _, err := unix.Recvfrom(ps, buf, 0)
		if err == unix.EAGAIN && tries < 5 {
			tries++
			send()
			continue
		}
		if err != nil {
			t.Fatalf("no Geneve packet left the uplink after %d datagrams: %v", tries, err)
		}
		f := buf[:k]
		if k < 50+14+20+8 || binary.BigEndian.Uint16(f[12:]) != 0x0800 || f[23] != 17 || binary.BigEndian.Uint16(f[36:]) != genevePort {
			continue // the peer's own IPv6 chatter
		}
		src, _ := netip.AddrFromSlice(f[26:30])
		dst, _ := netip.AddrFromSlice(f[30:34])
		inner := f[50:]
		isrc, _ := netip.AddrFromSlice(inner[26:30])
		idst, _ := netip.AddrFromSlice(inner[30:34])
		if src != nodeAddr || dst != peerNode || !bytes.Equal(f[0:6], peer.Attrs().HardwareAddr) {
			t.Errorf("outer %s -> %s to MAC % x: want %s -> %s to the peer's MAC", src, dst, f[0:6], nodeAddr, peerNode)
		}
		if binary.BigEndian.Uint32(f[46:])>>8 != 1 {
			t.Errorf("VNI %d, want 1 (the host)", binary.BigEndian.Uint32(f[46:])>>8)
		}
		if isrc != nodeAddr || idst != remotePod || binary.BigEndian.Uint16(inner[36:]) != 5201 || !bytes.Equal(inner[42:], payload) {
			t.Errorf("inner %s -> %s port %d payload %q: want %s -> %s port 5201 %q", isrc, idst, binary.BigEndian.Uint16(inner[36:]), inner[42:], nodeAddr, remotePod, payload)
		}
		return
	}
}

// waitOperUp waits up to 10 s for each link's operational state to be up.
func waitOperUp(t *testing.T, n *benchNode, indexes ...int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for _, i := range indexes {
		for {
			l, err := n.nl.LinkByIndex(i)
			if err != nil {
				t.Fatal(err)
			}
			if l.Attrs().OperState == netlink.OperUp {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("link %s is %s after 10 s, want up", l.Attrs().Name, l.Attrs().OperState)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }
