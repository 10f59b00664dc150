package tunnel

// Per-packet cost of the tunnel routing mode against native routing in
// the eBPF programs (issue 28), with BPF_PROG_TEST_RUN: the programs a
// packet of an established TCP flow between a local pod and another
// node's pod meets on this node, each run on its own frame, their run
// time from the kernel's BPF statistics.
//
// Sending (BenchmarkPrivilegedEncap): native routing, from_pod (to the
// host stack) and to_netdev at the uplink on the pod's packet; tunnel
// mode, from_pod (tunnel key, redirect to the tunnel device), to_overlay
// at the device's egress (the key is there: it passes) and to_netdev on
// the encapsulated packet leaving the uplink.
//
// Receiving (BenchmarkPrivilegedDecap): native routing, from_netdev at
// the uplink and to_pod at the pod's veth on the pod's packet; tunnel
// mode, from_netdev on the encapsulated packet and from_overlay on the
// decapsulated one (the ipcache's checks of the tunnel key, the pod's
// ingress policy and conntrack, direct delivery into the pod).
//
// Not included: the kernel's own work between the programs (the VXLAN
// device's header push and pull, the UDP socket, routing and forwarding
// in the host stack); a test run cannot run it. bench/tunnel measures the
// whole path's throughput with it.
//
// A test run has no tunnel key (the VXLAN device sets it on receive, and
// no packet has been through one): to_overlay and from_overlay run behind
// a small program (keyWrapper) that sets the key the device would have
// set and tail-calls them; the same wrapper in front of a program that
// only returns runs beside it in the same loop, and its time is
// subtracted (the "key-ns/packet" column shows it).

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"golang.org/x/sys/unix"

	"github.com/tendril-net/tendril/pkg/datapath/bpf"
	"github.com/tendril-net/tendril/pkg/datapath/loader"
	"github.com/tendril-net/tendril/pkg/datapath/maps"
	"github.com/tendril-net/tendril/pkg/testutil"
	"github.com/tendril-net/tendril/pkg/testutil/netlab"
)

const (
	// benchRepeat runs of each program per test run; the frames' TTL
	// (benchTTL) stays above 1 through all of them, so from_overlay's
	// direct delivery, which takes one off each run, never hands an
	// expiring packet to the host.
	benchRepeat = 200
	benchTTL    = 255
	benchPort   = 8080
	idRemoteNod = 6 // the remote-node identity (pkg/identity)
)

var (
	nodeAddr  = netip.MustParseAddr("192.168.50.1") // this node's underlay address
	nodeAddr6 = netip.MustParseAddr("fd99::1")
)

// benchNode is a node with one enforcing pod (A: policy allows TCP
// benchPort to and from the remote pods' identity), an uplink with the
// host programs' entry (masquerade on, the cluster's prefixes exempt), and
// in tunnel mode the VXLAN device named in tdr_tunnel_v1.
type benchNode struct {
	*node
	ifA, uplink, tunIf                   int
	fromPod, toPod, fromNetdev, toNetdev *ebpf.Program
	overlay                              *Programs
}

