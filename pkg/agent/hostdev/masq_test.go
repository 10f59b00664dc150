package hostdev

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"net"
	"net/netip"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/tendril-net/tendril/pkg/datapath/loader"
	"github.com/tendril-net/tendril/pkg/datapath/maps"
	"github.com/tendril-net/tendril/pkg/testutil"
	"github.com/tendril-net/tendril/pkg/testutil/netlab"
)

// Masquerade in the host device programs (bpf/bpf_host.c, lib/nat.h), with
// BPF_PROG_TEST_RUN on frames whose checksums are valid, so that the
// rewritten frames' checksums can be checked: a loaded pod datapath and
// the host programs in a throw-away network namespace, one pod veth and
// one uplink holding the node's address.

var (
	pod      = netip.MustParseAddr("10.244.0.2")
	node     = netip.MustParseAddr("172.30.0.11")
	world    = netip.MustParseAddr("198.51.100.1")
	world2   = netip.MustParseAddr("198.51.100.7")
	peerPod  = netip.MustParseAddr("10.244.1.5")
	noMasqTo = netip.MustParseAddr("192.168.3.4")
	pod6     = netip.MustParseAddr("fd00:10::2")
	node6    = netip.MustParseAddr("fd00:ff::11")
	world6   = netip.MustParseAddr("2001:db8::1")
	peerPod6 = netip.MustParseAddr("fd00:10:1::5")
)

const (
	protoICMP = 1
	protoTCP  = 6
	protoUDP  = 17
	idPod     = 1000
	idPeerPod = 3000
)

type masqNode struct {
	t      testing.TB
	l      *loader.Loader
	h      *Programs
	root   string
	podIf  int
	uplink int
}

func newMasqNode(t testing.TB, portMin, portMax uint16) *masqNode {
	testutil.Privileged(t)
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	ns, err := netns.New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = netns.Set(orig)
		ns.Close()
		orig.Close()
		runtime.UnlockOSThread()
	})
	n := &masqNode{t: t, podIf: netlab.AddVeth(t, "tdrpod0", "tdrpeer0"), uplink: netlab.AddVeth(t, "tdrup0", "tdrupp0")}
	up, err := netlink.LinkByIndex(n.uplink)
	if err != nil {
		t.Fatal(err)
	}
	if err := netlink.AddrAdd(up, &netlink.Addr{IPNet: &net.IPNet{IP: node.AsSlice(), Mask: net.CIDRMask(24, 32)}}); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	root := filepath.Join("/sys/fs/bpf", "tendril-hosttest-"+hex.EncodeToString(b))
	n.root = root
	n.l = loader.New(loader.Config{BPFRoot: root}, nil)
	t.Cleanup(func() { _ = n.l.Remove() })
	if err := n.l.Start(); err != nil {
		t.Fatal(err)
	}
	if err := n.l.AttachEndpoint(loader.EndpointInfo{ID: 1, IfIndex: n.podIf, IfName: "tdrpod0", Addresses: []netip.Addr{pod, pod6}, Identity: idPod}); err != nil {
		t.Fatal(err)
	}
	m := n.l.Maps()
	for p, id := range map[string]uint32{"0.0.0.0/0": 2, "10.244.0.2/32": idPod, "10.244.1.5/32": idPeerPod, "172.30.0.11/32": 1,
		"::/0": 2, "fd00:10::2/128": idPod, "fd00:10:1::5/128": idPeerPod, "fd00:ff::11/128": 1} {
		if err := m.IPCacheMap().Upsert(netip.MustParsePrefix(p), maps.IPCacheEntry{Identity: id}); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.NAT.SetNoMasquerade([]netip.Prefix{netip.MustParsePrefix("192.168.0.0/16")}); err != nil {
		t.Fatal(err)
	}
	if err := m.NAT.SetHostDevice(maps.HostDevice{IfIndex: n.uplink, MasqIPv4: node, MasqIPv6: node6}); err != nil {
		t.Fatal(err)
	}
	n.h, err = Load(Options{BPFRoot: root, PortMin: portMin, PortMax: portMax, Maps: n.l.MapReplacements()}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.h.Close)
	return n
}

