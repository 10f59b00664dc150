package loader

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"testing"

	"github.com/tendril-net/tendril/pkg/datapath/maps"
	"github.com/tendril-net/tendril/pkg/loadbalancer/maglev"
)

// Per-packet service translation in the pod programs (bpf/lib/lbnat.h),
// with BPF_PROG_TEST_RUN on crafted frames whose L4 checksums are valid, so
// that the rewritten frames' checksums can be checked.

// l4Off is the offset of the L4 header in a frame of ours (no IP options
// or extension headers).
func l4Off(frame []byte) int {
	if binary.BigEndian.Uint16(frame[12:]) == 0x0800 {
		return 14 + 20
	}
	return 14 + 40
}

func frameAddrs(frame []byte) (src, dst netip.Addr, proto uint8, segLen int) {
	if binary.BigEndian.Uint16(frame[12:]) == 0x0800 {
		return netip.AddrFrom4([4]byte(frame[26:30])), netip.AddrFrom4([4]byte(frame[30:34])), frame[23],
			int(binary.BigEndian.Uint16(frame[16:])) - 20
	}
	return netip.AddrFrom16([16]byte(frame[22:38])), netip.AddrFrom16([16]byte(frame[38:54])), frame[20],
		int(binary.BigEndian.Uint16(frame[18:]))
}

// frameTuple is the frame's source and destination.
func frameTuple(frame []byte) (netip.AddrPort, netip.AddrPort) {
	src, dst, _, _ := frameAddrs(frame)
	l4 := frame[l4Off(frame):]
	return netip.AddrPortFrom(src, binary.BigEndian.Uint16(l4[0:])), netip.AddrPortFrom(dst, binary.BigEndian.Uint16(l4[2:]))
}

// l4Sum is the one's complement sum of the frame's pseudo-header and L4
// segment (checksum field included as it is).
func l4Sum(frame []byte) uint16 {
	src, dst, proto, n := frameAddrs(frame)
	seg := frame[l4Off(frame) : l4Off(frame)+n]
	var sum uint32
	add := func(b []byte) {
		for i := 0; i < len(b); i += 2 {
			if i+1 < len(b) {
				sum += uint32(binary.BigEndian.Uint16(b[i:]))
			} else {
				sum += uint32(b[i]) << 8
			}
		}
	}
	add(src.AsSlice())
	add(dst.AsSlice())
	add([]byte{0, proto, byte(n >> 8), byte(n)})
	add(seg)
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	return uint16(sum)
}

func csumOff(frame []byte) int {
	_, _, proto, _ := frameAddrs(frame)
	if proto == 6 {
		return l4Off(frame) + 16
	}
	return l4Off(frame) + 6
}

// withL4Checksum fills the frame's TCP/UDP checksum.
func withL4Checksum(frame []byte) []byte {
	off := csumOff(frame)
	binary.BigEndian.PutUint16(frame[off:], 0)
	binary.BigEndian.PutUint16(frame[off:], ^l4Sum(frame))
	return frame
}

func checkChecksums(t *testing.T, what string, frame []byte) {
	t.Helper()
	if s := l4Sum(frame); s != 0xffff {
		t.Errorf("%s: L4 checksum wrong (sum %#x)", what, s)
	}
	if binary.BigEndian.Uint16(frame[12:]) == 0x0800 && ipv4Checksum(frame[14:34]) != 0 {
		t.Errorf("%s: IPv4 header checksum wrong", what)
	}
}

func (n *testNode) lbService(fe maps.Frontend, svc maps.Service, first uint32, backends ...netip.AddrPort) []uint32 {
	n.t.Helper()
	lb := n.l.Maps().LB
	var ids []uint32
	for i, b := range backends {
		id := first + uint32(i)
		if err := lb.BackendMap().Upsert(id, maps.Backend{Addr: b.Addr(), Port: b.Port()}); err != nil {
			n.t.Fatal(err)
		}
		ids = append(ids, id)
	}
	if err := lb.ApplyService(fe, svc, ids, 0); err != nil {
		n.t.Fatal(err)
	}
	return ids
}

func tcpFE(a string, port uint16) maps.Frontend {
	return maps.Frontend{Addr: netip.MustParseAddr(a), Port: port, Proto: maps.ProtoTCP}
}

