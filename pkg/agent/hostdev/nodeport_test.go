package hostdev

import (
	"bytes"
	"net"
	"net/netip"
	"os"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/tendril-net/tendril/pkg/datapath/maps"
)

// Services for clients outside the cluster in the host device programs
// (bpf/lib/nodeport.h), with BPF_PROG_TEST_RUN on the masquerade tests'
// throw-away node: its uplink holds the node address, a route leads to a
// peer node's pod CIDR through the peer's address (with a known MAC), and
// the local pod is an endpoint.

var (
	client    = netip.MustParseAddr("198.51.100.2")
	client2   = netip.MustParseAddr("198.51.100.7")
	peerNode  = netip.MustParseAddr("172.30.0.12")
	lbAddr    = netip.MustParseAddr("203.0.113.10")
	clusterIP = netip.MustParseAddr("10.96.0.10")
	peerMAC   = net.HardwareAddr{0x02, 0, 0, 0, 0, 0x12}
)

const (
	npLocal     = 30080 // NodePort: the local pod only
	npRemote    = 30081 // NodePort: the peer's pod only
	npETPNone   = 30082 // externalTrafficPolicy Local, no local backend
	npETPLocal  = 30083 // externalTrafficPolicy Local, a backend on each node
	backendPort = 8080
)

