package tunnel

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"os"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/tendril-net/tendril/pkg/datapath/maps"
)

// geneveEncap6: outer IPv6, UDP, Geneve, inner Ethernet.
const geneveEncap6 = 40 + 8 + 8 + 14

var (
	// nodeUnder6 is this node's IPv6 underlay address, peerNode6 a node
	// reached only over IPv6 (it owns remote4over6 and remote6over6).
	nodeUnder6   = netip.MustParseAddr("fd99:50::1")
	peerNode6    = netip.MustParseAddr("fd99:50::2")
	remote4over6 = netip.MustParseAddr("10.3.0.5")
	remote6over6 = netip.MustParseAddr("fd00:3::5")
)

// underlay6Families: IPv4 and IPv6 inside, to pods of the IPv6-underlay
// node peerNode6.
var underlay6Families = []struct {
	name        string
	pod, remote netip.Addr
}{
	{"IPv4 over IPv6", podA, remote4over6},
	{"IPv6 over IPv6", podA6, remote6over6},
}

// newGeneve6Node is newGeneveNode with an IPv6 underlay beside the IPv4
// one: the uplink has nodeUnder6/64 (no DAD: the FIB's source must be
// usable at once), IPv6 forwarding is on, and the ipcache knows
// peerNode6 as a node that owns 10.3.0.0/24 and fd00:3::/64 with its
// IPv6 address as their tunnel endpoint.
func newGeneve6Node(t testing.TB) *benchNode {
	t.Helper()
	n := newGeneveNode(t)
	addUnderlay6(t, n)
	return n
}

// addUnderlay6 gives node n the IPv6 underlay of newGeneve6Node.
func addUnderlay6(t testing.TB, n *benchNode) {
	t.Helper()
	up, err := netlink.LinkByIndex(n.uplink)
	if err != nil {
		t.Fatal(err)
	}
	a, _ := netlink.ParseAddr(nodeUnder6.String() + "/64")
	a.Flags = unix.IFA_F_NODAD
	if err := netlink.AddrAdd(up, a); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile("/proc/sys/net/ipv6/conf/all/forwarding", []byte("1"), 0o644); err != nil {
		t.Fatal(err)
	}
	m := n.l.Maps()
	for p, e := range map[string]maps.IPCacheEntry{
		"10.3.0.0/24": {Identity: idRemote, TunnelIP: peerNode6}, "fd00:3::/64": {Identity: idRemote, TunnelIP: peerNode6},
		nodeUnder6.String() + "/128": {Identity: 1},
		peerNode6.String() + "/128":  {Identity: idRemoteNod, Flags: maps.IPCacheFlagRemoteNode},
	} {
		if err := m.IPCacheMap().Upsert(netip.MustParsePrefix(p), e); err != nil {
			t.Fatal(err)
		}
	}
}