// TestPrivilegedServiceTranslation: a pod's packet to a ClusterIP is sent
// to the backend (address and port rewritten, IPv4 and TCP checksums still
// valid); policy decides on the backend's identity and port — A may reach
// the remote backend's identity on 8080 and nothing else, so a service
// whose backend is elsewhere is denied — later packets of the flow keep the
// backend; the backend's reply reaches A from the frontend's address and
// port; a frontend without backends drops with its reason.
func TestPrivilegedServiceTranslation(t *testing.T) {
	n := newTestNode(t)
	n.addEndpoints(false, true)
	n.allow(1, maps.DirEgress, idRemote, 6, 8080)
	from, to := n.l.Programs()
	fe := netip.MustParseAddrPort("10.96.0.10:80")
	backend := netip.MustParseAddrPort("10.2.0.9:8080")
	n.lbService(tcpFE("10.96.0.10", 80), maps.Service{ID: 1, RevNATID: 1}, 1, backend)

	syn := withL4Checksum(packet(podA, fe.Addr(), l4{proto: 6, sport: 40000, dport: 80, tcpFlags: 0x02}))
	verdict, out := n.runOut(from, n.ifidx, syn)
	if verdict != actOK {
		t.Fatalf("SYN to the service = %d, want pass", verdict)
	}
	if src, dst := frameTuple(out); dst != backend || src != netip.AddrPortFrom(podA, 40000) {
		t.Errorf("translated SYN %s -> %s, want %s -> %s", src, dst, netip.AddrPortFrom(podA, 40000), backend)
	}
	checkChecksums(t, "translated SYN", out)

	for i := 0; i < 3; i++ {
		ack := withL4Checksum(packet(podA, fe.Addr(), l4{proto: 6, sport: 40000, dport: 80, tcpFlags: 0x10, payload: []byte(fmt.Sprintf("data %d", i))}))
		verdict, out := n.runOut(from, n.ifidx, ack)
		if _, dst := frameTuple(out); verdict != actOK || dst != backend {
			t.Errorf("packet %d of the flow: verdict %d to %s", i, verdict, dst)
		}
		checkChecksums(t, "established packet", out)
	}

	reply := withL4Checksum(packet(backend.Addr(), podA, l4{proto: 6, sport: 8080, dport: 40000, tcpFlags: 0x12, payload: []byte("hello")}))
	verdict, out = n.runOut(to, n.ifidx, reply)
	if verdict != actOK {
		t.Fatalf("backend's reply = %d, want pass", verdict)
	}
	if src, _ := frameTuple(out); src != fe {
		t.Errorf("reply delivered from %s, want the frontend %s", src, fe)
	}
	checkChecksums(t, "reverse-translated reply", out)

	// Policy is the backend's: a service whose backend A may not reach
	// is denied, although A may reach the first backend's port.
	n.lbService(tcpFE("10.96.0.11", 8080), maps.Service{ID: 2, RevNATID: 2}, 2, netip.MustParseAddrPort("10.1.0.3:8080"))
	denied := n.metric(maps.ReasonPolicyDenied, maps.DirEgress)
	if got := n.fromPod(n.ifidx, withL4Checksum(packet(podA, netip.MustParseAddr("10.96.0.11"), l4{proto: 6, sport: 40001, dport: 8080, tcpFlags: 0x02}))); got != actShot {
		t.Errorf("SYN to a service of a denied backend = %d, want drop", got)
	}
	if n.metric(maps.ReasonPolicyDenied, maps.DirEgress) != denied+1 {
		t.Error("the denied service's SYN was not counted as a policy drop")
	}

	n.lbService(tcpFE("10.96.0.12", 80), maps.Service{ID: 3, RevNATID: 3}, 3)
	if got := n.fromPod(n.ifidx, withL4Checksum(packet(podA, netip.MustParseAddr("10.96.0.12"), l4{proto: 6, sport: 40002, dport: 80, tcpFlags: 0x02}))); got != actShot {
		t.Errorf("SYN to a service without backends = %d, want drop", got)
	}
	if n.metric(maps.ReasonSvcNoBackend, maps.DirEgress) != 1 {
		t.Errorf("%q counted %d times, want 1", maps.ReasonName(maps.ReasonSvcNoBackend), n.metric(maps.ReasonSvcNoBackend, maps.DirEgress))
	}
}