// newNodePortNode is a masquerade test node with the route to the peer's
// pods, forwarding on (the FIB lookup wants it), and the services.
func newNodePortNode(t testing.TB) *masqNode {
	n := newMasqNode(t, 61000, 61009)
	if err := os.WriteFile("/proc/sys/net/ipv4/conf/all/forwarding", []byte("1"), 0o644); err != nil {
		t.Fatal(err)
	}
	peer, err := netlink.LinkByName("tdrupp0")
	if err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetUp(peer); err != nil {
		t.Fatal(err)
	}
	if err := netlink.RouteAdd(&netlink.Route{LinkIndex: n.uplink, Dst: &net.IPNet{IP: net.IP{10, 244, 1, 0}, Mask: net.CIDRMask(24, 32)}, Gw: peerNode.AsSlice()}); err != nil {
		t.Fatal(err)
	}
	if err := netlink.NeighAdd(&netlink.Neigh{LinkIndex: n.uplink, Family: netlink.FAMILY_V4, State: netlink.NUD_PERMANENT, IP: peerNode.AsSlice(), HardwareAddr: peerMAC}); err != nil {
		t.Fatal(err)
	}
	// The world through a gateway whose MAC is not known yet: replies
	// go out by the kernel's neighbour resolution (bpf_redirect_neigh).
	if err := netlink.RouteAdd(&netlink.Route{LinkIndex: n.uplink, Gw: net.IP{172, 30, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	lb := n.l.Maps().LB
	for id, addr := range map[uint32]netip.Addr{1: pod, 2: peerPod} {
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
		{maps.Frontend{Addr: node, Port: npLocal, Proto: protoTCP}, maps.Service{ID: 1, RevNATID: 1, Flags: ext}, []uint32{1}},
		{maps.Frontend{Addr: node, Port: npRemote, Proto: protoTCP}, maps.Service{ID: 2, RevNATID: 2, Flags: ext}, []uint32{2}},
		{maps.Frontend{Addr: node, Port: npRemote, Proto: protoUDP}, maps.Service{ID: 3, RevNATID: 3, Flags: ext}, []uint32{2}},
		{maps.Frontend{Addr: node, Port: npETPNone, Proto: protoTCP}, maps.Service{ID: 4, RevNATID: 4, Flags: ext | maps.SvcFlagExtLocal}, []uint32{2}},
		// In-cluster scope both backends; outside clients the local one.
		{maps.Frontend{Addr: node, Port: npETPLocal, Proto: protoTCP}, maps.Service{ID: 5, RevNATID: 5, Flags: ext | maps.SvcFlagExtLocal, LocalCount: 1}, []uint32{1, 2, 1}},
		{maps.Frontend{Addr: lbAddr, Port: 80, Proto: protoTCP}, maps.Service{ID: 6, RevNATID: 6, Flags: ext | maps.SvcFlagSourceRanges}, []uint32{1}},
		{maps.Frontend{Addr: clusterIP, Port: 80, Proto: protoTCP}, maps.Service{ID: 7, RevNATID: 7}, []uint32{1}},
	} {
		if err := lb.ApplyService(s.fe, s.svc, s.backends, 0); err != nil {
			t.Fatal(err)
		}
	}
	if err := lb.SrcRangeMap().Set(6, []netip.Prefix{netip.MustParsePrefix("198.51.100.0/30")}, nil); err != nil {
		t.Fatal(err)
	}
	return n
}

func ap(a netip.Addr, p uint16) netip.AddrPort { return netip.AddrPortFrom(a, p) }

// ipFamily is one address family's frames and addresses in the host
// programs' tests: the IPv4 and IPv6 tests check the same things through
// it.
type ipFamily struct {
	frame     func(src, dst netip.Addr, proto uint8, sport, dport uint16, icmpType uint8) []byte
	tuple     func(f []byte) (netip.AddrPort, netip.AddrPort)
	checkSums func(t *testing.T, what string, f []byte)
	// client2 is outside the load-balancer address lb's source ranges.
	client, client2, node, pod, peerPod, lb netip.Addr
	// world and world2 are masquerade's destinations; otherPod a pod
	// whose mappings a test writes itself.
	world, world2, otherPod netip.Addr
	// revNAT is the reverse NAT ID of the node port npLocal.
	revNAT uint32
}

var (
	famV4 = ipFamily{frame: frame, tuple: tuple, checkSums: checkSums,
		client: client, client2: client2, node: node, pod: pod, peerPod: peerPod, lb: lbAddr,
		world: world, world2: world2, otherPod: netip.MustParseAddr("10.244.0.9"), revNAT: 1}
	famV6 = ipFamily{frame: frame6, tuple: tuple6, checkSums: checkSums6,
		client: client6, client2: client6b, node: node6, pod: pod6, peerPod: peerPod6, lb: lb6Addr,
		world: world6, world2: world6b, otherPod: netip.MustParseAddr("fd00:10::9"), revNAT: 11}
)

// checkNodePortLocalBackend is TestPrivilegedNodePortLocalBackend of family f, on n.
func checkNodePortLocalBackend(t *testing.T, n *masqNode, f ipFamily) {
	t.Helper()
	for i := range 2 { // the flow's first packet, then a known one
		ret, out := n.ingress(f.frame(f.client, f.node, protoTCP, 40000, npLocal, 0))
		if ret != 0 {
			t.Fatalf("packet %d: verdict %d, want pass to the host", i, ret)
		}
		f.checkSums(t, "to the pod", out)
		if src, dst := f.tuple(out); src != ap(f.client, 40000) || dst != ap(f.pod, backendPort) {
			t.Fatalf("packet %d: %s -> %s, want %s -> %s", i, src, dst, ap(f.client, 40000), ap(f.pod, backendPort))
		}
	}
	e, ok, err := n.l.Maps().CTMap().Lookup(maps.CTEntry{Proto: protoTCP, Src: f.client, SrcPort: 40000, Dst: f.pod, DstPort: backendPort})
	if err != nil || !ok || e.RevNAT != f.revNAT {
		t.Fatalf("conntrack of client <-> pod: %+v found %v (%v), want reverse NAT ID %d", e, ok, err, f.revNAT)
	}
	ret, out := n.egress(f.frame(f.pod, f.client, protoTCP, backendPort, 40000, 0))
	if ret != 0 {
		t.Fatalf("reply: verdict %d", ret)
	}
	f.checkSums(t, "reply", out)
	if src, dst := f.tuple(out); src != ap(f.node, npLocal) || dst != ap(f.client, 40000) {
		t.Fatalf("reply leaves as %s -> %s, want %s -> %s", src, dst, ap(f.node, npLocal), ap(f.client, 40000))
	}
	if list, _ := n.l.Maps().NAT.NATMap().List(); len(list) != 0 {
		t.Fatalf("NAT mappings %+v, want none (the reply is not masqueraded)", list)
	}
	if got := n.metric(maps.ReasonNodeport, maps.DirIngress); got != 2 {
		t.Fatalf("translated packets %d, want 2", got)
	}
}

// checkNodePortRemoteBackend is TestPrivilegedNodePortRemoteBackend of family f, on n.
func checkNodePortRemoteBackend(t *testing.T, n *masqNode, f ipFamily) {
	t.Helper()
	for _, proto := range []uint8{protoTCP, protoUDP} {
		var port uint16
		for i := range 2 {
			ret, out := n.ingress(f.frame(f.client, f.node, proto, 40000, npRemote, 0))
			if ret != 7 { // TC_ACT_REDIRECT
				t.Fatalf("proto %d packet %d: verdict %d, want redirect", proto, i, ret)
			}
			f.checkSums(t, "to the peer", out)
			src, dst := f.tuple(out)
			if src.Addr() != f.node || !inRange(src.Port(), 61000, 61009) || dst != ap(f.peerPod, backendPort) {
				t.Fatalf("proto %d: %s -> %s, want %s:61000-61009 -> %s", proto, src, dst, f.node, ap(f.peerPod, backendPort))
			}
			if i == 1 && src.Port() != port {
				t.Fatalf("proto %d: second packet port %d, first %d", proto, src.Port(), port)
			}
			port = src.Port()
			if !bytes.Equal(out[0:6], peerMAC) {
				t.Fatalf("proto %d: destination MAC %x, want the peer's %s", proto, out[0:6], peerMAC)
			}
		}
		ret, out := n.ingress(f.frame(f.peerPod, f.node, proto, backendPort, port, 0))
		if ret != 7 {
			t.Fatalf("proto %d reply: verdict %d, want redirect", proto, ret)
		}
		f.checkSums(t, "reply to the client", out)
		if src, dst := f.tuple(out); src != ap(f.node, npRemote) || dst != ap(f.client, 40000) {
			t.Fatalf("proto %d reply: %s -> %s, want %s -> %s", proto, src, dst, ap(f.node, npRemote), ap(f.client, 40000))
		}
	}
	list, err := n.l.Maps().NAT.NATMap().List()
	if err != nil || len(list) != 2 {
		t.Fatalf("NAT mappings %+v (%v), want one per protocol", list, err)
	}
	for _, m := range list {
		if m.Pod != f.client || m.Remote != f.peerPod || m.Node != f.node || m.Orphan || !m.Service {
			t.Fatalf("mapping %+v: want a service mapping client -> peer pod through the node", m)
		}
	}
	if got := n.metric(maps.ReasonNodeportReply, maps.DirEgress); got != 2 {
		t.Fatalf("replies translated %d, want 2", got)
	}
}

// checkNodePortExternalLocal is TestPrivilegedNodePortExternalLocal of family f, on n.
func checkNodePortExternalLocal(t *testing.T, n *masqNode, f ipFamily) {
	t.Helper()
	for i := range 20 {
		ret, out := n.ingress(f.frame(f.client, f.node, protoTCP, uint16(41000+i), npETPLocal, 0))
		if ret != 0 {
			t.Fatalf("flow %d: verdict %d", i, ret)
		}
		if src, dst := f.tuple(out); src != ap(f.client, uint16(41000+i)) || dst != ap(f.pod, backendPort) {
			t.Fatalf("flow %d: %s -> %s, want the local pod with the client's source", i, src, dst)
		}
	}
	ret, _ := n.ingress(f.frame(f.client, f.node, protoTCP, 42000, npETPNone, 0))
	if ret != 2 {
		t.Fatalf("no local backend: verdict %d, want drop", ret)
	}
	if got := n.metric(maps.ReasonSvcNoLocalBackend, maps.DirIngress); got != 1 {
		t.Fatalf("drops for no local backend %d, want 1", got)
	}
}

// checkNodePortSourceRanges is TestPrivilegedNodePortSourceRanges of family f, on n.
func checkNodePortSourceRanges(t *testing.T, n *masqNode, f ipFamily) {
	t.Helper()
	ret, out := n.ingress(f.frame(f.client, f.lb, protoTCP, 43000, 80, 0))
	if ret != 0 {
		t.Fatalf("client in range: verdict %d", ret)
	}
	if _, dst := f.tuple(out); dst != ap(f.pod, backendPort) {
		t.Fatalf("client in range went to %s", dst)
	}
	if ret, _ := n.ingress(f.frame(f.client2, f.lb, protoTCP, 43000, 80, 0)); ret != 2 {
		t.Fatalf("client outside the ranges: verdict %d, want drop", ret)
	}
	if got := n.metric(maps.ReasonSourceRangeDenied, maps.DirIngress); got != 1 {
		t.Fatalf("source range drops %d, want 1", got)
	}
}

// TestPrivilegedNodePortLocalBackend: a client's packet to a node port
// whose backend is on this node is DNATed to the pod, its source kept
// (the pod's policy sees the client), passed to the host to route; the
// flow's conntrack entry carries the reverse NAT ID, and the pod's reply
// leaving the uplink gets the node port as source instead of masquerade.
func TestPrivilegedNodePortLocalBackend(t *testing.T) {
	n := newNodePortNode(t)
	checkNodePortLocalBackend(t, n, famV4)
	// A cluster IP is not reachable from outside: untouched.
	f := frame(client, clusterIP, protoTCP, 40001, 80, 0)
	if ret, out := n.ingress(f); ret != 0 || !bytes.Equal(out[:len(f)], f) {
		t.Fatalf("cluster IP from outside: verdict %d, changed %v", ret, !bytes.Equal(out[:len(f)], f))
	}
}

// TestPrivilegedNodePortRemoteBackend: to a backend on another node the
// packet leaves with the node's address and a port of the masquerade
// range as source, sent out the uplink to the peer (FIB: its MAC); the
// backend's reply gets the client as destination and the node port as
// source and is sent back out; TCP and UDP.
func TestPrivilegedNodePortRemoteBackend(t *testing.T) {
	n := newNodePortNode(t)
	checkNodePortRemoteBackend(t, n, famV4)
}

// TestPrivilegedNodePortExternalLocal: externalTrafficPolicy Local sends
// outside clients only to this node's backends (every flow: the local
// pod, its source kept), and a node without one drops them with their
// reason.
func TestPrivilegedNodePortExternalLocal(t *testing.T) {
	n := newNodePortNode(t)
	checkNodePortExternalLocal(t, n, famV4)
}

// TestPrivilegedNodePortSourceRanges: a load-balancer address with
// source ranges admits clients inside them and drops others with their
// reason.
func TestPrivilegedNodePortSourceRanges(t *testing.T) {
	n := newNodePortNode(t)
	checkNodePortSourceRanges(t, n, famV4)
}

// TestPrivilegedNodePortWithoutMasquerade: with --enable-masquerade=false
// the programs still serve clients outside (the device keeps its address
// for the source NAT of a remote backend's flows): a local backend's reply
// gets the node port as source, a remote backend is reached through the
// node's address, and a pod's own traffic to the world keeps the pod's
// address. With --enable-node-port=false as well a request to the node
// port is left to the host.
func TestPrivilegedNodePortWithoutMasquerade(t *testing.T) {
	n := newNodePortNode(t)
	if err := n.l.Maps().NAT.SetHostDevice(maps.HostDevice{IfIndex: n.uplink, MasqIPv4: node, NoMasquerade: true}); err != nil {
		t.Fatal(err)
	}
	devs, err := n.l.Maps().NAT.HostDevices()
	if err != nil || len(devs) != 1 || !devs[0].NoMasquerade || devs[0].MasqIPv4 != node {
		t.Fatalf("host devices %+v (%v), want %s without masquerade", devs, err, node)
	}
	if ret, _ := n.ingress(frame(client, node, protoTCP, 40000, npLocal, 0)); ret != 0 {
		t.Fatalf("to the local backend: verdict %d", ret)
	}
	ret, out := n.egress(frame(pod, client, protoTCP, backendPort, 40000, 0))
	if src, dst := tuple(out); ret != 0 || src != ap(node, npLocal) || dst != ap(client, 40000) {
		t.Fatalf("local backend's reply: verdict %d, %s -> %s, want from %s", ret, src, dst, ap(node, npLocal))
	}
	ret, out = n.ingress(frame(client, node, protoTCP, 40001, npRemote, 0))
	if src, _ := tuple(out); ret != 7 || src.Addr() != node {
		t.Fatalf("to the remote backend: verdict %d, source %s, want redirected from %s", ret, src, node)
	}
	f := frame(pod, world, protoUDP, 5000, 53, 0)
	if ret, out := n.egress(f); ret != 0 || !bytes.Equal(out[:len(f)], f) {
		t.Fatalf("pod to the world: verdict %d, changed %v: want it untranslated", ret, !bytes.Equal(out[:len(f)], f))
	}

	n.h.Close()
	n.h, err = Load(Options{BPFRoot: n.root, PortMin: 61000, PortMax: 61009, NoNodePort: true, Maps: n.l.MapReplacements()}, nil)
	if err != nil {
		t.Fatal(err)
	}
	f = frame(client, node, protoTCP, 40002, npLocal, 0)
	if ret, out := n.ingress(f); ret != 0 || !bytes.Equal(out[:len(f)], f) {
		t.Fatalf("node port with --enable-node-port=false: verdict %d, changed %v", ret, !bytes.Equal(out[:len(f)], f))
	}
}