// skbContext is the start of struct __sk_buff up to ifindex (offset 40).
type skbContext struct{ Fields [11]uint32 }

func (n *masqNode) run(prog *ebpf.Program, ifindex int, frame []byte) (uint32, []byte) {
	n.t.Helper()
	ctx := skbContext{}
	ctx.Fields[10] = uint32(ifindex)
	out := make([]byte, len(frame)+256)
	opts := &ebpf.RunOptions{Data: frame, DataOut: out, Context: ctx}
	ret, err := prog.Run(opts)
	if err != nil {
		n.t.Fatalf("test run: %v", err)
	}
	return ret, opts.DataOut
}

// fromPod runs the pod's program (which makes the flow's conntrack entry).
func (n *masqNode) fromPod(frame []byte) {
	n.t.Helper()
	from, _ := n.l.Programs()
	if ret, _ := n.run(from, n.podIf, frame); ret != 0 {
		n.t.Fatalf("from_pod: verdict %d", ret)
	}
}

func (n *masqNode) egress(frame []byte) (uint32, []byte) {
	n.t.Helper()
	to := n.h.toNetdev
	return n.run(to, n.uplink, frame)
}

func (n *masqNode) ingress(frame []byte) (uint32, []byte) {
	n.t.Helper()
	from := n.h.fromNet
	return n.run(from, n.uplink, frame)
}

func (n *masqNode) metric(reason, dir uint8) uint64 {
	n.t.Helper()
	row, err := n.l.Maps().MetricsMap().Lookup(reason, dir)
	if err != nil {
		n.t.Fatal(err)
	}
	return row.Packets
}

// frame builds Ethernet + IPv4 + TCP/UDP (ports) or ICMP echo (icmpType,
// sport as the identifier) with every checksum right.
func frame(src, dst netip.Addr, proto uint8, sport, dport uint16, icmpType uint8) []byte {
	var l4 []byte
	switch proto {
	case protoTCP:
		l4 = make([]byte, 20+4)
		binary.BigEndian.PutUint16(l4[0:], sport)
		binary.BigEndian.PutUint16(l4[2:], dport)
		l4[12] = 5 << 4
		l4[13] = 0x02
		copy(l4[20:], "data")
	case protoUDP:
		l4 = make([]byte, 8+4)
		binary.BigEndian.PutUint16(l4[0:], sport)
		binary.BigEndian.PutUint16(l4[2:], dport)
		binary.BigEndian.PutUint16(l4[4:], uint16(len(l4)))
		copy(l4[8:], "data")
	default:
		l4 = make([]byte, 8+4)
		l4[0] = icmpType
		binary.BigEndian.PutUint16(l4[4:], sport)
		binary.BigEndian.PutUint16(l4[6:], 1)
		copy(l4[8:], "ping")
	}
	ip := make([]byte, 20)
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:], uint16(20+len(l4)))
	ip[8] = 64
	ip[9] = proto
	s, d := src.As4(), dst.As4()
	copy(ip[12:], s[:])
	copy(ip[16:], d[:])
	binary.BigEndian.PutUint16(ip[10:], ^sum16(0, ip))
	eth := make([]byte, 14)
	binary.BigEndian.PutUint16(eth[12:], 0x0800)
	f := append(append(eth, ip...), l4...)
	off := csumOffset(proto)
	binary.BigEndian.PutUint16(f[34+off:], ^l4Sum(f))
	for len(f) < 60 {
		f = append(f, 0)
	}
	return f
}

func csumOffset(proto uint8) int {
	switch proto {
	case protoTCP:
		return 16
	case protoUDP:
		return 6
	}
	return 2
}

