package loader

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/tendril-net/tendril/pkg/datapath/maps"
	"github.com/tendril-net/tendril/pkg/testutil"
	"github.com/tendril-net/tendril/pkg/testutil/netlab"
)

const (
	actOK   = 0
	actShot = 2
)

// testNode is a loaded datapath in a throw-away network namespace with one
// veth pair whose host side stands for a pod's veth.
type testNode struct {
	t      testing.TB
	l      *Loader
	ifidx  int
	ifidx2 int
}

func randHex() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// newTestNode locks the goroutine's thread into a new netns for the whole
// test: BPF_PROG_TEST_RUN resolves the context's ifindex in the caller's
// namespace.
func newTestNode(t *testing.T) *testNode { return newNode(t) }

// newBenchNode is newTestNode for benchmarks; egress is not enforced and
// the flow to the remote is allowed.
func newBenchNode(b *testing.B) *testNode {
	n := newNode(b)
	n.addEndpoints(true, false)
	return n
}

func newNode(t testing.TB) *testNode { return newNodeWith(t, Config{DirectDelivery: true}) }

// newNodeWith is newNode with the loader's options (its BPF root is the
// test's own).
func newNodeWith(t testing.TB, cfg Config) *testNode {
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
	n := &testNode{t: t, ifidx: netlab.AddVeth(t, "tdrtest0", "tdrpeer0"), ifidx2: netlab.AddVeth(t, "tdrtest1", "tdrpeer1")}
	root := filepath.Join("/sys/fs/bpf", "tendril-dptest-"+randHex())
	cfg.BPFRoot = root
	n.l = New(cfg, nil)
	// Registered before Start: a start that fails has pinned maps already.
	t.Cleanup(func() { _ = n.l.Remove() })
	if err := n.l.Start(); err != nil {
		t.Fatal(err)
	}
	return n
}

// skbContext is the start of struct __sk_buff up to ifindex (offset 40).
type skbContext struct {
	Fields [11]uint32
}

func (n *testNode) run(prog *ebpf.Program, ifindex int, pkt []byte) uint32 {
	n.t.Helper()
	ctx := skbContext{}
	ctx.Fields[10] = uint32(ifindex)
	ret, err := prog.Run(&ebpf.RunOptions{Data: pkt, Context: ctx})
	if err != nil {
		n.t.Fatalf("test run (%d bytes): %v", len(pkt), err)
	}
	return ret
}

func (n *testNode) fromPod(ifindex int, pkt []byte) uint32 {
	from, _ := n.l.Programs()
	return n.run(from, ifindex, pkt)
}

func (n *testNode) toPod(ifindex int, pkt []byte) uint32 {
	_, to := n.l.Programs()
	return n.run(to, ifindex, pkt)
}

func (n *testNode) metric(reason, dir uint8) uint64 {
	row, err := n.l.Maps().MetricsMap().Lookup(reason, dir)
	if err != nil {
		n.t.Fatal(err)
	}
	return row.Packets
}

var (
	podA   = netip.MustParseAddr("10.1.0.2")
	podB   = netip.MustParseAddr("10.1.0.3")
	remote = netip.MustParseAddr("10.2.0.9")
	podA6  = netip.MustParseAddr("fd00::a")
	podB6  = netip.MustParseAddr("fd00::b")
	rem6   = netip.MustParseAddr("fd00:2::9")
)

const (
	idA      = 1000
	idB      = 1001
	idRemote = 2000
)

func (n *testNode) addEndpoints(enforceIngress, enforceEgress bool) {
	n.t.Helper()
	eps := []EndpointInfo{
		{ID: 1, IfIndex: n.ifidx, IfName: "tdrtest0", Addresses: []netip.Addr{podA, podA6}, Identity: idA, EnforceIngress: enforceIngress, EnforceEgress: enforceEgress, MAC: net.HardwareAddr{2, 0, 0, 0, 0, 1}},
		{ID: 2, IfIndex: n.ifidx2, IfName: "tdrtest1", Addresses: []netip.Addr{podB, podB6}, Identity: idB, EnforceIngress: enforceIngress, EnforceEgress: enforceEgress},
	}
	for _, ep := range eps {
		if err := n.l.AttachEndpoint(ep); err != nil {
			n.t.Fatal(err)
		}
	}
	m := n.l.Maps()
	for p, id := range map[string]uint32{"10.1.0.2/32": idA, "10.1.0.3/32": idB, "10.2.0.0/24": idRemote, "fd00::a/128": idA, "fd00::b/128": idB, "fd00:2::/64": idRemote} {
		if err := m.IPCacheMap().Upsert(netip.MustParsePrefix(p), maps.IPCacheEntry{Identity: id}); err != nil {
			n.t.Fatal(err)
		}
	}
}