// geneve6Frame is geneveFrame over an IPv6 underlay (UDP checksum 0).
func geneve6Frame(src, dst netip.Addr, vni uint32, opts []byte, inner []byte) []byte {
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

// TestPrivilegedGeneveIPv6Underlay runs Geneve in eBPF over an IPv6
// underlay under BPF_PROG_TEST_RUN, IPv4 and IPv6 inside:
//   - from_pod on pod A's packet for a pod of the IPv6-underlay node
//     redirects it with outer Ethernet (IPv6 type)/IPv6 (next header UDP,
//     hop limit 64, the node's IPv6 underlay address to the owner node's,
//     the payload length right)/UDP 6081 (checksum 0, an ephemeral
//     source port)/Geneve (A's identity as the VNI) in front of the pod's
//     frame, unchanged; a packet for a pod of the IPv4-underlay node in
//     the same run still gets the 50 bytes of IPv4;
//   - from_netdev on the owner node's Geneve over IPv6 to pod A strips it
//     and from_geneve delivers it into the pod (the outer IPv6 source
//     checked against the ipcache's owner of the inner source);
//   - dropped: Geneve over IPv6 from an address of no node (counted as
//     such), and from the IPv6 node with an inner source the ipcache
//     gives to the IPv4 node.
func TestPrivilegedGeneveIPv6Underlay(t *testing.T) {
	n := newGeneve6Node(t)
	for _, f := range underlay6Families {
		// No t.Run: the test's goroutine is the one locked in the
		// namespace the context's ifindex is resolved in.
		func() {
			in := tcpFrame(f.pod, f.remote, 40000, benchPort)
			v, out := runOut(t, n.fromPod, n.ifA, in)
			if v != tcActRedirect {
				t.Fatalf(f.name+": from_pod verdict %d, want redirect (%d)", v, tcActRedirect)
			}
			if len(out) != len(in)+geneveEncap6 {
				t.Fatalf(f.name+": encapsulated %d bytes, want %d + %d", len(out), len(in), geneveEncap6)
			}
			if et := binary.BigEndian.Uint16(out[12:]); et != 0x86dd {
				t.Errorf(f.name+": outer Ethernet type %#x, want IPv6", et)
			}
			ip := out[14:54]
			src, _ := netip.AddrFromSlice(ip[8:24])
			dst, _ := netip.AddrFromSlice(ip[24:40])
			if ip[0]>>4 != 6 || ip[6] != 17 || ip[7] != 64 || src != nodeUnder6 || dst != peerNode6 ||
				int(binary.BigEndian.Uint16(ip[4:])) != len(out)-54 {
				t.Errorf(f.name+": outer IPv6 header % x: want version 6, UDP, hop limit 64, %s -> %s, payload %d", ip, nodeUnder6, peerNode6, len(out)-54)
			}
			udp := out[54:62]
			if binary.BigEndian.Uint16(udp[2:]) != genevePort || int(binary.BigEndian.Uint16(udp[4:])) != len(out)-54 ||
				binary.BigEndian.Uint16(udp[0:]) < 49152 || binary.BigEndian.Uint16(udp[6:]) != 0 {
				t.Errorf(f.name+": outer UDP header % x: want an ephemeral source port, to %d, length %d, checksum 0", udp, genevePort, len(out)-54)
			}
			g := out[62:70]
			if g[0] != 0 || g[1] != 0 || binary.BigEndian.Uint16(g[2:]) != 0x6558 || binary.BigEndian.Uint32(g[4:])>>8 != idA {
				t.Errorf(f.name+": Geneve header % x: want version 0, no options, Ethernet inside, VNI %d", g, idA)
			}
			if !bytes.Equal(out[70:], in) {
				t.Errorf(f.name+": inner frame changed:\n got % x\nwant % x", out[70:], in)
			}
		}()
		func() {
			inner := tcpFrame(f.remote, f.pod, benchPort, 40000)
			opt := []byte{0x01, 0x4b, 0x7f, 0x01, 1, 2, 3, 4} // not critical: skipped
			v, out := runOut(t, n.fromNetdev, n.uplink, geneve6Frame(peerNode6, nodeUnder6, idRemote, opt, inner))
			if v != tcActRedirect {
				t.Fatalf(f.name+": from_netdev verdict %d, want redirect into the pod (%d)", v, tcActRedirect)
			}
			got, want := append([]byte(nil), out[14:]...), append([]byte(nil), inner[14:]...)
			if f.pod.Is4() {
				got[8], got[10], got[11], want[10], want[11] = want[8], 0, 0, 0, 0
			} else {
				got[7] = want[7]
			}
			if !bytes.Equal(out[12:14], inner[12:14]) || !bytes.Equal(got, want) {
				t.Errorf(f.name+": decapsulated packet:\n got % x\nwant % x", out, inner)
			}
		}()
	}
	// The IPv4 underlay beside it, in the same run: 50 bytes, IPv4.
	in := tcpFrame(podA, remotePod, 40000, benchPort)
	if v, out := runOut(t, n.fromPod, n.ifA, in); v != tcActRedirect || len(out) != len(in)+geneveEncap ||
		binary.BigEndian.Uint16(out[12:]) != 0x0800 {
		t.Errorf("pod of the IPv4-underlay node: verdict %d, %d bytes (want %d), outer type % x", v, len(out), len(in)+geneveEncap, out[12:14])
	}

	notANode := n.counter(30, maps.DirIngress) // REASON_TUNNEL_NOT_A_NODE
	before := notANode()
	stranger := netip.MustParseAddr("fd99:50::9")
	if v, _ := runOut(t, n.fromNetdev, n.uplink, geneve6Frame(stranger, nodeUnder6, idRemote, nil, tcpFrame(remote4over6, podA, benchPort, 40000))); v != tcActShot {
		t.Errorf("Geneve over IPv6 from %s (no node): verdict %d, want drop", stranger, v)
	}
	if notANode() != before+1 {
		t.Errorf("Geneve over IPv6 from no node: counted %d, want 1", notANode()-before)
	}
	// 10.2.0.5 is the IPv4 node's pod: the IPv6 node may not send for it.
	if v, _ := runOut(t, n.fromNetdev, n.uplink, geneve6Frame(peerNode6, nodeUnder6, idRemote, nil, tcpFrame(remotePod, podA, benchPort, 40000))); v != tcActShot {
		t.Errorf("Geneve over IPv6 with another node's pod as inner source: verdict %d, want drop", v)
	}
}

// BenchmarkPrivilegedGeneveUnderlay: Geneve in eBPF per packet, over the
// IPv4 and the IPv6 underlay in the same run, IPv4 and IPv6 inside, on
// one node (newGeneve6Node): encap is from_pod on pod A's packet of an
// established TCP flow to another node's pod (the headers pushed, the
// packet redirected out of the uplink), decap is from_netdev on that
// node's Geneve packet to A (the headers stripped, from_geneve's checks,
// A's ingress policy, delivery into A). Each run changes the packet, so
// each is one BPF_PROG_TEST_RUN of one run (not benchPath's repeats); the
// time is the kernel's run-time statistics of the program (syscall not
// included), reported as ns/packet, and every verdict and output length
// is checked.
func BenchmarkPrivilegedGeneveUnderlay(b *testing.B) {
	stats, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		b.Fatal(err)
	}
	defer stats.Close()
	for _, fam := range []struct {
		name                  string
		pod, remote4, remote6 netip.Addr
	}{
		{"IPv4", podA, remotePod, remote4over6},
		{"IPv6", podA6, remote6, remote6over6},
	} {
		for _, under := range []string{"underlay4", "underlay6"} {
			remote, peer, self, grow := fam.remote4, peerNode, nodeAddr, geneveEncap
			frame := geneveFrame
			if under == "underlay6" {
				remote, peer, self, grow, frame = fam.remote6, peerNode6, nodeUnder6, geneveEncap6, geneve6Frame
			}
			b.Run(fam.name+"/"+under+"/encap", func(b *testing.B) {
				n := newGeneve6Node(b)
				in := tcpFrame(fam.pod, remote, 40000, benchPort)
				benchOnce(b, n.fromPod, n.ifA, in, tcActRedirect, len(in)+grow)
			})
			b.Run(fam.name+"/"+under+"/decap", func(b *testing.B) {
				n := newGeneve6Node(b)
				// A's packet out first: the flow's conntrack entry, so
				// the reply passes A's ingress.
				if v, _ := runOut(b, n.fromPod, n.ifA, tcpFrame(fam.pod, remote, 40000, benchPort)); v != tcActRedirect {
					b.Fatalf("from_pod verdict %d, want redirect", v)
				}
				inner := tcpFrame(remote, fam.pod, benchPort, 40000)
				benchOnce(b, n.fromNetdev, n.uplink, frame(peer, self, idRemote, nil, inner), tcActRedirect, len(inner))
			})
		}
	}
}

