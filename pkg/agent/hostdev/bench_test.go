package hostdev

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/tendril-net/tendril/pkg/datapath/maps"
)

// Per-packet cost of the host device programs with BPF_PROG_TEST_RUN: the
// first packet of new flows (a port claimed each), and, in
// BenchmarkPrivilegedNodePort, every established case measured on fresh
// frames.

// BenchmarkPrivilegedMasqueradeNewFlow: b.N new flows, one test run each
// (the syscall's cost included). The flows go in batches of at most 3,000
// (two thirds of the range's 4,536 ports), each to a destination port of
// its own; between batches, with the timer stopped, the NAT table is
// emptied, so every measured packet is a new flow claiming a port in a
// range as full as the first batch found it, however large b.N.
func BenchmarkPrivilegedMasqueradeNewFlow(b *testing.B) {
	const batch = 3000
	n := newMasqNode(b, 61000, 65535)
	to := n.h.toNetdev
	nat4 := n.l.Maps().NAT.NAT4
	ctx := skbContext{}
	ctx.Fields[10] = uint32(n.uplink)
	frames := make([][]byte, batch)
	fill := func(round int) {
		for i := range frames {
			frames[i] = frame(pod, world, protoTCP, uint16(20000+i), uint16(1024+round%60000), 0)
		}
	}
	fill(0)
	b.ResetTimer()
	for i := range b.N {
		if i > 0 && i%batch == 0 {
			b.StopTimer()
			clearMap(b, nat4)
			fill(i / batch)
			b.StartTimer()
		}
		if ret, err := to.Run(&ebpf.RunOptions{Data: frames[i%batch], Context: ctx}); err != nil || ret != 0 {
			b.Fatalf("flow %d: verdict %d, %v", i, ret, err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/flow")
}

// clearMap deletes every entry of a hash map.
func clearMap(b *testing.B, m *ebpf.Map) {
	var keys [][]byte
	k, v := make([]byte, m.KeySize()), make([]byte, m.ValueSize())
	it := m.Iterate()
	for it.Next(&k, &v) {
		keys = append(keys, bytes.Clone(k))
	}
	if err := it.Err(); err != nil {
		b.Fatal(err)
	}
	for _, k := range keys {
		if err := m.Delete(k); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkPrivilegedNodePort: the host programs' own run time (kernel BPF
// statistics) per packet, each run on a fresh copy of its frame (a
// repeated BPF_PROG_TEST_RUN would run again on the packet the previous
// run rewrote, and measure the pass-through path): of services from
// outside, a known flow's packet to a local backend (DNAT) and its reply
// leaving (source back to the node port), a known flow's packet to a
// remote backend (DNAT, SNAT, FIB redirect) and that backend's reply
// (reverse SNAT and DNAT, redirect), and a packet to the node that is no
// service's (the lookups that find nothing); of masquerade, a masqueraded
// flow's packet leaving, its reply arriving, and a packet of the host's
// own that both leave alone.
func BenchmarkPrivilegedNodePort(b *testing.B) {
	for _, c := range []struct {
		name    string
		ingress bool
		frame   func(n *masqNode) []byte
		verdict uint32
	}{
		{"LocalBackend", true, func(*masqNode) []byte { return frame(client, node, protoTCP, 40000, npLocal, 0) }, 0},
		{"LocalBackendReply", false, func(n *masqNode) []byte {
			n.ingress(frame(client, node, protoTCP, 40000, npLocal, 0))
			return frame(pod, client, protoTCP, backendPort, 40000, 0)
		}, 0},
		{"RemoteBackend", true, func(*masqNode) []byte { return frame(client, node, protoTCP, 40000, npRemote, 0) }, 7},
		{"RemoteBackendReply", true, func(n *masqNode) []byte {
			_, out := n.ingress(frame(client, node, protoTCP, 40000, npRemote, 0))
			src, _ := tuple(out)
			return frame(peerPod, node, protoTCP, backendPort, src.Port(), 0)
		}, 7},
		{"NoService", true, func(*masqNode) []byte { return frame(client, node, protoTCP, 40000, 22, 0) }, 0},
		{"MasqueradeEstablished", false, func(n *masqNode) []byte {
			f := frame(pod, world, protoTCP, 41000, 80, 0)
			n.fromPod(f)
			return f
		}, 0},
		{"MasqueradeReply", true, func(n *masqNode) []byte {
			f := frame(pod, world, protoTCP, 41000, 80, 0)
			n.fromPod(f)
			_, out := n.egress(f)
			src, _ := tuple(out)
			return frame(world, node, protoTCP, 80, src.Port(), 0)
		}, 0},
		{"HostPassThrough", false, func(*masqNode) []byte { return frame(node, world, protoTCP, 40000, 80, 0) }, 0},
		// The same over IPv6 (nodeport.h's IPv6 copy, on a node that has both).
		{"IPv6LocalBackend", true, func(*masqNode) []byte { return frame6(client6, node6, protoTCP, 40000, npLocal, 0) }, 0},
		{"IPv6LocalBackendReply", false, func(n *masqNode) []byte {
			n.ingress(frame6(client6, node6, protoTCP, 40000, npLocal, 0))
			return frame6(pod6, client6, protoTCP, backendPort, 40000, 0)
		}, 0},
		{"IPv6RemoteBackend", true, func(*masqNode) []byte { return frame6(client6, node6, protoTCP, 40000, npRemote, 0) }, 7},
		{"IPv6RemoteBackendReply", true, func(n *masqNode) []byte {
			_, out := n.ingress(frame6(client6, node6, protoTCP, 40000, npRemote, 0))
			src, _ := tuple6(out)
			return frame6(peerPod6, node6, protoTCP, backendPort, src.Port(), 0)
		}, 7},
		{"IPv6NoService", true, func(*masqNode) []byte { return frame6(client6, node6, protoTCP, 40000, 22, 0) }, 0},
	} {
		b.Run(c.name, func(b *testing.B) {
			newNode := newNodePortNode
			if strings.HasPrefix(c.name, "IPv6") {
				newNode = newNodePort6Node
			}
			n := newNode(b)
			benchHostPacket(b, n, c.ingress, c.frame(n), c.verdict)
		})
	}
}

// BenchmarkPrivilegedLoadHostPrograms: loading the host device programs
// (the kernel's verifier is most of it), with the instructions the
// verifier processed for each program (its global functions included)
// and the program's size after translation.
func BenchmarkPrivilegedLoadHostPrograms(b *testing.B) {
	n := newMasqNode(b, 61000, 65535)
	for range b.N {
		h, err := Load(Options{BPFRoot: n.root, PortMin: 61000, PortMax: 65535, Maps: n.l.MapReplacements()}, nil)
		if err != nil {
			b.Fatal(err)
		}
		for name, p := range map[string]*ebpf.Program{"to_netdev": h.toNetdev, "from_netdev": h.fromNet} {
			info, err := p.Info()
			if err != nil {
				b.Fatal(err)
			}
			if v, ok := info.VerifiedInstructions(); ok {
				b.ReportMetric(float64(v), name+"-verified-insns")
			}
			if insns, err := info.Instructions(); err == nil {
				b.ReportMetric(float64(len(insns)), name+"-xlated-insns")
			}
		}
		h.Close()
	}
}

// BenchmarkPrivilegedNodePortDSR: as BenchmarkPrivilegedNodePort, in dsr
// mode against snat mode in the same run: a known flow's segment to a
// remote backend (snat: NAT entry, SNAT, FIB redirect; dsr: FIB redirect
// only), a SYN (dsr: the option inserted after an MTU check), and the
// reply (snat: back through this node; dsr: on the backend's node, the
// record's frontend as source as it leaves). The IPv6 cases: the DSR
// extension header (nodeport_dsr6) on the node of newNodePort6Node.
func BenchmarkPrivilegedNodePortDSR(b *testing.B) {
	ack := func() []byte { return withTCPFlags(frame(client, node, protoTCP, 40000, npRemote, 0), 0x10) }
	ack6 := func() []byte {
		f := frame6(client6, node6, protoTCP, 40000, npRemote, 0)
		f[54+13] = 0x10
		f[54+16], f[54+17] = 0, 0
		binary.BigEndian.PutUint16(f[54+16:], ^l4Sum6(f))
		return f
	}
	for _, c := range []struct {
		name    string
		dsr     bool
		ingress bool
		frame   func(n *masqNode) []byte
		verdict uint32
		v6      bool
	}{
		{"SNATSegment", false, true, func(*masqNode) []byte { return ack() }, 7, false},
		{"DSRSegment", true, true, func(*masqNode) []byte { return ack() }, 7, false},
		{"SNATSyn", false, true, func(*masqNode) []byte { return frame(client, node, protoTCP, 40000, npRemote, 0) }, 7, false},
		{"DSRSyn", true, true, func(*masqNode) []byte { return frame(client, node, protoTCP, 40000, npRemote, 0) }, 7, false},
		{"SNATReply", false, true, func(n *masqNode) []byte {
			_, out := n.ingress(ack())
			src, _ := tuple(out)
			return frame(peerPod, node, protoTCP, backendPort, src.Port(), 0)
		}, 7, false},
		{"DSRBackendReply", true, false, func(n *masqNode) []byte {
			n.ingress(withOption(frame(client, pod, protoTCP, 40000, backendPort, 0), dsrOpt(ap(peerNode, npRemote))))
			return frame(pod, client, protoTCP, backendPort, 40000, 0)
		}, 0, false},
		{"IPv6/SNATSegment", false, true, func(*masqNode) []byte { return ack6() }, 7, true},
		{"IPv6/DSRSegment", true, true, func(*masqNode) []byte { return ack6() }, 7, true},
		{"IPv6/SNATSyn", false, true, func(*masqNode) []byte { return frame6(client6, node6, protoTCP, 40000, npRemote, 0) }, 7, true},
		{"IPv6/DSRSyn", true, true, func(*masqNode) []byte { return frame6(client6, node6, protoTCP, 40000, npRemote, 0) }, 7, true},
		{"IPv6/DSRBackendReply", true, false, func(n *masqNode) []byte {
			n.ingress(withExt6(frame6(client6, pod6, protoTCP, 40000, backendPort, 0), netip.AddrPortFrom(peerNode6, npRemote)))
			return frame6(pod6, client6, protoTCP, backendPort, 40000, 0)
		}, 0, true},
	} {
		b.Run(c.name, func(b *testing.B) {
			var n *masqNode
			if c.v6 {
				n = newNodePort6Node(b)
			} else {
				n = newNodePortNode(b)
			}
			if c.dsr {
				n.loadDSR()
			}
			benchHostPacket(b, n, c.ingress, c.frame(n), c.verdict)
		})
	}
}

// benchHostPacket runs the node's from_netdev (ingress) or to_netdev on
// fresh copies of f, after one run that makes the flow's state, and
// reports the program's own run time per packet.
func benchHostPacket(b *testing.B, n *masqNode, ingress bool, f []byte, verdict uint32) {
	b.Helper()
	prog := n.h.fromNet
	if !ingress {
		prog = n.h.toNetdev
	}
	benchProgPacket(b, n, prog, f, verdict)
}

// benchProgPacket runs prog (one of the host programs, at the test
// node's uplink) on f b.N times, each expected to return verdict, and
// reports the program's own run time per packet.
func benchProgPacket(b *testing.B, n *masqNode, prog *ebpf.Program, f []byte, verdict uint32) {
	b.Helper()
	ifindex := n.uplink
	// The flow's first packet (its state made) before the runs.
	n.run(prog, ifindex, append([]byte(nil), f...))
	stats, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		b.Fatal(err)
	}
	defer stats.Close()
	before, err := prog.Stats()
	if err != nil {
		b.Fatal(err)
	}
	ctx := skbContext{}
	ctx.Fields[10] = uint32(ifindex)
	buf := make([]byte, len(f))
	out := make([]byte, len(f)+64)
	b.ResetTimer()
	for range b.N {
		copy(buf, f)
		ret, err := prog.Run(&ebpf.RunOptions{Data: buf, DataOut: out, Context: ctx})
		if err != nil || ret != verdict {
			b.Fatalf("verdict %d (%v), want %d", ret, err, verdict)
		}
	}
	b.StopTimer()
	after, err := prog.Stats()
	if err != nil {
		b.Fatal(err)
	}
	if runs := after.RunCount - before.RunCount; runs > 0 {
		b.ReportMetric(float64(after.Runtime-before.Runtime)/float64(runs), "bpf-ns/packet")
	}
}

// BenchmarkPrivilegedFromWireGuard: from_wireguard's per-packet cost on
// what the WireGuard device delivers (IP packets without link-layer
// header): an established flow's packet to a local pod (the common case:
// pod traffic between nodes), and a packet to the node itself without
// host firewall and under a host policy that admits it (a known flow).
func BenchmarkPrivilegedFromWireGuard(b *testing.B) {
	for _, c := range []struct {
		name  string
		fw    bool
		frame []byte
	}{
		{"PodBound", false, frame(peerPod, pod, protoTCP, 40000, backendPort, 0)[14:]},
		{"ToNode", false, frame(peerPod, node, protoTCP, 40000, 22, 0)[14:]},
		{"ToNodeHostFirewall", true, frame(peerPod, node, protoTCP, 40000, 22, 0)[14:]},
	} {
		b.Run(c.name, func(b *testing.B) {
			n := newNodePortNode(b)
			if c.fw {
				if err := n.l.Maps().EndpointMap().SetHostFirewall(maps.FlagEnforceIngress); err != nil {
					b.Fatal(err)
				}
				k := maps.PolicyKey{EndpointID: maps.HostEndpointID, Direction: maps.DirIngress, Identity: idPeerPod}
				if err := n.l.Maps().PolicyMap().Upsert(k, maps.PolicyValue{Cookie: 41}); err != nil {
					b.Fatal(err)
				}
			}
			benchProgPacket(b, n, n.h.fromWG, c.frame, 0)
		})
	}
}