func (n *testNode) allow(ep uint16, dir uint8, id uint32, proto uint8, port uint16) {
	n.t.Helper()
	k := maps.PolicyKey{EndpointID: ep, Direction: dir, Identity: id, Proto: proto, Port: port}
	if port != 0 {
		k.PortPrefixLen = 16
	}
	if err := n.l.Maps().PolicyMap().Upsert(k, maps.PolicyValue{Cookie: 7}); err != nil {
		n.t.Fatal(err)
	}
}

func TestPrivilegedDatapathPaths(t *testing.T) {
	n := newTestNode(t)
	n.addEndpoints(true, true)
	m := n.l.Maps()
	tcp := func(sp, dp uint16, flags uint8) l4 { return l4{proto: 6, sport: sp, dport: dp, tcpFlags: flags} }
	const syn, ack = 0x02, 0x10

	// Egress: nothing allowed yet.
	if got := n.fromPod(n.ifidx, packet(podA, remote, tcp(40000, 80, syn))); got != actShot {
		t.Fatalf("egress without policy = %d, want drop", got)
	}
	if n.metric(maps.ReasonPolicyDenied, maps.DirEgress) != 1 {
		t.Fatal("policy drop not counted")
	}
	// Egress by identity and port.
	n.allow(1, maps.DirEgress, idRemote, 6, 80)
	if got := n.fromPod(n.ifidx, packet(podA, remote, tcp(40000, 80, syn))); got != actOK {
		t.Fatalf("egress allowed by identity+port = %d", got)
	}
	if got := n.fromPod(n.ifidx, packet(podA, remote, tcp(40000, 81, syn))); got != actShot {
		t.Fatalf("egress to another port = %d, want drop", got)
	}
	if got := n.fromPod(n.ifidx, packet(podA, remote, l4{proto: 17, sport: 5000, dport: 80})); got != actShot {
		t.Fatalf("egress UDP/80 under a TCP/80 rule = %d, want drop", got)
	}
	// The reply of the allowed connection passes ingress without an
	// ingress rule.
	if got := n.toPod(n.ifidx, packet(remote, podA, tcp(80, 40000, syn|ack))); got != actOK {
		t.Fatalf("reply = %d", got)
	}
	if n.metric(maps.ReasonCTReply, maps.DirIngress) != 1 {
		t.Fatal("reply not counted as such")
	}
	// A new connection from the remote is subject to ingress policy.
	if got := n.toPod(n.ifidx, packet(remote, podA, tcp(50000, 22, syn))); got != actShot {
		t.Fatalf("ingress without rule = %d, want drop", got)
	}
	// Ingress by identity.
	n.allow(1, maps.DirIngress, idB, 6, 8080)
	if got := n.toPod(n.ifidx, packet(podB, podA, tcp(41000, 8080, syn))); got != actOK {
		t.Fatalf("ingress from B allowed = %d", got)
	}
	if got := n.toPod(n.ifidx, packet(remote, podA, tcp(41000, 8080, syn))); got != actShot {
		t.Fatalf("ingress from remote to 8080 = %d, want drop", got)
	}
	// Port range 9000-9100 for any identity.
	for _, pr := range maps.PortRangePrefixes(9000, 9100) {
		if err := m.PolicyMap().Upsert(maps.PolicyKey{EndpointID: 1, Direction: maps.DirIngress, Proto: 17, Port: pr.Port, PortPrefixLen: pr.PrefixLen}, maps.PolicyValue{}); err != nil {
			t.Fatal(err)
		}
	}
	for port, want := range map[uint16]uint32{8999: actShot, 9000: actOK, 9050: actOK, 9100: actOK, 9101: actShot} {
		if got := n.toPod(n.ifidx, packet(remote, podA, l4{proto: 17, sport: 1234, dport: port})); got != want {
			t.Errorf("UDP port %d = %d, want %d", port, got, want)
		}
	}
	// Deny wins: a deny of everything from the remote identity beats the
	// any-identity port range.
	if err := m.PolicyMap().Upsert(maps.PolicyKey{EndpointID: 1, Direction: maps.DirIngress, Identity: idRemote}, maps.PolicyValue{Deny: true}); err != nil {
		t.Fatal(err)
	}
	if got := n.toPod(n.ifidx, packet(remote, podA, l4{proto: 17, sport: 1235, dport: 9050})); got != actShot {
		t.Fatalf("deny precedence = %d, want drop", got)
	}
	if n.metric(maps.ReasonPolicyDenyRule, maps.DirIngress) == 0 {
		t.Fatal("deny rule drop not counted")
	}
	// Established flows are not re-checked by the datapath: the earlier
	// allowed UDP flow still passes (the agent revokes the flows a change
	// denies in their entries: TestPrivilegedConntrackRevokedSide).
	if got := n.toPod(n.ifidx, packet(remote, podA, l4{proto: 17, sport: 1234, dport: 9050})); got != actOK {
		t.Fatalf("established flow = %d", got)
	}

	// ICMP errors: related to A's allowed egress connection → pass; about
	// a flow that never existed → drop.
	orig := packet(podA, remote, tcp(40000, 80, syn))
	if got := n.toPod(n.ifidx, icmpError(remote, podA, orig)); got != actOK {
		t.Fatalf("related ICMP error = %d", got)
	}
	stranger := packet(podA, remote, tcp(40001, 443, syn))
	if got := n.toPod(n.ifidx, icmpError(remote, podA, stranger)); got != actShot {
		t.Fatalf("unrelated ICMP error = %d, want drop", got)
	}

	// Drops reach user space as events naming reason, identities and rule.
	er, err := n.l.NewEventReader()
	if err != nil {
		t.Fatal(err)
	}
	defer er.Close()
	er.SetDeadline(time.Now().Add(10 * time.Second))
	sawDenyRule := false
	for i := 0; i < 64 && !sawDenyRule; i++ {
		ev, err := er.Read()
		if err != nil {
			t.Fatal(err)
		}
		sawDenyRule = ev.Type == EventDrop && ev.Reason == maps.ReasonPolicyDenyRule && ev.SrcIdentity == idRemote && ev.Dst == podA && ev.DstPort == 9050
	}
	if !sawDenyRule {
		t.Fatal("no drop event for the deny rule")
	}

	// Anti-spoofing: B's address from A's veth is dropped.
	if got := n.fromPod(n.ifidx, packet(podB, remote, tcp(1, 80, syn))); got != actShot {
		t.Fatalf("spoofed source = %d, want drop", got)
	}
	if n.metric(maps.ReasonInvalidSource, maps.DirEgress) != 1 {
		t.Fatal("spoof not counted")
	}
	// A packet for B arriving on A's veth is dropped.
	if got := n.toPod(n.ifidx, packet(remote, podB, tcp(1, 80, syn))); got != actShot {
		t.Fatalf("misdelivered = %d, want drop", got)
	}
}