// benchOnce runs prog on frame b.N times, one run per BPF_PROG_TEST_RUN,
// each verdict and output length checked, and reports the program's run
// time per packet from the kernel's statistics.
func benchOnce(b *testing.B, prog *ebpf.Program, ifindex int, frame []byte, verdict uint32, outLen int) {
	b.Helper()
	var ctx struct{ Fields [11]uint32 }
	ctx.Fields[10] = uint32(ifindex)
	out := make([]byte, len(frame)+256)
	run := func() {
		opts := &ebpf.RunOptions{Data: frame, DataOut: out, Context: ctx}
		ret, err := prog.Run(opts)
		if err != nil {
			b.Fatal(err)
		}
		if ret != verdict || len(opts.DataOut) != outLen {
			b.Fatalf("verdict %d, %d bytes out; want %d, %d", ret, len(opts.DataOut), verdict, outLen)
		}
	}
	run() // the lookups' first runs
	st0, err := prog.Stats()
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for range b.N {
		run()
	}
	b.StopTimer()
	st1, err := prog.Stats()
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(st1.Runtime-st0.Runtime)/float64(st1.RunCount-st0.RunCount), "ns/packet")
}

// TestPrivilegedGeneveDSRIPv6Underlay: a DSR request another node sent
// over the IPv6 underlay (Geneve DSR option, either family inside) is
// delivered into pod A with its frontend recorded (the option's flag
// rides in cb's mark beside the outer IPv6 source), and A's reply leaves
// with the frontend as its source, as over IPv4 (TestPrivilegedGeneveDSR).
func TestPrivilegedGeneveDSRIPv6Underlay(t *testing.T) {
	n := newGeneveDSRNode(t)
	addUnderlay6(t, n)
	for _, f := range dsrFamilies {
		pfe := netip.AddrPortFrom(f.pfe, dsrFEPort)
		for _, proto := range []uint8{6, 17} {
			what := f.name + map[uint8]string{6: " TCP", 17: " UDP"}[proto]
			client := netip.AddrPortFrom(f.client, 42000+uint16(proto))
			inner := l4Frame(f.client, f.pod, proto, 0x02, client.Port(), benchPort)
			pkt := geneve6Frame(peerNode6, nodeUnder6, worldID, padded(dsrOption(pfe)), inner)
			pkt[14+40+8+1] |= 0x40
			v, out := runOut(t, n.fromNetdev, n.uplink, pkt)
			if v != tcActRedirect {
				t.Fatalf("%s: from_netdev on the Geneve DSR request over IPv6: verdict %d, want redirect into the pod", what, v)
			}
			if _, dst := innerTuple(out); dst != netip.AddrPortFrom(f.pod, benchPort) {
				t.Fatalf("%s: delivered to %s", what, dst)
			}
			got, ok := dsrRecord(t, n, proto, client, netip.AddrPortFrom(f.pod, benchPort))
			if !ok || got != pfe {
				t.Fatalf("%s: recorded frontend %s (found %v), want %s", what, got, ok, pfe)
			}
			reply := l4Frame(f.pod, f.client, proto, 0x12, benchPort, client.Port())
			if v, out = runOut(t, n.toNetdev, n.uplink, reply); v != 0 {
				t.Fatalf("%s: to_netdev on the reply: verdict %d, want pass", what, v)
			}
			if src, dst := innerTuple(out); src != pfe || dst != client {
				t.Errorf("%s: reply %s -> %s, want %s -> %s", what, src, dst, pfe, client)
			}
		}
	}
}