func sum16(sum uint32, b []byte) uint16 {
	for i := 0; i < len(b); i += 2 {
		if i+1 < len(b) {
			sum += uint32(binary.BigEndian.Uint16(b[i:]))
		} else {
			sum += uint32(b[i]) << 8
		}
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	return uint16(sum)
}

// l4Sum sums the L4 segment (and, for TCP and UDP, the pseudo-header).
func l4Sum(f []byte) uint16 {
	total := int(binary.BigEndian.Uint16(f[16:]))
	seg := f[34 : 14+total]
	proto := f[23]
	var sum uint32
	if proto != protoICMP {
		sum = uint32(sum16(0, f[26:34])) + uint32(proto) + uint32(len(seg))
	}
	return sum16(sum, seg)
}

func checkSums(t *testing.T, what string, f []byte) {
	t.Helper()
	if s := l4Sum(f); s != 0xffff {
		t.Errorf("%s: L4 checksum wrong (sum %#x)", what, s)
	}
	if sum16(0, f[14:34]) != 0xffff {
		t.Errorf("%s: IPv4 header checksum wrong", what)
	}
}

// tuple is the frame's source and destination (ICMP: the identifier as
// the port of both).
func tuple(f []byte) (netip.AddrPort, netip.AddrPort) {
	src, dst := netip.AddrFrom4([4]byte(f[26:30])), netip.AddrFrom4([4]byte(f[30:34]))
	if f[23] == protoICMP {
		id := binary.BigEndian.Uint16(f[38:])
		return netip.AddrPortFrom(src, id), netip.AddrPortFrom(dst, id)
	}
	return netip.AddrPortFrom(src, binary.BigEndian.Uint16(f[34:])), netip.AddrPortFrom(dst, binary.BigEndian.Uint16(f[36:]))
}

func inRange(p, min, max uint16) bool { return p >= min && p <= max }

// TestPrivilegedMasquerade: a pod's TCP, UDP and ICMP echo to the world
// leave with the node's address and a port (identifier) of the range,
// checksums right; later packets keep the mapping; replies get the pod's
// address and port back; the NAT table holds both directions; traffic to
// in-cluster peers, non-masquerade CIDRs, the host's own traffic and
// replies of no mapping pass untouched.
func TestPrivilegedMasquerade(t *testing.T) {
	const lo, hi = 61000, 61999
	n := newMasqNode(t, lo, hi)
	masq0 := n.metric(maps.ReasonMasqueraded, maps.DirEgress)
	rev0 := n.metric(maps.ReasonMasqReply, maps.DirIngress)
	for _, tc := range []struct {
		name         string
		proto        uint8
		sport, dport uint16
		req, rep     uint8
	}{
		{"tcp", protoTCP, 40000, 80, 0, 0},
		{"udp", protoUDP, 40001, 53, 0, 0},
		{"icmp echo", protoICMP, 7, 0, 8, 0},
	} {
		// Not subtests: a subtest's goroutine is not on this thread, in
		// this network namespace.
		t.Logf("%s", tc.name)
		func() {
			out := frame(pod, world, tc.proto, tc.sport, tc.dport, tc.req)
			n.fromPod(out)
			ret, got := n.egress(out)
			if ret != 0 {
				t.Fatalf("egress verdict %d", ret)
			}
			src, dst := tuple(got)
			if src.Addr() != node || !inRange(src.Port(), lo, hi) || dst.Addr() != world {
				t.Fatalf("masqueraded %s -> %s, want %s:<%d-%d> -> %s", src, dst, node, lo, hi, world)
			}
			if tc.proto != protoICMP && dst.Port() != tc.dport {
				t.Fatalf("destination port changed: %s", dst)
			}
			checkSums(t, "masqueraded", got)
			// The flow's next packet keeps the mapping.
			_, again := n.egress(out)
			if s2, _ := tuple(again); s2 != src {
				t.Fatalf("second packet left as %s, first as %s", s2, src)
			}
			// The reply comes back to the pod.
			var reply []byte
			if tc.proto == protoICMP {
				reply = frame(world, node, protoICMP, src.Port(), 0, tc.rep)
			} else {
				reply = frame(world, node, tc.proto, tc.dport, src.Port(), 0)
			}
			ret, back := n.ingress(reply)
			if ret != 0 {
				t.Fatalf("ingress verdict %d", ret)
			}
			bs, bd := tuple(back)
			if bd.Addr() != pod || bd.Port() != tc.sport || bs.Addr() != world {
				t.Fatalf("reply translated to %s -> %s, want -> %s:%d", bs, bd, pod, tc.sport)
			}
			checkSums(t, "reply", back)
		}()
	}
	if got := n.metric(maps.ReasonMasqueraded, maps.DirEgress) - masq0; got != 6 {
		t.Errorf("masqueraded packets counted %d, want 6", got)
	}
	if got := n.metric(maps.ReasonMasqReply, maps.DirIngress) - rev0; got != 3 {
		t.Errorf("reverse-translated packets counted %d, want 3", got)
	}
	list, err := n.l.Maps().NAT.NATMap().List()
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 3 {
		t.Fatalf("NAT table holds %d mappings, want 3: %+v", len(list), list)
	}
	for _, m := range list {
		if m.Orphan || m.Pod != pod || m.Node != node || m.Remote != world {
			t.Errorf("mapping %+v: want both halves, %s -> %s via %s", m, pod, world, node)
		}
	}

	untouched := map[string][]byte{
		"to an in-cluster pod":        frame(pod, peerPod, protoTCP, 40010, 80, 0),
		"to a non-masquerade CIDR":    frame(pod, noMasqTo, protoTCP, 40011, 80, 0),
		"the host's own traffic":      frame(node, world, protoTCP, 40012, 80, 0),
		"a reply of no mapping":       frame(world, node, protoTCP, 80, 61500, 0),
		"a UDP reply of no mapping":   frame(world, node, protoUDP, 53, 40001, 0),
		"an echo reply of no mapping": frame(world, node, protoICMP, 999, 0, 0),
	}
	for what, f := range untouched {
		run := n.egress
		if s, _ := tuple(f); s.Addr() == world {
			run = n.ingress
		}
		ret, got := run(f)
		if ret != 0 || string(got) != string(f) {
			t.Errorf("%s: verdict %d, frame changed: %v", what, ret, string(got) != string(f))
		}
	}
	if l, _ := n.l.Maps().NAT.NATMap().List(); len(l) != 3 {
		t.Errorf("untouched traffic made mappings: %d, want 3", len(l))
	}
}

// TestPrivilegedMasqueradePorts: with a range of four ports, a port a host
// socket listens on and a port a live mapping holds are never given;
// flows get the two others; the next flow is dropped with "Masquerade port
// range exhausted" (counted, in a drop event); once a mapping's flow is
// gone (its conntrack entry deleted), its port is taken over by a new
// flow; the NAT GC removes a mapping whose flow is gone and keeps live
// ones.
func TestPrivilegedMasqueradePorts(t *testing.T) {
	const lo, hi = 62000, 62003
	n := newMasqNode(t, lo, hi)
	checkMasqPorts(t, n, famV4)

	// GC: the mapping of a flow whose conntrack entry is gone goes, with
	// both halves; live ones stay.
	gone := maps.CTEntry{Proto: protoTCP, Src: pod, SrcPort: 41000, Dst: world2, DstPort: 80}
	if err := n.l.Maps().CTMap().Delete(gone); err != nil {
		t.Fatal(err)
	}
	before, _ := n.l.Maps().NAT.NATMap().List()
	res, err := n.l.Maps().NAT.NATMap().CollectNAT(n.l.Maps().CTMap(), maps.MonotonicNow()+uint64(maps.NATMinAge.Nanoseconds())+1e9)
	if err != nil {
		t.Fatal(err)
	}
	after, _ := n.l.Maps().NAT.NATMap().List()
	if res.Deleted != 1 || len(after) != len(before)-1 {
		t.Fatalf("GC deleted %d mappings (%d -> %d), want 1", res.Deleted, len(before), len(after))
	}
	for _, m := range after {
		if m.Remote == world2 {
			t.Fatalf("mapping of the ended flow kept: %+v", m)
		}
	}
	if c, _ := n.l.Maps().NAT.NATMap().Count(); c != 2*len(after) {
		t.Fatalf("NAT table has %d entries for %d mappings: a half was left", c, len(after))
	}
	// A fresh mapping without conntrack is not collected.
	res, _ = n.l.Maps().NAT.NATMap().CollectNAT(n.l.Maps().CTMap(), maps.MonotonicNow())
	if res.Deleted != 0 {
		t.Fatalf("GC deleted %d mappings of live flows", res.Deleted)
	}
}

// TestPrivilegedMasqueradePrefersFreshPorts: a port whose mapping's flow
// ended is taken over only when no unused port is found (the remote end
// may still hold the old connection in TIME_WAIT): with a range of two
// ports, one held by a dead mapping, a new flow gets the unused one, the
// next takes the dead one over.
func TestPrivilegedMasqueradePrefersFreshPorts(t *testing.T) {
	checkMasqFreshPorts(t, newMasqNode(t, 63000, 63001), famV4)
}

// checkMasqPorts is TestPrivilegedMasqueradePorts' allocation, of family f,
// on n with the range 62000-62003: a host socket and a live mapping's
// ports are not given, then exhaustion, then a dead mapping's port taken
// over. It returns the mappings left.
func checkMasqPorts(t *testing.T, n *masqNode, f ipFamily) []maps.NATMapping {
	t.Helper()
	const lo, hi = 62000, 62003
	// A host socket on 62000.
	ln, err := net.Listen("tcp", netip.AddrPortFrom(f.node, 62000).String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	// A live mapping of another pod flow on 62001 to the same destination.
	other := maps.NATMapping{Proto: protoTCP, Pod: f.otherPod, PodPort: 45000, Remote: f.world, RemotePort: 80,
		Node: f.node, NodePort: 62001, Created: maps.MonotonicNow()}
	if err := n.l.Maps().NAT.NATMap().Upsert(other); err != nil {
		t.Fatal(err)
	}
	otherCT := maps.CTEntry{Proto: protoTCP, Src: other.Pod, SrcPort: other.PodPort, Dst: f.world, DstPort: 80, Expires: maps.MonotonicNow() + 60e9, Flags: maps.CTFlagSeenReply}
	if err := n.l.Maps().CTMap().Upsert(otherCT); err != nil {
		t.Fatal(err)
	}
	got := map[uint16]bool{}
	for i := range 2 {
		fr := f.frame(f.pod, f.world, protoTCP, uint16(41000+i), 80, 0)
		n.fromPod(fr)
		ret, out := n.egress(fr)
		if ret != 0 {
			t.Fatalf("flow %d: verdict %d", i, ret)
		}
		src, _ := f.tuple(out)
		if src.Port() == 62000 || src.Port() == 62001 || got[src.Port()] || !inRange(src.Port(), lo, hi) {
			t.Fatalf("flow %d got port %d (taken: host socket 62000, mapping 62001, earlier %v)", i, src.Port(), got)
		}
		got[src.Port()] = true
	}
	// Another destination has its own ports.
	other2 := f.frame(f.pod, f.world2, protoTCP, 41000, 80, 0)
	n.fromPod(other2)
	if ret, _ := n.egress(other2); ret != 0 {
		t.Fatalf("flow to another destination: verdict %d", ret)
	}
	// Exhausted.
	drops := n.metric(maps.ReasonMasqNoPort, maps.DirEgress)
	full := f.frame(f.pod, f.world, protoTCP, 41009, 80, 0)
	n.fromPod(full)
	if ret, _ := n.egress(full); ret != 2 {
		t.Fatalf("flow beyond the range: verdict %d, want a drop", ret)
	}
	if n.metric(maps.ReasonMasqNoPort, maps.DirEgress) != drops+1 {
		t.Fatalf("exhaustion not counted under %q", maps.ReasonName(maps.ReasonMasqNoPort))
	}
	// The other flow ends: its port is free for the taking (its mapping
	// is old enough once its conntrack entry is gone).
	if err := n.l.Maps().CTMap().Delete(otherCT); err != nil {
		t.Fatal(err)
	}
	other.Created = maps.MonotonicNow() - 3e9
	if err := n.l.Maps().NAT.NATMap().Upsert(other); err != nil {
		t.Fatal(err)
	}
	ret, out := n.egress(full)
	if ret != 0 {
		t.Fatalf("flow after a mapping's flow ended: verdict %d", ret)
	}
	if src, _ := f.tuple(out); src.Port() != 62001 {
		t.Fatalf("flow got port %d, want the freed 62001", src.Port())
	}
	list, _ := n.l.Maps().NAT.NATMap().List()
	for _, m := range list {
		if m.Pod == other.Pod {
			t.Fatalf("the taken-over mapping is still there: %+v", m)
		}
	}
	return list
}

// checkMasqFreshPorts is TestPrivilegedMasqueradePrefersFreshPorts of
// family f, on n with the range 63000-63001.
func checkMasqFreshPorts(t *testing.T, n *masqNode, f ipFamily) {
	t.Helper()
	dead := maps.NATMapping{Proto: protoTCP, Pod: f.otherPod, PodPort: 45000, Remote: f.world, RemotePort: 80,
		Node: f.node, NodePort: 63000, Created: maps.MonotonicNow() - 5e9}
	if err := n.l.Maps().NAT.NATMap().Upsert(dead); err != nil {
		t.Fatal(err)
	}
	for i, want := range []uint16{63001, 63000} {
		fr := f.frame(f.pod, f.world, protoTCP, uint16(42000+i), 80, 0)
		n.fromPod(fr)
		ret, out := n.egress(fr)
		if ret != 0 {
			t.Fatalf("flow %d: verdict %d", i, ret)
		}
		if src, _ := f.tuple(out); src.Port() != want {
			t.Fatalf("flow %d got port %d, want %d", i, src.Port(), want)
		}
	}
	list, _ := n.l.Maps().NAT.NATMap().List()
	if len(list) != 2 {
		t.Fatalf("%d mappings, want the two new ones: %+v", len(list), list)
	}
	for _, m := range list {
		if m.Pod != f.pod || m.Orphan {
			t.Fatalf("mapping %+v: the dead one (or half of it) is left", m)
		}
	}
}

// icmpError builds an ICMP destination unreachable from src to dst quoting
// the IP packet of frame q (its header and first 8 bytes of L4), with
// every checksum right.
func icmpError(src, dst netip.Addr, q []byte) []byte {
	quoted := q[14 : 14+20+8]
	icmp := append([]byte{3, 3, 0, 0, 0, 0, 0, 0}, quoted...)
	binary.BigEndian.PutUint16(icmp[2:], ^sum16(0, icmp))
	ip := make([]byte, 20)
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:], uint16(20+len(icmp)))
	ip[8] = 64
	ip[9] = protoICMP
	s, d := src.As4(), dst.As4()
	copy(ip[12:], s[:])
	copy(ip[16:], d[:])
	binary.BigEndian.PutUint16(ip[10:], ^sum16(0, ip))
	eth := make([]byte, 14)
	binary.BigEndian.PutUint16(eth[12:], 0x0800)
	return append(append(eth, ip...), icmp...)
}