func newBenchNode(b testing.TB, tunnel bool) *benchNode {
	b.Helper()
	n := &benchNode{node: newNode(b)}
	n.ifA = netlab.AddVeth(b, "tdrbpod0", "tdrbpodp0")
	n.uplink = netlab.AddVeth(b, "tdrbup0", "tdrbupp0")
	if err := n.l.AttachEndpoint(n.endpointA(false)); err != nil {
		b.Fatal(err)
	}
	m := n.l.Maps()
	for p, e := range map[string]maps.IPCacheEntry{
		"0.0.0.0/0": {Identity: 2}, "::/0": {Identity: 2},
		"10.1.0.2/32": {Identity: idA}, "fd00::a/128": {Identity: idA},
		"10.2.0.0/24": {Identity: idRemote, TunnelIP: peerNode}, "fd00:2::/64": {Identity: idRemote, TunnelIP: peerNode},
		"192.168.50.1/32": {Identity: 1}, "fd99::1/128": {Identity: 1},
		"192.168.50.2/32": {Identity: idRemoteNod, Flags: maps.IPCacheFlagRemoteNode},
	} {
		if err := m.IPCacheMap().Upsert(netip.MustParsePrefix(p), e); err != nil {
			b.Fatal(err)
		}
	}
	for _, dir := range []uint8{maps.DirIngress, maps.DirEgress} {
		k := maps.PolicyKey{EndpointID: 1, Direction: dir, Identity: idRemote, Proto: 6, Port: benchPort, PortPrefixLen: 16}
		if err := m.PolicyMap().Upsert(k, maps.PolicyValue{Cookie: 7}); err != nil {
			b.Fatal(err)
		}
	}
	if err := m.NAT.SetNoMasquerade([]netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00::/16")}); err != nil {
		b.Fatal(err)
	}
	if err := m.NAT.SetHostDevice(maps.HostDevice{IfIndex: n.uplink, MasqIPv4: nodeAddr, MasqIPv6: nodeAddr6}); err != nil {
		b.Fatal(err)
	}
	n.fromPod, n.toPod = n.l.Programs()
	n.loadHost(b)

	tunMap := n.l.MapReplacements()[bpf.OverlayMapTdrTunnelV1]
	if !tunnel {
		if err := SetDevice(tunMap, 0); err != nil {
			b.Fatal(err)
		}
		return n
	}
	dev, err := EnsureDevice(n.nl, VXLAN, DefaultVXLANPort)
	if err != nil {
		b.Fatal(err)
	}
	n.tunIf = dev.Attrs().Index
	if err := SetDevice(tunMap, n.tunIf); err != nil {
		b.Fatal(err)
	}
	if n.overlay, err = Load(n.l.MapReplacements(), "", false); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = n.overlay.Close() })
	return n
}

// endpointA is pod A's endpoint; l7Ingress flags it as having ingress
// entries that name the HTTP proxy (EP_L7_INGRESS).
func (n *benchNode) endpointA(l7Ingress bool) loader.EndpointInfo {
	return loader.EndpointInfo{ID: 1, IfIndex: n.ifA, IfName: "tdrbpod0", Addresses: []netip.Addr{podA, podA6},
		Identity: idA, MAC: net.HardwareAddr{2, 0, 0, 0, 0, 1}, HostMAC: net.HardwareAddr{2, 0, 0, 0, 0, 2},
		EnforceIngress: true, EnforceEgress: true, L7Ingress: l7Ingress}
}

// loadHost loads bpf/bpf_host.c's programs with the pod programs' maps,
// as pkg/agent/hostdev does (its defaults: masquerade ports 61000-65535,
// NodePort on, no DSR).
func (n *benchNode) loadHost(b testing.TB) { n.loadHostLB(b, 0) }

// loadHostLB is loadHost with LB_DSR set to dsr (1: --bpf-lb-mode=dsr).
func (n *benchNode) loadHostLB(b testing.TB, dsr uint8) {
	spec, err := bpf.LoadHost()
	if err != nil {
		b.Fatal(err)
	}
	for name, v := range map[string]any{"MASQ_PORT_MIN": uint16(61000), "MASQ_PORT_MAX": uint16(65535), "LB_DSR": dsr, "NODEPORT_OFF": uint8(0)} {
		if err := spec.Variables[name].Set(v); err != nil {
			b.Fatalf("set %s: %v", name, err)
		}
	}
	var objs struct {
		To   *ebpf.Program `ebpf:"to_netdev"`
		From *ebpf.Program `ebpf:"from_netdev"`
	}
	if err := spec.LoadAndAssign(&objs, &ebpf.CollectionOptions{MapReplacements: n.l.MapReplacements()}); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { objs.To.Close(); objs.From.Close() })
	n.fromNetdev, n.toNetdev = objs.From, objs.To
}