// TestPrivilegedServiceMaglevAndAffinity: a Maglev service sends each flow
// to the backend the Go table has at the flow's hash (maps.LBHashTuple);
// with ClientIP affinity, every flow of one client goes to one backend.
func TestPrivilegedServiceMaglevAndAffinity(t *testing.T) {
	n := newTestNode(t)
	n.addEndpoints(false, false)
	from, _ := n.l.Programs()
	backs := []netip.AddrPort{netip.MustParseAddrPort("10.2.0.1:8080"), netip.MustParseAddrPort("10.2.0.2:8080"), netip.MustParseAddrPort("10.2.0.3:8080")}
	ids := n.lbService(tcpFE("10.96.0.20", 80), maps.Service{ID: 5, RevNATID: 5, Flags: maps.SvcFlagMaglev}, 10, backs...)
	var mb []maglev.Backend
	addr := map[uint32]netip.AddrPort{}
	for i, id := range ids {
		mb = append(mb, maglev.Backend{Key: backs[i].String(), ID: id, Weight: 1})
		addr[id] = backs[i]
	}
	table, err := maglev.Table(mb, maglev.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	if err := n.l.Maps().LB.MaglevMap().Upsert(5, table); err != nil {
		t.Fatal(err)
	}
	fe := netip.MustParseAddrPort("10.96.0.20:80")
	seen := map[netip.AddrPort]bool{}
	for port := uint16(41000); port < 41030; port++ {
		_, out := n.runOut(from, n.ifidx, withL4Checksum(packet(podA, fe.Addr(), l4{proto: 6, sport: port, dport: 80, tcpFlags: 0x02})))
		_, dst := frameTuple(out)
		want := addr[table[maps.LBHashTuple(netip.AddrPortFrom(podA, port), fe, 6)%maps.LBMaglevTableSize]]
		if dst != want {
			t.Errorf("flow from port %d went to %s, the Maglev table says %s", port, dst, want)
		}
		seen[dst] = true
	}
	if len(seen) < 2 {
		t.Errorf("30 flows all went to %v", seen)
	}

	n.lbService(tcpFE("10.96.0.21", 80), maps.Service{ID: 6, RevNATID: 6, Flags: maps.SvcFlagAffinity, AffinityTimeout: 60}, 20, backs...)
	var first netip.AddrPort
	for port := uint16(42000); port < 42020; port++ {
		_, out := n.runOut(from, n.ifidx, withL4Checksum(packet(podA, netip.MustParseAddr("10.96.0.21"), l4{proto: 6, sport: port, dport: 80, tcpFlags: 0x02})))
		_, dst := frameTuple(out)
		if port == 42000 {
			first = dst
		} else if dst != first {
			t.Fatalf("flow from port %d went to %s, the first to %s: no affinity", port, dst, first)
		}
	}
	a, ok, err := n.l.Maps().LB.AffinityMap().Lookup(maps.AffinityKey{Client: podA, ServiceID: 6})
	if err != nil || !ok || a.BackendID < 20 || a.BackendID > 22 || backs[a.BackendID-20] != first {
		t.Errorf("affinity of %s = %+v, %v, %v; flows went to %s", podA, a, ok, err, first)
	}
}

// TestPrivilegedServiceTranslationIPv6: UDP to an IPv6 frontend is sent to
// the backend with a valid UDP checksum (mandatory over IPv6), and the
// reply comes from the frontend.
func TestPrivilegedServiceTranslationIPv6(t *testing.T) {
	n := newTestNode(t)
	n.addEndpoints(false, false)
	from, to := n.l.Programs()
	fe := netip.MustParseAddrPort("[fd00:96::10]:53")
	backend := netip.MustParseAddrPort("[fd00:2::9]:5353")
	n.lbService(maps.Frontend{Addr: fe.Addr(), Port: 53, Proto: maps.ProtoUDP}, maps.Service{ID: 1, RevNATID: 1}, 1, backend)
	q := withL4Checksum(packet(podA6, fe.Addr(), l4{proto: 17, sport: 33000, dport: 53, payload: []byte("query")}))
	verdict, out := n.runOut(from, n.ifidx, q)
	if _, dst := frameTuple(out); verdict != actOK || dst != backend {
		t.Fatalf("IPv6 query: verdict %d to %s, want pass to %s", verdict, dst, backend)
	}
	checkChecksums(t, "translated IPv6 query", out)
	r := withL4Checksum(packet(backend.Addr(), podA6, l4{proto: 17, sport: 5353, dport: 33000, payload: []byte("answer")}))
	verdict, out = n.runOut(to, n.ifidx, r)
	if src, _ := frameTuple(out); verdict != actOK || src != fe {
		t.Errorf("IPv6 answer: verdict %d from %s, want pass from %s", verdict, src, fe)
	}
	checkChecksums(t, "reverse-translated IPv6 answer", out)
}

// TestPrivilegedServiceTranslationDirect: a service whose backend is a
// local pod taking direct delivery: A's packet is translated and
// redirected into B with B's ingress policy checked against A's identity;
// B's reply, redirected into A by B's program (A's to_pod does not run),
// carries the frontend as its source.
func TestPrivilegedServiceTranslationDirect(t *testing.T) {
	n := newTestNode(t)
	n.addDirectEndpoints()
	n.allow(2, maps.DirIngress, idA, 6, 8080)
	from, _ := n.l.Programs()
	fe := netip.MustParseAddrPort("10.96.0.30:80")
	backend := netip.AddrPortFrom(podB, 8080)
	n.lbService(tcpFE("10.96.0.30", 80), maps.Service{ID: 1, RevNATID: 1}, 1, backend)
	verdict, out := n.runOut(from, n.ifidx, withL4Checksum(packet(podA, fe.Addr(), l4{proto: 6, sport: 40000, dport: 80, tcpFlags: 0x02})))
	if verdict != actRedirect {
		t.Fatalf("SYN to a local backend = %d, want redirect", verdict)
	}
	if _, dst := frameTuple(out); dst != backend {
		t.Errorf("SYN delivered to %s, want %s", dst, backend)
	}
	checkChecksums(t, "directly delivered SYN", out)
	verdict, out = n.runOut(from, n.ifidx2, withL4Checksum(packet(podB, podA, l4{proto: 6, sport: 8080, dport: 40000, tcpFlags: 0x12})))
	if verdict != actRedirect {
		t.Fatalf("B's reply = %d, want redirect", verdict)
	}
	if src, _ := frameTuple(out); src != fe {
		t.Errorf("B's reply delivered from %s, want the frontend %s", src, fe)
	}
	checkChecksums(t, "directly delivered reply", out)
	// Without B's rule for A, the service gives A no way around it.
	if err := n.l.Maps().PolicyMap().Delete(maps.PolicyKey{EndpointID: 2, Direction: maps.DirIngress, Identity: idA, Proto: 6, Port: 8080, PortPrefixLen: 16}); err != nil {
		t.Fatal(err)
	}
	if got := n.fromPod(n.ifidx, withL4Checksum(packet(podA, fe.Addr(), l4{proto: 6, sport: 40003, dport: 80, tcpFlags: 0x02}))); got != actShot {
		t.Errorf("SYN to the service without B's ingress rule = %d, want drop", got)
	}
}

// BenchmarkPrivilegedFromPodService: what the per-packet service lookup
// adds to from_pod, on an established TCP flow from pod A to a remote
// backend: sent to the backend's address (no service hit: the lookup
// misses), and sent to a ClusterIP (hit: the flow's backend from the
// flows map, the destination rewritten), with one service in the maps and
// with 10,000 and 100,000 (the lookup is a hash: the size must not
// matter). Read prog-ns/packet (the kernel's run-time statistics); ns/run
// includes the system call.
func BenchmarkPrivilegedFromPodService(b *testing.B) {
	backend := netip.MustParseAddrPort("10.2.0.9:8080")
	fe := netip.MustParseAddrPort("10.96.0.10:80")
	for _, c := range []struct {
		name     string
		services int
		dst      netip.AddrPort
	}{
		{"no-service-hit", 1, backend},
		{"service-hit", 1, fe},
		{"no-service-hit-10k-services", 10000, backend},
		{"service-hit-10k-services", 10000, fe},
		// Beyond layout 3's 65,536 frontends.
		{"service-hit-100k-services", 100000, fe},
	} {
		b.Run(c.name, func(b *testing.B) {
			n := newNode(b)
			n.addEndpoints(false, true)
			n.allow(1, maps.DirEgress, idRemote, 6, 8080)
			n.lbService(tcpFE(fe.Addr().String(), fe.Port()), maps.Service{ID: 1, RevNATID: 1}, 1, backend)
			// More services beside it, sharing its backend.
			ip := netip.MustParseAddr("10.97.0.1")
			for id := uint32(2); id <= uint32(c.services); id++ {
				if err := n.l.Maps().LB.ApplyService(tcpFE(ip.String(), 80), maps.Service{ID: id, RevNATID: id}, []uint32{1}, 0); err != nil {
					b.Fatal(err)
				}
				ip = ip.Next()
			}
			syn := withL4Checksum(packet(podA, c.dst.Addr(), l4{proto: 6, sport: 40000, dport: c.dst.Port(), tcpFlags: 0x02}))
			from, _ := n.l.Programs()
			verdict, out := n.runOut(from, n.ifidx, syn)
			if _, dst := frameTuple(out); verdict != actOK || dst != backend {
				b.Fatalf("SYN to %s: verdict %d, sent to %s, want pass to %s", c.dst, verdict, dst, backend)
			}
			ack := withL4Checksum(packet(podA, c.dst.Addr(), l4{proto: 6, sport: 40000, dport: c.dst.Port(), tcpFlags: 0x10}))
			// Repeat 1: a repeated run sees the packet the previous run
			// rewrote (the backend's address), not the service's.
			benchFromPod(b, n, n.ifidx, func(int) []byte { return ack }, 1)
		})
	}
}
