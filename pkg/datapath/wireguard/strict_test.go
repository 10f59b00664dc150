package wireguard

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/tendril-net/tendril/pkg/datapath/bpf"
	"github.com/tendril-net/tendril/pkg/datapath/loader"
	"github.com/tendril-net/tendril/pkg/datapath/maps"
	"github.com/tendril-net/tendril/pkg/datapath/tunnel"
	"github.com/tendril-net/tendril/pkg/testutil"
	"github.com/tendril-net/tendril/pkg/testutil/netlab"
)

// strictNode is a loader started in a network namespace of the test's
// own, the test's thread locked in it (BPF_PROG_TEST_RUN resolves the
// context's ifindex, and bpf_fib_lookup the routes, in the caller's
// namespace), with forwarding on as on a node.
func strictNode(t *testing.T) *loader.Loader {
	t.Helper()
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
	for _, f := range []string{"/proc/sys/net/ipv4/conf/all/forwarding", "/proc/sys/net/ipv6/conf/all/forwarding"} {
		if err := os.WriteFile(f, []byte("1"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	l := loader.New(loader.Config{BPFRoot: filepath.Join("/sys/fs/bpf", "tendril-wgstrict-"+hex.EncodeToString(b)), DirectDelivery: true}, nil)
	t.Cleanup(func() { _ = l.Remove() })
	if err := l.Start(); err != nil {
		t.Fatal(err)
	}
	return l
}

// addLink adds a device with addr, up (one side of a veth pair, both up:
// this kernel has no dummy devices) and returns it.
func addLink(t *testing.T, name string, addr string) netlink.Link {
	t.Helper()
	netlab.AddVeth(t, name, name+"p")
	peer, err := netlink.LinkByName(name + "p")
	if err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetUp(peer); err != nil {
		t.Fatal(err)
	}
	l, err := netlink.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	a, err := netlink.ParseAddr(addr)
	if err != nil {
		t.Fatal(err)
	}
	if err := netlink.AddrAdd(l, a); err != nil {
		t.Fatal(err)
	}
	return l
}

// udpFrame is an Ethernet frame of a UDP datagram from src to dst (either
// family).
func udpFrame(src, dst netip.Addr) []byte {
	if src.Is6() {
		b := make([]byte, 14+40+8+18)
		binary.BigEndian.PutUint16(b[12:], 0x86DD)
		ip := b[14:]
		ip[0] = 0x60
		binary.BigEndian.PutUint16(ip[4:], 8+18)
		ip[6], ip[7] = 17, 64
		s, d := src.As16(), dst.As16()
		copy(ip[8:], s[:])
		copy(ip[24:], d[:])
		binary.BigEndian.PutUint16(ip[40:], 40000)
		binary.BigEndian.PutUint16(ip[42:], 5201)
		binary.BigEndian.PutUint16(ip[44:], 8+18)
		return b
	}
	b := make([]byte, 14+20+8+18)
	binary.BigEndian.PutUint16(b[12:], 0x0800)
	ip := b[14:]
	copy(ip, testutil.IPv4Header(src, dst, 17, 64, 8+18))
	binary.BigEndian.PutUint16(ip[20:], 40000)
	binary.BigEndian.PutUint16(ip[22:], 5201)
	binary.BigEndian.PutUint16(ip[24:], 8+18)
	return b
}

// TestPrivilegedStrictDecision runs from_pod (BPF_PROG_TEST_RUN) on a
// local pod's frames for another node's pod CIDR, with the host's routes
// sending that CIDR either through the WireGuard device (a veth stands
// in for it: the decision compares only the FIB's egress device)
// or through the underlay: strict mode off changes nothing; on, a packet
// leaves for the host stack only when the route goes to the device and
// the node is a peer with a key, and is dropped with its own reason
// otherwise (no device known, the route elsewhere, a node without a key);
// an address in no other node's pod CIDR is not strict mode's business.
func TestPrivilegedStrictDecision(t *testing.T) {
	l := strictNode(t)
	pod, pod6 := netip.MustParseAddr("10.1.0.2"), netip.MustParseAddr("fd00:1::2")
	remote, remote6 := netip.MustParseAddr("10.2.0.5"), netip.MustParseAddr("fd00:2::5")
	keyless := netip.MustParseAddr("10.4.0.5") // a node without a key
	world := netip.MustParseAddr("10.3.0.9")
	ifPod := netlab.AddVeth(t, "tdrwgs0", "tdrwgsp0")
	if err := l.AttachEndpoint(loader.EndpointInfo{ID: 1, IfIndex: ifPod, IfName: "tdrwgs0",
		Addresses: []netip.Addr{pod, pod6}, Identity: 70001, MAC: net.HardwareAddr{2, 0, 0, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	wg := addLink(t, "tdrwgsdev", "10.99.0.1/32")
	under := addLink(t, "tdrwgsund", "192.168.50.1/24")
	if err := netlink.AddrAdd(under, &netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP("fd99::1"), Mask: net.CIDRMask(64, 128)}}); err != nil {
		t.Fatal(err)
	}
	route := func(dst string, dev netlink.Link, via string) {
		t.Helper()
		_, n, _ := net.ParseCIDR(dst)
		r := &netlink.Route{Dst: n, LinkIndex: dev.Attrs().Index}
		if via != "" {
			r.Gw = net.ParseIP(via)
		}
		if err := netlink.RouteReplace(r); err != nil {
			t.Fatalf("route %s: %v", dst, err)
		}
	}
	route("10.2.0.0/24", under, "192.168.50.2") // in the clear, for now
	route("fd00:2::/64", wg, "")
	route("10.4.0.0/24", wg, "")
	route("10.3.0.0/24", under, "192.168.50.3")

	em, err := maps.NewEncryptMaps(l.MapReplacements())
	if err != nil {
		t.Fatal(err)
	}
	if err := em.SyncCIDRs(map[netip.Prefix]bool{
		netip.MustParsePrefix("10.2.0.0/24"): true, netip.MustParsePrefix("fd00:2::/64"): true,
		netip.MustParsePrefix("10.4.0.0/24"): false,
	}, true); err != nil {
		t.Fatal(err)
	}
	from, _ := l.Programs()
	events, err := l.NewEventReader()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = events.Close() })
	drops := func() uint64 { return unencryptedDrops(t, l) }
	const (
		pass = 0 // TC_ACT_OK: the host routes it
		shot = 2 // TC_ACT_SHOT
	)
	check := func(what string, src, dst netip.Addr, want uint32, wantDrops uint64) {
		t.Helper()
		if got := runFrom(t, from, ifPod, udpFrame(src, dst)); got != want {
			t.Errorf("%s: verdict %d, want %d", what, got, want)
		}
		if got := drops(); got != wantDrops {
			t.Errorf("%s: %d packets dropped as unencrypted, want %d", what, got, wantDrops)
		}
	}

	// Strict mode off (the entry as a fresh node has it, or written so):
	// nothing changes, even in the clear and to a node without a key.
	check("off, route in the clear", pod, remote, pass, 0)
	check("off, node without a key", pod, keyless, pass, 0)
	if err := em.SetDevice(wg.Attrs().Index, false, false, 0); err != nil {
		t.Fatal(err)
	}
	check("off with the device known", pod, remote, pass, 0)

	// On, but the device not known (not started yet, gone).
	if err := em.SetDevice(0, true, false, 0); err != nil {
		t.Fatal(err)
	}
	check("on, no device", pod6, remote6, shot, 1)
	// The drop is an event (a flow for Hubble), with its reason and the
	// pod that sent it.
	events.SetDeadline(time.Now().Add(30 * time.Second))
	for {
		ev, err := events.Read()
		if err != nil {
			t.Fatalf("no drop event: %v", err)
		}
		if ev.Type != maps.EventDrop {
			continue
		}
		if ev.Reason != maps.ReasonUnencrypted || ev.EndpointID != 1 || ev.SrcIdentity != 70001 || ev.Src != pod6 || ev.Dst != remote6 {
			t.Fatalf("drop event %s, want %s from endpoint 1 (identity 70001) %s -> %s", ev, maps.ReasonName(maps.ReasonUnencrypted), pod6, remote6)
		}
		break
	}
	if err := em.SetDevice(wg.Attrs().Index, true, false, 0); err != nil {
		t.Fatal(err)
	}
	check("on, route in the clear", pod, remote, shot, 2)
	check("on, IPv6 through the device", pod6, remote6, pass, 2)
	check("on, node without a key", pod, keyless, shot, 3)
	check("on, no other node's pod CIDR", pod, world, pass, 3)
	route("10.2.0.0/24", wg, "")
	check("on, route through the device", pod, remote, pass, 3)
	// The node's key is gone (the cell rewrites its entry).
	if err := em.SyncCIDRs(map[netip.Prefix]bool{
		netip.MustParsePrefix("10.2.0.0/24"): false, netip.MustParsePrefix("fd00:2::/64"): true,
	}, true); err != nil {
		t.Fatal(err)
	}
	check("on, the node's key gone", pod, remote, shot, 4)
	check("on, a pruned CIDR", pod, keyless, pass, 4)
	if ifindex, strict, err := em.Device(); err != nil || ifindex != wg.Attrs().Index || !strict {
		t.Errorf("Device() = %d, %v, %v", ifindex, strict, err)
	}
}

// runFrom runs prog on pkt as if it came in on ifindex; the verdict.
func runFrom(t *testing.T, prog *ebpf.Program, ifindex int, pkt []byte) uint32 {
	t.Helper()
	var ctx struct{ Fields [11]uint32 } // struct __sk_buff up to ifindex
	ctx.Fields[10] = uint32(ifindex)
	ret, err := prog.Run(&ebpf.RunOptions{Data: pkt, Context: ctx})
	if err != nil {
		t.Fatal(err)
	}
	return ret
}

// TestPrivilegedStrictTunnel runs from_pod (BPF_PROG_TEST_RUN) in the
// tunnel routing mode with strict mode: the pod's packet for another
// node's pod leaves encapsulated, as a UDP datagram this node sends to
// the owner node's address, so strict mode asks the FIB about that
// datagram (from lo, to the tunnel's port). With the tunnel's rule and
// route to the WireGuard device (TunnelRoutes, a veth standing in for the
// device) the packet is encapsulated (redirected to the tunnel device);
// a node without a key, a destination the ipcache names no tunnel
// endpoint for, and, once the tunnel's rule and route are removed (the
// datagram would leave in the clear on the underlay), the same packet
// are dropped as UNENCRYPTED. Seen failing with the check of the pod's
// own destination (the native routing mode's), which drops the first
// case too: the pod CIDR's route goes to the tunnel device, not the
// WireGuard device.
func TestPrivilegedStrictTunnel(t *testing.T) {
	l := strictNode(t)
	pod := netip.MustParseAddr("10.1.0.2")
	remote := netip.MustParseAddr("10.2.0.5")   // node B's pod, B a peer
	keyless := netip.MustParseAddr("10.4.0.5")  // node D's pod, D without a key
	noTunnel := netip.MustParseAddr("10.5.0.5") // a peer's pod CIDR without a tunnel endpoint
	nodeB, nodeD := netip.MustParseAddr("192.168.51.2"), netip.MustParseAddr("192.168.51.4")
	ifPod := netlab.AddVeth(t, "tdrwgt0", "tdrwgtp0")
	if err := l.AttachEndpoint(loader.EndpointInfo{ID: 1, IfIndex: ifPod, IfName: "tdrwgt0",
		Addresses: []netip.Addr{pod}, Identity: 70001, MAC: net.HardwareAddr{2, 0, 0, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	wg := addLink(t, "tdrwgtdev", "10.99.1.1/32")
	addLink(t, "tdrwgtund", "192.168.51.1/24")
	nl, err := netlink.NewHandle()
	if err != nil {
		t.Fatal(err)
	}
	defer nl.Close()
	tun, err := tunnel.EnsureDevice(nl, tunnel.VXLAN, tunnel.DefaultVXLANPort)
	if err != nil {
		t.Fatal(err)
	}
	if err := tunnel.SetDevice(l.MapReplacements()[bpf.OverlayMapTdrTunnelV1], tun.Attrs().Index); err != nil {
		t.Fatal(err)
	}
	// The tunnel mode's pod CIDR routes go to the tunnel device.
	for _, c := range []string{"10.2.0.0/24", "10.4.0.0/24", "10.5.0.0/24"} {
		_, n, _ := net.ParseCIDR(c)
		if err := netlink.RouteReplace(&netlink.Route{Dst: n, LinkIndex: tun.Attrs().Index}); err != nil {
			t.Fatal(err)
		}
	}
	for p, e := range map[string]maps.IPCacheEntry{
		"10.2.0.0/24": {Identity: 9002, TunnelIP: nodeB},
		"10.4.0.0/24": {Identity: 9004, TunnelIP: nodeD},
		"10.5.0.0/24": {Identity: 9005},
	} {
		if err := l.Maps().IPCacheMap().Upsert(netip.MustParsePrefix(p), e); err != nil {
			t.Fatal(err)
		}
	}
	em, err := maps.NewEncryptMaps(l.MapReplacements())
	if err != nil {
		t.Fatal(err)
	}
	if err := em.SyncCIDRs(map[netip.Prefix]bool{
		netip.MustParsePrefix("10.2.0.0/24"): true, netip.MustParsePrefix("10.4.0.0/24"): false,
		netip.MustParsePrefix("10.5.0.0/24"): true,
	}, true); err != nil {
		t.Fatal(err)
	}
	if err := em.SetDevice(wg.Attrs().Index, true, false, tunnel.DefaultVXLANPort); err != nil {
		t.Fatal(err)
	}
	routes := TunnelRoutes(nl, "tdrwgtdev", tunnel.DefaultVXLANPort)
	if _, err := routes.Sync([]netip.Addr{nodeB, nodeD}, nil, true); err != nil {
		t.Fatal(err)
	}
	from, _ := l.Programs()
	drops := func() uint64 { return unencryptedDrops(t, l) }
	const (
		shot     = 2 // TC_ACT_SHOT
		redirect = 7 // TC_ACT_REDIRECT: to the tunnel device
	)
	check := func(what string, dst netip.Addr, want uint32, wantDrops uint64) {
		t.Helper()
		if got := runFrom(t, from, ifPod, udpFrame(pod, dst)); got != want {
			t.Errorf("%s: verdict %d, want %d", what, got, want)
		}
		if got := drops(); got != wantDrops {
			t.Errorf("%s: %d packets dropped as unencrypted, want %d", what, got, wantDrops)
		}
	}
	check("the tunnel's datagrams through the device", remote, redirect, 0)
	check("a node without a key", keyless, shot, 1)
	check("no tunnel endpoint", noTunnel, shot, 2)
	if err := routes.Remove(); err != nil {
		t.Fatal(err)
	}
	check("the tunnel's rule and route gone", remote, shot, 3)
	// Strict mode off: encapsulated whatever the routes.
	if err := em.SetDevice(wg.Attrs().Index, false, false, tunnel.DefaultVXLANPort); err != nil {
		t.Fatal(err)
	}
	check("off", remote, redirect, 3)
}

// TestPrivilegedNodeEncryptFromPod runs from_pod (BPF_PROG_TEST_RUN) on a
// local pod's frames to other nodes' own addresses with node encryption
// (--wireguard-encrypt-node): the node routes serve only what the host
// itself sends (their rule is "iif lo"), so without the datapath a pod's
// packets to a peer's address left in the clear. With the node flag and
// the peer's address in the map, what the pod starts and its replies (the
// pod answering a connection that node opened: to_pod saw its first
// packet) are redirected to the WireGuard device (a veth stands in for
// it); a node without a key, an address in no map entry, and everything
// while the device is not known are left to the host stack. Strict mode
// too: a node without a key, or no device, drops what the pod starts and
// its replies as UNENCRYPTED. Seen failing on the object before replies
// were redirected (verdict 0 for the reply to a peer's address, 7 wanted).
func TestPrivilegedNodeEncryptFromPod(t *testing.T) {
	l := strictNode(t)
	pod := netip.MustParseAddr("10.1.0.2")
	nodeB := netip.MustParseAddr("192.168.52.2")   // a peer's own address
	nodeD := netip.MustParseAddr("192.168.52.4")   // a node without a key
	outside := netip.MustParseAddr("192.168.52.9") // no node's
	remotePod := netip.MustParseAddr("10.2.0.5")   // node B's pod
	ifPod := netlab.AddVeth(t, "tdrwgn0", "tdrwgnp0")
	if err := l.AttachEndpoint(loader.EndpointInfo{ID: 1, IfIndex: ifPod, IfName: "tdrwgn0",
		Addresses: []netip.Addr{pod}, Identity: 70001, MAC: net.HardwareAddr{2, 0, 0, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	wg := addLink(t, "tdrwgndev", "10.99.2.1/32")
	addLink(t, "tdrwgnund", "192.168.52.1/24")
	em, err := maps.NewEncryptMaps(l.MapReplacements())
	if err != nil {
		t.Fatal(err)
	}
	if err := em.SyncCIDRs(map[netip.Prefix]bool{netip.MustParsePrefix("10.2.0.0/24"): true}, true); err != nil {
		t.Fatal(err)
	}
	if err := em.SyncNodeAddrs(map[netip.Addr]bool{nodeB: true, nodeD: false}, true); err != nil {
		t.Fatal(err)
	}
	if got, err := em.ReadNodeAddrs(); err != nil || len(got) != 2 || !got[nodeB] || got[nodeD] {
		t.Fatalf("ReadNodeAddrs() = %v, %v", got, err)
	}
	if got, err := em.ReadCIDRs(); err != nil || len(got) != 1 {
		t.Fatalf("ReadCIDRs() = %v, %v: the node addresses are no pod CIDRs", got, err)
	}
	from, to := l.Programs()
	drops := func() uint64 { return unencryptedDrops(t, l) }
	const (
		pass     = 0 // TC_ACT_OK: the host routes it
		shot     = 2 // TC_ACT_SHOT
		redirect = 7 // TC_ACT_REDIRECT: to the device
	)
	port := uint16(40000)
	// frame is a UDP datagram from src:sport to dst:5201.
	frame := func(src, dst netip.Addr, sport uint16) []byte {
		b := udpFrame(src, dst)
		binary.BigEndian.PutUint16(b[14+20:], sport)
		return b
	}
	check := func(what string, dst netip.Addr, want uint32, wantDrops uint64) {
		t.Helper()
		port++ // a new flow each time
		if got := runFrom(t, from, ifPod, frame(pod, dst, port)); got != want {
			t.Errorf("%s: verdict %d, want %d", what, got, want)
		}
		if got := drops(); got != wantDrops {
			t.Errorf("%s: %d packets dropped as unencrypted, want %d", what, got, wantDrops)
		}
	}
	// reply has dst open a flow to the pod (to_pod sees its first
	// packet), then runs from_pod on the pod's answer.
	reply := func(what string, dst netip.Addr, want uint32, wantDrops uint64) {
		t.Helper()
		port++
		in := udpFrame(dst, pod)
		binary.BigEndian.PutUint16(in[14+20:], 5201)
		binary.BigEndian.PutUint16(in[14+22:], port)
		if got := runFrom(t, to, ifPod, in); got != pass {
			t.Fatalf("%s: to_pod verdict %d for %s's first packet, want %d", what, got, dst, pass)
		}
		out := udpFrame(pod, dst)
		binary.BigEndian.PutUint16(out[14+20:], port)
		if got := runFrom(t, from, ifPod, out); got != want {
			t.Errorf("%s: verdict %d, want %d", what, got, want)
		}
		if got := drops(); got != wantDrops {
			t.Errorf("%s: %d packets dropped as unencrypted, want %d", what, got, wantDrops)
		}
	}

	// Node encryption off: nothing changes.
	if err := em.SetDevice(wg.Attrs().Index, false, false, 0); err != nil {
		t.Fatal(err)
	}
	check("off, a peer's address", nodeB, pass, 0)

	// On: a peer's address goes to the device.
	if err := em.SetDevice(wg.Attrs().Index, false, true, 0); err != nil {
		t.Fatal(err)
	}
	check("on, a peer's address", nodeB, redirect, 0)
	// Replies too: the peer's from_wireguard translates a NodePort
	// reply back, a host's socket takes the rest.
	reply("on, a reply to a peer's address", nodeB, redirect, 0)
	reply("on, a reply to a node without a key", nodeD, pass, 0)
	check("on, a node without a key", nodeD, pass, 0)
	check("on, no node's address", outside, pass, 0)
	check("on, a peer's pod (the route's business)", remotePod, pass, 0)
	if err := em.SetDevice(0, false, true, 0); err != nil {
		t.Fatal(err)
	}
	check("on, no device", nodeB, pass, 0)

	// Strict mode too: what would leave in the clear is dropped.
	if err := em.SetDevice(0, true, true, 0); err != nil {
		t.Fatal(err)
	}
	check("strict, no device", nodeB, shot, 1)
	if err := em.SetDevice(wg.Attrs().Index, true, true, 0); err != nil {
		t.Fatal(err)
	}
	check("strict, a peer's address", nodeB, redirect, 1)
	check("strict, a node without a key", nodeD, shot, 2)
	reply("strict, a reply to a node without a key", nodeD, shot, 3)
	reply("strict, a reply to a peer's address", nodeB, redirect, 3)
	check("strict, no node's address", outside, pass, 3)
	// The tunnel routing mode: the node's address has no tunnel
	// endpoint, the pod's packet still goes to the device.
	if err := em.SetDevice(wg.Attrs().Index, true, true, tunnel.DefaultVXLANPort); err != nil {
		t.Fatal(err)
	}
	check("strict, tunnel mode, a peer's address", nodeB, redirect, 3)

	// The address gone from the map (node encryption turned off).
	if err := em.SyncNodeAddrs(nil, true); err != nil {
		t.Fatal(err)
	}
	if got, err := em.ReadCIDRs(); err != nil || len(got) != 1 {
		t.Fatalf("ReadCIDRs() after the node addresses went = %v, %v", got, err)
	}
	check("strict, the address removed", nodeB, pass, 3)
}

// unencryptedDrops is the egress UNENCRYPTED drop counter of l's metrics.
func unencryptedDrops(t *testing.T, l *loader.Loader) uint64 {
	t.Helper()
	row, err := l.Maps().MetricsMap().Lookup(maps.ReasonUnencrypted, maps.DirEgress)
	if err != nil {
		t.Fatal(err)
	}
	return row.Packets
}