// keyWrapper is a program of target's attach type that sets the tunnel
// key a VXLAN device sets on a packet it received from peer (the key's
// remote, the peer's address; the tunnel ID, id) and tail-calls target.
// Its verdicts of its own: 100 when the kernel refused the key, 101 when
// the tail call failed.
func keyWrapper(b *testing.B, at ebpf.AttachType, target *ebpf.Program, peer netip.Addr, id uint32) *ebpf.Program {
	b.Helper()
	arr, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.ProgramArray, KeySize: 4, ValueSize: 4, MaxEntries: 1})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { arr.Close() })
	// struct bpf_tunnel_key (44 bytes) at fp-48: tunnel_id at 0,
	// remote_ipv4 at 4, tunnel_ttl at 21, local_ipv4 at 28. The getter
	// reads the remote from the key's source (on receive, the outer
	// source), which the setter fills from local_ipv4: both are the peer.
	a4 := peer.As4()
	ip := int64(int32(binary.BigEndian.Uint32(a4[:]))) // host order
	const key = -48
	insns := asm.Instructions{
		asm.Mov.Reg(asm.R6, asm.R1),
		asm.Mov.Imm(asm.R1, 0),
	}
	for off := int16(key); off < 0; off += 8 {
		insns = append(insns, asm.StoreMem(asm.RFP, off, asm.R1, asm.DWord))
	}
	insns = append(insns,
		asm.StoreImm(asm.RFP, key+0, int64(id), asm.Word),
		asm.StoreImm(asm.RFP, key+4, ip, asm.Word),
		asm.StoreImm(asm.RFP, key+21, 64, asm.Byte),
		asm.StoreImm(asm.RFP, key+28, ip, asm.Word),
		asm.Mov.Reg(asm.R1, asm.R6),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, key),
		asm.Mov.Imm(asm.R3, 44),
		asm.Mov.Imm(asm.R4, 0),
		asm.FnSkbSetTunnelKey.Call(),
		asm.JEq.Imm(asm.R0, 0, "tail"),
		asm.Mov.Imm(asm.R0, 100),
		asm.Return(),
		asm.Mov.Reg(asm.R1, asm.R6).WithSymbol("tail"),
		asm.LoadMapPtr(asm.R2, arr.FD()),
		asm.Mov.Imm(asm.R3, 0),
		asm.FnTailCall.Call(),
		asm.Mov.Imm(asm.R0, 101),
		asm.Return(),
	)
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Name: "bench_tunkey", Type: ebpf.SchedCLS, AttachType: at, Instructions: insns, License: "Dual BSD/GPL"})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { prog.Close() })
	if err := arr.Put(uint32(0), target); err != nil {
		b.Fatalf("tail call target: %v", err)
	}
	return prog
}

// passProgram is a program of attach type at that returns TC_ACT_OK: the
// target of keyWrapper's twin whose time is subtracted.
func passProgram(b *testing.B, at ebpf.AttachType) *ebpf.Program {
	b.Helper()
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Name: "bench_pass", Type: ebpf.SchedCLS, AttachType: at, License: "Dual BSD/GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { prog.Close() })
	return prog
}

// step is one program on a packet's path through the node.
type step struct {
	name    string
	prog    *ebpf.Program
	base    *ebpf.Program // keyWrapper's twin (nil: none): its time per packet is subtracted
	ifindex int
	frame   []byte
	verdict uint32
	// check, if set, judges the frame after the first test run (benchRepeat runs).
	check func([]byte) error
	// counts: benchPath's counted metric counts each run of this step.
	counts bool
}