func TestPrivilegedDatapathIPv6AndMalformed(t *testing.T) {
	n := newTestNode(t)
	n.addEndpoints(true, false)
	tcp := l4{proto: 6, sport: 40000, dport: 80, tcpFlags: 0x02}
	// Egress not enforced: passes and creates conntrack.
	if got := n.fromPod(n.ifidx, packet(podA6, rem6, tcp)); got != actOK {
		t.Fatalf("IPv6 egress = %d", got)
	}
	if got := n.toPod(n.ifidx, packet(rem6, podA6, l4{proto: 6, sport: 80, dport: 40000, tcpFlags: 0x12})); got != actOK {
		t.Fatalf("IPv6 reply = %d", got)
	}
	if got := n.toPod(n.ifidx, packet(rem6, podA6, l4{proto: 6, sport: 5555, dport: 80, tcpFlags: 0x02})); got != actShot {
		t.Fatalf("IPv6 ingress without rule = %d, want drop", got)
	}
	n.allow(1, maps.DirIngress, idRemote, 6, 80)
	if got := n.toPod(n.ifidx, packet(rem6, podA6, l4{proto: 6, sport: 5556, dport: 80, tcpFlags: 0x02})); got != actOK {
		t.Fatalf("IPv6 ingress allowed = %d", got)
	}
	// Neighbor solicitation passes without policy.
	ns := packet(netip.MustParseAddr("fe80::1"), podA6, l4{proto: 58, icmpType: 135})
	if got := n.toPod(n.ifidx, ns); got != actOK {
		t.Fatalf("NDP = %d", got)
	}
	// ICMPv6 echo: ingress by type (policy sees the type as the port).
	echo := packet(rem6, podA6, l4{proto: 58, icmpType: 128, icmpID: 7})
	if got := n.toPod(n.ifidx, echo); got != actShot {
		t.Fatalf("ICMPv6 echo without rule = %d, want drop", got)
	}
	n.allow(1, maps.DirIngress, idRemote, 58, 128)
	if got := n.toPod(n.ifidx, echo); got != actOK {
		t.Fatalf("ICMPv6 echo allowed by type = %d", got)
	}
	// Its reply leaves through conntrack although egress allows nothing
	// else... (egress is not enforced here; the reply path is covered in
	// TestPrivilegedDatapathPaths.)
	// ARP passes.
	arp := pad(append(ethernet(0x0806), make([]byte, 28)...))
	if got := n.fromPod(n.ifidx, arp); got != actOK {
		t.Fatalf("ARP = %d", got)
	}
	// Truncated and malformed headers are dropped with a reason.
	full := packet(podA, remote, tcp)
	tests := []struct {
		name   string
		pkt    []byte
		reason uint8
	}{
		// (A frame cut inside the IPv4 header is refused by the kernel's
		// test run itself, so truncation is shown at the next layers.)
		{"ipv4 total length beyond the frame", func() []byte {
			b := append([]byte(nil), full...)
			b[16], b[17] = 0x05, 0xdc
			return b
		}(), maps.ReasonTruncated},
		{"ipv4 ihl < 5", func() []byte { b := append([]byte(nil), full...); b[14] = 0x44; return b }(), maps.ReasonMalformed},
		// Padded to the Ethernet minimum: the padding must not be read as
		// the rest of the TCP header.
		{"tcp header cut", pad(append(append(ethernet(0x0800), ipv4Header(podA, remote, 6, 4)...), 0, 1, 0, 2)), maps.ReasonTruncated},
		{"ipv6 payload beyond the frame", pad(append(ethernet(0x86DD), ipv6Header(podA6, rem6, 6, 100)...)), maps.ReasonTruncated},
		{"icmp error quote cut", func() []byte {
			e := icmpError(remote, podA, full)
			e[16], e[17] = 0, 20+8+10 // the quoted IP header ends early
			return e
		}(), maps.ReasonTruncated},
		{"unknown ethertype", pad(append(ethernet(0x88cc), make([]byte, 40)...)), maps.ReasonUnknownL3},
		// A 600-byte hop-by-hop header puts TCP beyond what is parsed.
		{"ipv6 extension headers too deep", func() []byte {
			hbh := make([]byte, 600)
			hbh[0], hbh[1] = 6, 600/8-1
			body := append(hbh, l4bytes(tcp)...)
			return append(append(ethernet(0x86DD), ipv6Header(podA6, rem6, 0, len(body))...), body...)
		}(), maps.ReasonMalformed},
	}
	for _, tt := range tests {
		before := n.metric(tt.reason, maps.DirEgress)
		if got := n.fromPod(n.ifidx, tt.pkt); got != actShot {
			t.Errorf("%s = %d, want drop", tt.name, got)
			continue
		}
		if n.metric(tt.reason, maps.DirEgress) != before+1 {
			t.Errorf("%s: not counted as %s", tt.name, maps.ReasonName(tt.reason))
		}
	}
}