// TestPrivilegedMasqueradeICMPErrors: an ICMP error about a masqueraded
// flow (sent to the node, quoting the packet as it left) reaches the pod
// quoting the pod's own tuple, every checksum right; an error about no
// mapping passes untouched.
func TestPrivilegedMasqueradeICMPErrors(t *testing.T) {
	n := newMasqNode(t, 61000, 61999)
	out := frame(pod, world, protoUDP, 40001, 53, 0)
	n.fromPod(out)
	_, left := n.egress(out)
	src, _ := tuple(left)
	router := netip.MustParseAddr("203.0.113.1")
	ret, got := n.ingress(icmpError(router, node, left))
	if ret != 0 {
		t.Fatalf("verdict %d", ret)
	}
	if dst := netip.AddrFrom4([4]byte(got[30:34])); dst != pod {
		t.Fatalf("error delivered to %s, want the pod %s", dst, pod)
	}
	inner := got[14+20+8:]
	if s := netip.AddrFrom4([4]byte(inner[12:16])); s != pod || binary.BigEndian.Uint16(inner[20:]) != 40001 {
		t.Fatalf("error quotes %s:%d, want %s:40001 (it left as %s)", s, binary.BigEndian.Uint16(inner[20:]), pod, src)
	}
	if sum16(0, got[14:34]) != 0xffff || sum16(0, inner[:20]) != 0xffff {
		t.Fatal("outer or quoted IPv4 header checksum wrong")
	}
	if sum16(0, got[34:]) != 0xffff {
		t.Fatal("ICMP checksum wrong")
	}
	// About a flow that has no mapping: untouched.
	stray := frame(node, world, protoUDP, 61999, 53, 0)
	e := icmpError(router, node, stray)
	if ret, g := n.ingress(e); ret != 0 || string(g) != string(e) {
		t.Fatalf("error about no mapping: verdict %d, changed %v", ret, string(g) != string(e))
	}
}