// benchPath runs every step's program benchRepeat times on its frame per
// iteration (BPF_PROG_TEST_RUN), each verdict checked, and reports the
// programs' own time per packet from the kernel's BPF run-time statistics
// (run time over run count: a test run a signal interrupted is run again,
// and its first runs count too): each step's as <name>-ns/packet and their
// sum as prog-ns/packet; the key wrappers' own as key-ns/packet (not in
// the sum); the wall time per program run as ns/run. counted, if set, is
// the metric the step marked counts counts each of its runs under,
// checked against its runs afterwards.
func benchPath(b *testing.B, steps []step, counted func() uint64) {
	b.Helper()
	stats, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		b.Fatal(err)
	}
	defer stats.Close()
	var ctx struct{ Fields [11]uint32 } // struct __sk_buff up to ifindex
	run := func(prog *ebpf.Program, s step, out []byte) (uint32, []byte) {
		ctx.Fields[10] = uint32(s.ifindex)
		opts := &ebpf.RunOptions{Data: s.frame, DataOut: out, Context: ctx, Repeat: benchRepeat}
		ret, err := prog.Run(opts)
		if err != nil {
			b.Fatalf("%s: %v", s.name, err)
		}
		return ret, opts.DataOut
	}
	// First runs (they make the flow's conntrack entries): every verdict
	// must be the path's, or the loop would time a drop.
	for _, s := range steps {
		ret, out := run(s.prog, s, make([]byte, len(s.frame)+256))
		if ret != s.verdict {
			b.Fatalf("%s: verdict %d, want %d", s.name, ret, s.verdict)
		}
		if s.check != nil {
			if err := s.check(out); err != nil {
				b.Fatalf("%s: %v", s.name, err)
			}
		}
		if s.base != nil {
			if ret, _ := run(s.base, s, nil); ret != 0 {
				b.Fatalf("%s's key wrapper alone: verdict %d", s.name, ret)
			}
		}
	}
	var before uint64
	if counted != nil {
		before = counted()
	}
	type mark struct{ ns, runs int64 }
	read := func(p *ebpf.Program) mark {
		st, err := p.Stats()
		if err != nil {
			b.Fatal(err)
		}
		return mark{st.Runtime.Nanoseconds(), int64(st.RunCount)}
	}
	start := make([]mark, len(steps))
	startBase := make([]mark, len(steps))
	for i, s := range steps {
		start[i] = read(s.prog)
		if s.base != nil {
			startBase[i] = read(s.base)
		}
	}
	b.ResetTimer()
	for range b.N {
		for _, s := range steps {
			if ret, _ := run(s.prog, s, nil); ret != s.verdict {
				b.Fatalf("%s: verdict %d, want %d", s.name, ret, s.verdict)
			}
			if s.base != nil {
				if ret, _ := run(s.base, s, nil); ret != 0 {
					b.Fatalf("%s's key wrapper alone: verdict %d", s.name, ret)
				}
			}
		}
	}
	b.StopTimer()
	var total, key float64
	var runs, countedRuns int64
	for i, s := range steps {
		m := read(s.prog)
		d := mark{m.ns - start[i].ns, m.runs - start[i].runs}
		runs += d.runs
		if s.counts {
			countedRuns = d.runs
		}
		per := float64(d.ns) / float64(d.runs)
		if s.base != nil {
			bm := read(s.base)
			bd := mark{bm.ns - startBase[i].ns, bm.runs - startBase[i].runs}
			runs += bd.runs
			k := float64(bd.ns) / float64(bd.runs)
			key += k
			per -= k
		}
		total += per
		b.ReportMetric(per, s.name+"-ns/packet")
	}
	if key > 0 {
		b.ReportMetric(key, "key-ns/packet")
	}
	b.ReportMetric(total, "prog-ns/packet")
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(runs), "ns/run")
	if counted != nil {
		if got := counted() - before; got != uint64(countedRuns) {
			b.Fatalf("%d packets counted on the path's reason, want %d (one per run)", got, countedRuns)
		}
	}
}

// tcpFrame is an Ethernet frame of a TCP ACK from src:sport to dst:dport
// (IPv4 or IPv6), TTL or hop limit benchTTL, 6 bytes of payload.
func tcpFrame(src, dst netip.Addr, sport, dport uint16) []byte {
	tcp := make([]byte, 20+6)
	binary.BigEndian.PutUint16(tcp[0:], sport)
	binary.BigEndian.PutUint16(tcp[2:], dport)
	tcp[12] = 5 << 4
	tcp[13] = 0x10
	binary.BigEndian.PutUint16(tcp[14:], 65535)
	copy(tcp[20:], "bench!")
	return append(ipHeader(src, dst, 6, benchTTL, len(tcp)), tcp...)
}