func TestPrivilegedEnforcementOff(t *testing.T) {
	n := newTestNode(t)
	n.addEndpoints(false, false)
	if got := n.toPod(n.ifidx, packet(remote, podA, l4{proto: 17, sport: 1, dport: 53})); got != actOK {
		t.Fatalf("no enforcement = %d", got)
	}
}

func TestPortRangePrefixes(t *testing.T) {
	tests := []struct {
		from, to uint16
		want     int
	}{
		{80, 80, 1}, {0, 65535, 1}, {1, 65535, 16}, {8000, 8100, 0},
	}
	for _, tt := range tests {
		got := PortRangePrefixesCover(tt.from, tt.to)
		if !got {
			t.Errorf("prefixes of %d-%d do not cover exactly the range", tt.from, tt.to)
		}
		if tt.want > 0 && len(maps.PortRangePrefixes(tt.from, tt.to)) != tt.want {
			t.Errorf("%d-%d: %d prefixes, want %d", tt.from, tt.to, len(maps.PortRangePrefixes(tt.from, tt.to)), tt.want)
		}
	}
}

// PortRangePrefixesCover checks that the prefixes cover exactly [from, to].
func PortRangePrefixesCover(from, to uint16) bool {
	covered := map[uint32]int{}
	for _, p := range maps.PortRangePrefixes(from, to) {
		size := uint32(1) << (16 - p.PrefixLen)
		for i := uint32(0); i < size; i++ {
			covered[uint32(p.Port)+i]++
		}
	}
	for port := uint32(0); port <= 65535; port++ {
		in := port >= uint32(from) && port <= uint32(to)
		if (covered[port] == 1) != in || covered[port] > 1 {
			return false
		}
	}
	return true
}

// benchFromPod runs from_pod on the frames pkt gives, repeat times each
// (BPF_PROG_TEST_RUN), and reports the program's own time per run from the
// kernel's BPF run-time statistics (without the test run's overhead) as
// prog-ns/packet, next to the wall time per run.
func benchFromPod(b *testing.B, n *testNode, ifindex int, pkt func(i int) []byte, repeat uint32) {
	b.Helper()
	from, _ := n.l.Programs()
	benchProgram(b, from, ifindex, pkt, repeat)
}