// frame6 builds Ethernet + IPv6 + TCP/UDP or ICMPv6 echo (icmpType,
// sport as the identifier) with the L4 checksum right.
func frame6(src, dst netip.Addr, proto uint8, sport, dport uint16, icmpType uint8) []byte {
	var l4 []byte
	switch proto {
	case protoTCP:
		l4 = make([]byte, 20+4)
		binary.BigEndian.PutUint16(l4[0:], sport)
		binary.BigEndian.PutUint16(l4[2:], dport)
		l4[12] = 5 << 4
		l4[13] = 0x02
	case protoUDP:
		l4 = make([]byte, 8+4)
		binary.BigEndian.PutUint16(l4[0:], sport)
		binary.BigEndian.PutUint16(l4[2:], dport)
		binary.BigEndian.PutUint16(l4[4:], uint16(len(l4)))
	default:
		l4 = make([]byte, 8+4)
		l4[0] = icmpType
		binary.BigEndian.PutUint16(l4[4:], sport)
		binary.BigEndian.PutUint16(l4[6:], 1)
	}
	ip := make([]byte, 40)
	ip[0] = 0x60
	binary.BigEndian.PutUint16(ip[4:], uint16(len(l4)))
	ip[6] = proto
	ip[7] = 64
	s, d := src.As16(), dst.As16()
	copy(ip[8:], s[:])
	copy(ip[24:], d[:])
	eth := make([]byte, 14)
	binary.BigEndian.PutUint16(eth[12:], 0x86DD)
	f := append(append(eth, ip...), l4...)
	binary.BigEndian.PutUint16(f[54+csumOffset6(proto):], ^l4Sum6(f))
	return f
}