// outerFrame is the VXLAN packet carrying inner (an Ethernet frame) from
// src to dst (IPv4 underlay, UDP to DefaultVXLANPort, the VNI idRemote).
func outerFrame(src, dst netip.Addr, inner []byte) []byte {
	udp := make([]byte, 8+8, 8+8+len(inner))
	binary.BigEndian.PutUint16(udp[0:], 51234)
	binary.BigEndian.PutUint16(udp[2:], DefaultVXLANPort)
	binary.BigEndian.PutUint16(udp[4:], uint16(8+8+len(inner)))
	udp[8] = 0x08
	binary.BigEndian.PutUint32(udp[12:], idRemote<<8)
	udp = append(udp, inner...)
	return append(ipHeader(src, dst, 17, 64, len(udp)), udp...)
}

// ipHeader is the Ethernet and IP header (IPv4 with its checksum, or
// IPv6) of a packet of proto with l4len bytes after it.
func ipHeader(src, dst netip.Addr, proto, ttl uint8, l4len int) []byte {
	eth := []byte{2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1, 0, 0}
	if src.Is4() {
		binary.BigEndian.PutUint16(eth[12:], 0x0800)
		return append(eth, testutil.IPv4Header(src, dst, proto, ttl, l4len)...)
	}
	binary.BigEndian.PutUint16(eth[12:], 0x86DD)
	ip := make([]byte, 40)
	ip[0] = 0x60
	binary.BigEndian.PutUint16(ip[4:], uint16(l4len))
	ip[6], ip[7] = proto, ttl
	s, d := src.As16(), dst.As16()
	copy(ip[8:], s[:])
	copy(ip[24:], d[:])
	return append(eth, ip...)
}

// benchFamilies: IPv4 and IPv6 inside (the underlay IPv4 in both).
var benchFamilies = []struct {
	name        string
	pod, remote netip.Addr
}{
	{"IPv4", podA, remotePod},
	{"IPv6", podA6, remote6},
}

func (n *benchNode) counter(reason, dir uint8) func() uint64 {
	return func() uint64 {
		row, err := n.l.Maps().MetricsMap().Lookup(reason, dir)
		if err != nil {
			panic(err)
		}
		return row.Packets
	}
}

// BenchmarkPrivilegedEncap: a packet of an established TCP flow from
// local pod A to a pod of another node (the ipcache names the owner node)
// on the sending node's programs. native: the tunnel map's device is 0,
// from_pod hands the packet to the host stack, which routes it out of the
// uplink (to_netdev: not masqueraded, the cluster's prefixes are exempt).
// tunnel: from_pod sets the tunnel key and redirects to the VXLAN device
// (each packet counted as sent to the overlay, checked), to_overlay finds
// the key and passes it, to_netdev sees the outer packet from the node's
// address. prog-ns/packet is the path's sum; from_pod-ns/packet is the
// encapsulation decision alone.
func BenchmarkPrivilegedEncap(b *testing.B) {
	for _, fam := range benchFamilies {
		for _, mode := range []string{"native", "tunnel"} {
			b.Run(fam.name+"/"+mode, func(b *testing.B) {
				n := newBenchNode(b, mode == "tunnel")
				inner := tcpFrame(fam.pod, fam.remote, 40000, benchPort)
				if mode == "native" {
					benchPath(b, []step{
						{name: "from_pod", prog: n.fromPod, ifindex: n.ifA, frame: inner, verdict: tcActOK},
						{name: "to_netdev", prog: n.toNetdev, ifindex: n.uplink, frame: inner, verdict: tcActOK},
					}, nil)
					return
				}
				benchPath(b, []step{
					{name: "from_pod", prog: n.fromPod, ifindex: n.ifA, frame: inner, verdict: tcActRedirect, counts: true},
					{name: "to_overlay", prog: keyWrapper(b, ebpf.AttachTCXEgress, n.overlay.To, peerNode, idA),
						base:    keyWrapper(b, ebpf.AttachTCXEgress, passProgram(b, ebpf.AttachTCXEgress), peerNode, idA),
						ifindex: n.tunIf, frame: inner, verdict: tcActOK},
					{name: "to_netdev", prog: n.toNetdev, ifindex: n.uplink, frame: outerFrame(nodeAddr, peerNode, inner), verdict: tcActOK},
				}, n.counter(maps.ReasonToOverlay, maps.DirEgress))
			})
		}
	}
}