// benchProgram is benchFromPod for either program.
func benchProgram(b *testing.B, from *ebpf.Program, ifindex int, pkt func(i int) []byte, repeat uint32) {
	b.Helper()
	stats, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		b.Fatal(err)
	}
	defer stats.Close()
	ctx := skbContext{}
	ctx.Fields[10] = uint32(ifindex)
	s1, err := from.Stats()
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := from.Run(&ebpf.RunOptions{Data: pkt(i), Context: ctx, Repeat: repeat}); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	s2, err := from.Stats()
	if err != nil {
		b.Fatal(err)
	}
	runs := float64(s2.RunCount - s1.RunCount)
	b.ReportMetric(float64((s2.Runtime-s1.Runtime).Nanoseconds())/runs, "prog-ns/packet")
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*int(repeat)), "ns/run")
}

// BenchmarkPrivilegedFromPodEstablished: from_pod on an established TCP
// flow to a remote address (handed to the host), hot caches.
func BenchmarkPrivilegedFromPodEstablished(b *testing.B) {
	n := newBenchNode(b)
	pkt := packet(podA, remote, l4{proto: 6, sport: 40000, dport: 80, tcpFlags: 0x10})
	if got := n.fromPod(n.ifidx, pkt); got != actOK {
		b.Fatalf("first run: %d", got)
	}
	benchFromPod(b, n, n.ifidx, func(int) []byte { return pkt }, 1000)
}

// BenchmarkPrivilegedFromPodDirectEstablished: from_pod on an established
// TCP flow to a local pod that takes direct delivery: both endpoints'
// conntrack, the frame rewrite and the redirect.
func BenchmarkPrivilegedFromPodDirectEstablished(b *testing.B) {
	for _, repeat := range []uint32{1000, 1} {
		b.Run(fmt.Sprintf("repeat-%d", repeat), func(b *testing.B) {
			n := newNode(b)
			n.addDirectEndpoints()
			n.allow(2, maps.DirIngress, idA, 6, 8080)
			pkt := packet(podA, podB, l4{proto: 6, sport: 40000, dport: 8080, tcpFlags: 0x10})
			if got := n.fromPod(n.ifidx, pkt); got != actRedirect {
				b.Fatalf("first run: %d", got)
			}
			benchFromPod(b, n, n.ifidx, func(int) []byte { return pkt }, repeat)
		})
	}
}

// BenchmarkPrivilegedFromPodNewFlow: from_pod on new flows to a local pod
// that takes direct delivery, both endpoints enforcing (egress of the
// sender, ingress of the receiver): two policy decisions and the flow's
// conntrack entry per packet; with and without policy verdict events (the
// agent's default is on; they are rate-limited per CPU).
func BenchmarkPrivilegedFromPodNewFlow(b *testing.B) {
	benchNewFlows(b, podB, actRedirect, func(n *testNode) {
		n.addDirectEndpoints()
		n.allow(1, maps.DirEgress, idB, 17, 53)
		n.allow(2, maps.DirIngress, idA, 17, 53)
		if err := n.l.AttachEndpoint(EndpointInfo{ID: 1, IfIndex: n.ifidx, Addresses: []netip.Addr{podA, podA6}, Identity: idA, MAC: macA, HostMAC: hostMACA, EnforceEgress: true}); err != nil {
			b.Fatal(err)
		}
	})
}

// BenchmarkPrivilegedFromPodNewFlowRemote: from_pod on new flows to a
// remote peer (handed to the host): one endpoint's egress policy (its
// peer's identity from the ipcache), the conntrack create and, by
// default, the verdict event. The decision one program run makes for a new
// flow on the host path.
func BenchmarkPrivilegedFromPodNewFlowRemote(b *testing.B) {
	benchNewFlows(b, remote, actOK, func(n *testNode) {
		n.addEndpoints(false, true)
		if err := n.l.Maps().IPCacheMap().Upsert(netip.MustParsePrefix("10.2.0.0/24"), maps.IPCacheEntry{Identity: idRemote}); err != nil {
			b.Fatal(err)
		}
		n.allow(1, maps.DirEgress, idRemote, 17, 53)
	})
}

// benchNewFlows times from_pod on UDP flows from A to dst, each from a new
// source port, on a node that setup prepared, with and without policy
// verdict events (the agent's default is on; they are rate-limited per
// CPU). want is the verdict of every run.
func benchNewFlows(b *testing.B, dst netip.Addr, want uint32, setup func(*testNode)) {
	for _, events := range []bool{true, false} {
		name := "verdict-events"
		if !events {
			name = "no-events"
		}
		b.Run(name, func(b *testing.B) {
			n := newNodeWith(b, Config{DirectDelivery: true, PolicyVerdictEvents: events})
			setup(n)
			pkts := make([][]byte, 50000)
			for i := range pkts {
				pkts[i] = packet(podA, dst, l4{proto: 17, sport: uint16(1024 + i), dport: 53})
			}
			if got := n.fromPod(n.ifidx, pkts[0]); got != want {
				b.Fatalf("first run: %d, want %d", got, want)
			}
			if b.N >= len(pkts) {
				b.Fatalf("at most %d new flows", len(pkts)-1)
			}
			benchFromPod(b, n, n.ifidx, func(i int) []byte { return pkts[i+1] }, 1)
		})
	}
}