func csumOffset6(proto uint8) int {
	if proto == protoICMPv6 {
		return 2
	}
	return csumOffset(proto)
}

const protoICMPv6 = 58

// l4Sum6 sums an IPv6 frame's L4 segment with its pseudo-header.
func l4Sum6(f []byte) uint16 {
	n := int(binary.BigEndian.Uint16(f[18:]))
	seg := f[54 : 54+n]
	sum := uint32(sum16(0, f[22:54])) + uint32(f[20]) + uint32(n)
	return sum16(sum, seg)
}

func tuple6(f []byte) (netip.AddrPort, netip.AddrPort) {
	src, dst := netip.AddrFrom16([16]byte(f[22:38])), netip.AddrFrom16([16]byte(f[38:54]))
	if f[20] == protoICMPv6 {
		id := binary.BigEndian.Uint16(f[58:])
		return netip.AddrPortFrom(src, id), netip.AddrPortFrom(dst, id)
	}
	return netip.AddrPortFrom(src, binary.BigEndian.Uint16(f[54:])), netip.AddrPortFrom(dst, binary.BigEndian.Uint16(f[56:]))
}

// TestPrivilegedMasqueradeIPv6: the IPv4 cases for IPv6: TCP, UDP and
// ICMPv6 echo leave with the node's IPv6 address and a port of the range,
// their L4 checksums (pseudo-header included, ICMPv6's too) right; later
// packets keep the mapping; replies come back to the pod; the NAT table
// lists the mappings; traffic to an in-cluster pod and the host's own
// pass untouched.
func TestPrivilegedMasqueradeIPv6(t *testing.T) {
	const lo, hi = 61000, 61999
	n := newMasqNode(t, lo, hi)
	for _, tc := range []struct {
		proto        uint8
		sport, dport uint16
		req, rep     uint8
	}{
		{protoTCP, 40000, 80, 0, 0},
		{protoUDP, 40001, 53, 0, 0},
		{protoICMPv6, 7, 0, 128, 129},
	} {
		out := frame6(pod6, world6, tc.proto, tc.sport, tc.dport, tc.req)
		n.fromPod(out)
		ret, got := n.egress(out)
		if ret != 0 {
			t.Fatalf("proto %d: egress verdict %d", tc.proto, ret)
		}
		src, dst := tuple6(got)
		if src.Addr() != node6 || !inRange(src.Port(), lo, hi) || dst.Addr() != world6 {
			t.Fatalf("proto %d: masqueraded %s -> %s, want %s:<%d-%d> -> %s", tc.proto, src, dst, node6, lo, hi, world6)
		}
		if s := l4Sum6(got); s != 0xffff {
			t.Fatalf("proto %d: L4 checksum wrong after masquerade (sum %#x)", tc.proto, s)
		}
		if _, again := n.egress(out); func() bool { s2, _ := tuple6(again); return s2 != src }() {
			t.Fatalf("proto %d: the second packet left with another mapping", tc.proto)
		}
		var reply []byte
		if tc.proto == protoICMPv6 {
			reply = frame6(world6, node6, protoICMPv6, src.Port(), 0, tc.rep)
		} else {
			reply = frame6(world6, node6, tc.proto, tc.dport, src.Port(), 0)
		}
		ret, back := n.ingress(reply)
		if ret != 0 {
			t.Fatalf("proto %d: ingress verdict %d", tc.proto, ret)
		}
		if _, bd := tuple6(back); bd.Addr() != pod6 || bd.Port() != tc.sport {
			t.Fatalf("proto %d: reply translated to %s, want %s:%d", tc.proto, bd, pod6, tc.sport)
		}
		if s := l4Sum6(back); s != 0xffff {
			t.Fatalf("proto %d: L4 checksum wrong after the reverse translation (sum %#x)", tc.proto, s)
		}
	}
	list, err := n.l.Maps().NAT.NATMap().List()
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 3 {
		t.Fatalf("%d mappings, want 3: %+v", len(list), list)
	}
	for _, m := range list {
		if m.Orphan || m.Pod != pod6 || m.Node != node6 {
			t.Errorf("mapping %+v", m)
		}
	}
	for what, f := range map[string][]byte{
		"to an in-cluster pod":   frame6(pod6, peerPod6, protoTCP, 40010, 80, 0),
		"the host's own traffic": frame6(node6, world6, protoTCP, 40012, 80, 0),
	} {
		if ret, got := n.egress(f); ret != 0 || string(got) != string(f) {
			t.Errorf("%s: verdict %d, changed %v", what, ret, string(got) != string(f))
		}
	}
	// The GC collects an IPv6 mapping whose flow is gone.
	if err := n.l.Maps().CTMap().Delete(maps.CTEntry{Proto: protoUDP, Src: pod6, SrcPort: 40001, Dst: world6, DstPort: 53}); err != nil {
		t.Fatal(err)
	}
	res, err := n.l.Maps().NAT.NATMap().CollectNAT(n.l.Maps().CTMap(), maps.MonotonicNow()+uint64(maps.NATMinAge.Nanoseconds())+1e9)
	if err != nil || res.Deleted != 1 {
		t.Fatalf("GC deleted %d IPv6 mappings (%v), want 1", res.Deleted, err)
	}
}