// BenchmarkPrivilegedDecap: a packet of an established TCP flow from a
// pod of another node to local pod A (A's ingress policy enforced,
// allowing it) on the receiving node's programs. native: from_netdev at
// the uplink (no NAT mapping, no service: to the host stack), which
// routes it to A's veth, where to_pod decides A's ingress. tunnel:
// from_netdev on the VXLAN packet to the node, then, after the device
// took the outer headers off, from_overlay on the inner one (its tunnel
// key set by keyWrapper: the remote the peer node, the VNI the source's
// identity): the outer source must be a node, the inner source that
// node's pod; A's ingress and conntrack; delivered into A directly (each
// packet counted so, and its TTL down by one per run, checked).
func BenchmarkPrivilegedDecap(b *testing.B) {
	for _, fam := range benchFamilies {
		// native-l7ingress: pod A flagged EP_L7_INGRESS (it has ingress
		// HTTP rules), so from_netdev looks up each packet's flow for
		// the ingress proxy; native-l7egress: A flagged EP2_L7_EGRESS
		// (egress rules naming a proxy), so from_netdev looks up each
		// packet's flow for the HTTP proxy's upstream connection; plain
		// native: A enforces ingress and egress without them and pays no
		// lookup.
		for _, mode := range []string{"native", "native-l7ingress", "native-l7egress", "tunnel"} {
			b.Run(fam.name+"/"+mode, func(b *testing.B) {
				n := newBenchNode(b, mode == "tunnel")
				if mode == "native-l7ingress" {
					if err := n.l.WriteEndpoint(n.endpointA(true)); err != nil {
						b.Fatal(err)
					}
				}
				if mode == "native-l7egress" {
					ep := n.endpointA(false)
					ep.L7Egress = true
					if err := n.l.WriteEndpoint(ep); err != nil {
						b.Fatal(err)
					}
				}
				inner := tcpFrame(fam.remote, fam.pod, 40000, benchPort)
				if mode != "tunnel" {
					benchPath(b, []step{
						{name: "from_netdev", prog: n.fromNetdev, ifindex: n.uplink, frame: inner, verdict: tcActOK},
						{name: "to_pod", prog: n.toPod, ifindex: n.ifA, frame: inner, verdict: tcActOK},
					}, nil)
					return
				}
				ttlAt := 14 + 8
				if fam.pod.Is6() {
					ttlAt = 14 + 7
				}
				benchPath(b, []step{
					{name: "from_netdev", prog: n.fromNetdev, ifindex: n.uplink, frame: outerFrame(peerNode, nodeAddr, inner), verdict: tcActOK},
					{name: "from_overlay", prog: keyWrapper(b, ebpf.AttachTCXIngress, n.overlay.From, peerNode, idRemote),
						base:    keyWrapper(b, ebpf.AttachTCXIngress, passProgram(b, ebpf.AttachTCXIngress), peerNode, idRemote),
						ifindex: n.tunIf, frame: inner, verdict: tcActRedirect, counts: true,
						check: func(out []byte) error {
							if got, want := out[ttlAt], byte(benchTTL-benchRepeat); got != want {
								return fmt.Errorf("TTL %d after %d runs, want %d (each run delivered)", got, benchRepeat, want)
							}
							return nil
						}},
				}, n.counter(maps.ReasonDeliveredDirect, maps.DirIngress))
			})
		}
	}
}