// BenchmarkPrivilegedToPodEstablished: to_pod on the reply of a TCP flow
// pod A began to a remote address, A enforcing ingress: the packet the
// host delivers to a pod on an established flow, hot caches.
func BenchmarkPrivilegedToPodEstablished(b *testing.B) {
	n := newNode(b)
	n.addEndpoints(true, false)
	if got := n.fromPod(n.ifidx, packet(podA, remote, l4{proto: 6, sport: 40000, dport: 80, tcpFlags: 0x02})); got != actOK {
		b.Fatalf("SYN: %d", got)
	}
	reply := packet(remote, podA, l4{proto: 6, sport: 80, dport: 40000, tcpFlags: 0x10})
	if got := n.toPod(n.ifidx, reply); got != actOK {
		b.Fatalf("first run: %d", got)
	}
	_, to := n.l.Programs()
	benchProgram(b, to, n.ifidx, func(int) []byte { return reply }, 1000)
}

// BenchmarkPrivilegedToPodNewFlow: to_pod on new UDP flows from a remote
// peer to pod A, which enforces ingress and allows them: the peer's
// identity from the ipcache, the policy decision and the conntrack create
// per packet.
func BenchmarkPrivilegedToPodNewFlow(b *testing.B) {
	n := newNode(b)
	n.addEndpoints(true, false)
	n.allow(1, maps.DirIngress, idRemote, 17, 53)
	pkts := make([][]byte, 50000)
	for i := range pkts {
		pkts[i] = packet(remote, podA, l4{proto: 17, sport: uint16(1024 + i), dport: 53})
	}
	if got := n.toPod(n.ifidx, pkts[0]); got != actOK {
		b.Fatalf("first run: %d", got)
	}
	if b.N >= len(pkts) {
		b.Fatalf("at most %d new flows", len(pkts)-1)
	}
	_, to := n.l.Programs()
	benchProgram(b, to, n.ifidx, func(i int) []byte { return pkts[i+1] }, 1)
}

// BenchmarkPrivilegedFromPodARP is the floor: test-run overhead plus the
// first header read.
func BenchmarkPrivilegedFromPodARP(b *testing.B) {
	n := newBenchNode(b)
	pkt := pad(append(ethernet(0x0806), make([]byte, 28)...))
	benchFromPod(b, n, n.ifidx, func(int) []byte { return pkt }, 1000)
}

// ctEntries lists the conntrack entries that name endpoint ep (every
// entry for ep 0).
func (n *testNode) ctEntries(ep uint16) []maps.CTEntry {
	n.t.Helper()
	all, err := n.l.Maps().CTMap().List()
	if err != nil {
		n.t.Fatal(err)
	}
	var out []maps.CTEntry
	for _, e := range all {
		if ep == 0 || e.SrcEndpoint == ep || e.DstEndpoint == ep {
			out = append(out, e)
		}
	}
	return out
}

// TestPrivilegedConntrackOneEntryPerFlow: a flow and its replies share one
// entry, for TCP (with its state), UDP, ICMP echo and IPv6; a reply-looking
// packet of no known flow is a new flow.
func TestPrivilegedConntrackOneEntryPerFlow(t *testing.T) {
	n := newTestNode(t)
	n.addEndpoints(true, true)
	const syn, ack, fin = 0x02, 0x10, 0x01
	n.allow(1, maps.DirEgress, idRemote, 6, 80)

	// TCP: SYN out, SYN-ACK in, ACK out, FIN in.
	steps := []struct {
		out   bool
		flags uint8
	}{{true, syn}, {false, syn | ack}, {true, ack}, {false, fin | ack}}
	for i, s := range steps {
		var got uint32
		if s.out {
			got = n.fromPod(n.ifidx, packet(podA, remote, l4{proto: 6, sport: 40000, dport: 80, tcpFlags: s.flags}))
		} else {
			got = n.toPod(n.ifidx, packet(remote, podA, l4{proto: 6, sport: 80, dport: 40000, tcpFlags: s.flags}))
		}
		if got != actOK {
			t.Fatalf("TCP step %d = %d", i, got)
		}
	}
	entries := n.ctEntries(1)
	if len(entries) != 1 {
		t.Fatalf("%d conntrack entries for one TCP flow, want 1: %+v", len(entries), entries)
	}
	e := entries[0]
	if e.Src != podA || e.SrcPort != 40000 || e.Dst != remote || e.DstPort != 80 || e.Proto != 6 || e.SrcEndpoint != 1 || e.DstEndpoint != 0 {
		t.Errorf("entry: %+v", e)
	}
	if dir, ok := e.Origin(1); !ok || dir != maps.DirEgress {
		t.Errorf("origin seen from endpoint 1: %d %v", dir, ok)
	}
	if !e.SeenReply() || !e.Closing() || e.TCPFlags != syn|ack|fin {
		t.Errorf("entry state: reply=%v closing=%v tcp flags %#x", e.SeenReply(), e.Closing(), e.TCPFlags)
	}
	if n.metric(maps.ReasonCTReply, maps.DirIngress) != 2 || n.metric(maps.ReasonCTEstablished, maps.DirEgress) != 1 {
		t.Errorf("replies %d (want 2), established %d (want 1)", n.metric(maps.ReasonCTReply, maps.DirIngress), n.metric(maps.ReasonCTEstablished, maps.DirEgress))
	}

	// A "reply" of a flow that never went out is a new flow under ingress
	// policy, and leaves no entry.
	if got := n.toPod(n.ifidx, packet(remote, podA, l4{proto: 6, sport: 80, dport: 40001, tcpFlags: syn | ack})); got != actShot {
		t.Fatalf("reply of an unknown flow = %d, want drop", got)
	}
	// Ingress-started flows: UDP and ICMP echo from the remote, answered.
	n.allow(1, maps.DirIngress, idRemote, 17, 53)
	n.allow(1, maps.DirIngress, idRemote, 1, 8)
	pairs := []struct{ in, out []byte }{
		{packet(remote, podA, l4{proto: 17, sport: 5353, dport: 53}), packet(podA, remote, l4{proto: 17, sport: 53, dport: 5353})},
		{packet(remote, podA, l4{proto: 1, icmpType: 8, icmpID: 99}), packet(podA, remote, l4{proto: 1, icmpType: 0, icmpID: 99})},
	}
	for i, pr := range pairs {
		if got := n.toPod(n.ifidx, pr.in); got != actOK {
			t.Fatalf("pair %d request = %d", i, got)
		}
		if got := n.fromPod(n.ifidx, pr.out); got != actOK {
			t.Fatalf("pair %d answer = %d (egress allows only TCP/80)", i, got)
		}
	}
	if got := len(n.ctEntries(1)); got != 3 {
		t.Fatalf("%d entries after three flows, want 3", got)
	}
	// Looked up by the reply's tuple, the entry comes back as the flow.
	icmp, ok, err := n.l.Maps().CTMap().Lookup(maps.CTEntry{Proto: 1, Src: podA, SrcPort: 0, Dst: remote, DstPort: 99})
	if err != nil || !ok || icmp.Src != remote || icmp.SrcPort != 99 || icmp.DstEndpoint != 1 || !icmp.SeenReply() {
		t.Fatalf("echo flow entry: %+v found=%v err=%v", icmp, ok, err)
	}
	if dir, ok := icmp.Origin(1); !ok || dir != maps.DirIngress {
		t.Errorf("echo flow's origin seen from endpoint 1: %d %v", dir, ok)
	}

	// IPv6: one entry in the IPv6 table.
	n.allow(1, maps.DirEgress, idRemote, 6, 443)
	if got := n.fromPod(n.ifidx, packet(podA6, rem6, l4{proto: 6, sport: 41000, dport: 443, tcpFlags: syn})); got != actOK {
		t.Fatalf("IPv6 SYN = %d", got)
	}
	if got := n.toPod(n.ifidx, packet(rem6, podA6, l4{proto: 6, sport: 443, dport: 41000, tcpFlags: syn | ack})); got != actOK {
		t.Fatalf("IPv6 SYN-ACK = %d", got)
	}
	v6, ok, err := n.l.Maps().CTMap().Lookup(maps.CTEntry{Proto: 6, Src: podA6, SrcPort: 41000, Dst: rem6, DstPort: 443})
	if err != nil || !ok || !v6.SeenReply() || v6.SrcEndpoint != 1 || v6.Src != podA6 {
		t.Fatalf("IPv6 entry: %+v found=%v err=%v", v6, ok, err)
	}
	if got := len(n.ctEntries(1)); got != 4 {
		t.Fatalf("%d entries after the IPv6 flow, want 4", got)
	}
}

// BenchmarkPrivilegedAttachEndpoint: what attaching one endpoint costs (its
// map entries and its two programs), one fresh veth per iteration, in each
// attach mode. A TCX attach (two pinned links) waits for an RCU grace
// period while holding rtnl (the kernel's tcx_link_attach), so it is
// mostly waiting, and concurrent attaches and every other rtnl user queue
// behind it (docs/benchmarks/cni.md); tc mode (a clsact qdisc and two
// cls_bpf filters) waits for none.
func BenchmarkPrivilegedAttachEndpoint(b *testing.B) {
	for _, mode := range attachModes {
		b.Run(string(mode), func(b *testing.B) { benchmarkAttachEndpoint(b, mode) })
	}
}

func benchmarkAttachEndpoint(b *testing.B, mode AttachMode) {
	n := newNodeWith(b, Config{DirectDelivery: true, AttachMode: mode})
	ifs := make([]int, b.N)
	for i := range ifs {
		ifs[i] = netlab.AddVeth(b, fmt.Sprintf("tdrb%d", i), fmt.Sprintf("tdrbp%d", i))
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		ip := netip.AddrFrom4([4]byte{10, 9, byte(i >> 8), byte(i)})
		if err := n.l.AttachEndpoint(EndpointInfo{ID: uint16(100 + i), IfIndex: ifs[i], Addresses: []netip.Addr{ip}, Identity: idA}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkPrivilegedTakeOver: what a start costs over 20 endpoints an
// earlier run attached (ns/op is one Start), per pair of modes: the same
// mode swaps programs in place; a switch to tc detaches two TCX links per
// endpoint and a switch to TCX attaches two, each waiting for an RCU grace
// period under rtnl.
func BenchmarkPrivilegedTakeOver(b *testing.B) {
	for _, from := range attachModes {
		for _, to := range attachModes {
			b.Run(string(from)+"-to-"+string(to), func(b *testing.B) { benchmarkTakeOver(b, from, to) })
		}
	}
}

func benchmarkTakeOver(b *testing.B, from, to AttachMode) {
	const endpoints = 20
	n := newNodeWith(b, Config{DirectDelivery: true, AttachMode: from})
	root := n.l.cfg.BPFRoot
	eps := make([]EndpointInfo, endpoints)
	for i := range eps {
		ifindex := netlab.AddVeth(b, fmt.Sprintf("tdrt%d", i), fmt.Sprintf("tdrtp%d", i))
		eps[i] = EndpointInfo{ID: uint16(100 + i), IfIndex: ifindex, Addresses: []netip.Addr{netip.AddrFrom4([4]byte{10, 9, 0, byte(i)})}, Identity: idA}
	}
	_ = n.l.Remove()
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		first := New(Config{BPFRoot: root, DirectDelivery: true, AttachMode: from}, nil)
		if err := first.Start(); err != nil {
			b.Fatal(err)
		}
		for _, ep := range eps {
			if err := first.AttachEndpoint(ep); err != nil {
				b.Fatal(err)
			}
		}
		_ = first.Close()
		second := New(Config{BPFRoot: root, DirectDelivery: true, AttachMode: to}, nil)
		b.StartTimer()
		if err := second.Start(); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		if st := second.Status(); st.ReusedLinks != 2*endpoints {
			b.Fatalf("%d attachments taken over, want %d", st.ReusedLinks, 2*endpoints)
		}
		_ = second.Remove()
		b.StartTimer()
	}
}

// BenchmarkPrivilegedReattachEndpoint: what attaching an endpoint that is
// attached already costs when only its flags change (the endpoints
// table's reconciler calls AttachEndpoint for every change of an
// endpoint's object), in each attach mode: only the map entries are
// written, no TCX link update or tc filter replace (measured against the
// re-attach: tcx 12–14 µs → 8–14 µs, tc 36–42 µs → 6–7 µs).
func BenchmarkPrivilegedReattachEndpoint(b *testing.B) {
	benchAttachedEndpoint(b, func(n *testNode, ep EndpointInfo, i int) {
		ep.EnforceIngress = i%2 == 0
		if err := n.l.AttachEndpoint(ep); err != nil {
			b.Fatal(err)
		}
	})
}

// BenchmarkPrivilegedCheckEndpoint is the attachment check of one intact
// endpoint (map entries written, both hooks read from the kernel), beside
// the regeneration's cheap path (BenchmarkPrivilegedReattachEndpoint).
func BenchmarkPrivilegedCheckEndpoint(b *testing.B) {
	benchAttachedEndpoint(b, func(n *testNode, ep EndpointInfo, _ int) {
		if reattached, err := n.l.CheckEndpoint(ep); err != nil || reattached {
			b.Fatalf("check of an intact endpoint: reattached %v, %v", reattached, err)
		}
	})
}

// benchAttachedEndpoint runs op b.N times, in each attach mode, on an
// endpoint attached to a veth of its own.
func benchAttachedEndpoint(b *testing.B, op func(n *testNode, ep EndpointInfo, i int)) {
	for _, mode := range attachModes {
		b.Run(string(mode), func(b *testing.B) {
			n := newNodeWith(b, Config{DirectDelivery: true, AttachMode: mode})
			ifindex := netlab.AddVeth(b, "tdrr0", "tdrrp0")
			ep := EndpointInfo{ID: 100, IfIndex: ifindex, Addresses: []netip.Addr{netip.AddrFrom4([4]byte{10, 9, 0, 1})}, Identity: idA}
			if err := n.l.AttachEndpoint(ep); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				op(n, ep, i)
			}
		})
	}
}
