package tunnel

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

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/tendril-net/tendril/pkg/datapath/bpf"
	"github.com/tendril-net/tendril/pkg/datapath/loader"
	"github.com/tendril-net/tendril/pkg/datapath/maps"
	"github.com/tendril-net/tendril/pkg/testutil"
	"github.com/tendril-net/tendril/pkg/testutil/netlab"
)

// node is a loader started in a network namespace of the test's own,
// the test's thread locked in it (BPF_PROG_TEST_RUN resolves the
// context's ifindex in the caller's namespace).
type node struct {
	l  *loader.Loader
	nl *netlink.Handle
}

func newNode(t testing.TB) *node {
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
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	l := loader.New(loader.Config{BPFRoot: filepath.Join("/sys/fs/bpf", "tendril-tuntest-"+hex.EncodeToString(b)), DirectDelivery: true}, nil)
	t.Cleanup(func() { _ = l.Remove() })
	if err := l.Start(); err != nil {
		t.Fatal(err)
	}
	nl, err := netlink.NewHandle()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nl.Close() })
	return &node{l: l, nl: nl}
}

// frame is an Ethernet frame of a UDP datagram from src to dst.
func frame(src, dst netip.Addr) []byte {
	b := make([]byte, 14+20+8+18)
	copy(b[0:6], []byte{2, 0, 0, 0, 0, 1})
	copy(b[6:12], []byte{2, 0, 0, 0, 0, 2})
	binary.BigEndian.PutUint16(b[12:], 0x0800)
	ip := b[14:]
	copy(ip, testutil.IPv4Header(src, dst, 17, 64, 8+18))
	udp := ip[20:]
	binary.BigEndian.PutUint16(udp[0:], 40000)
	binary.BigEndian.PutUint16(udp[2:], 5201)
	binary.BigEndian.PutUint16(udp[4:], 8+18)
	return b
}

// frame6 is an Ethernet frame of an IPv6 UDP datagram from src to dst.
func frame6(src, dst netip.Addr) []byte {
	b := make([]byte, 14+40+8+18)
	copy(b[0:6], []byte{2, 0, 0, 0, 0, 1})
	copy(b[6:12], []byte{2, 0, 0, 0, 0, 2})
	binary.BigEndian.PutUint16(b[12:], 0x86DD)
	ip := b[14:]
	ip[0] = 0x60
	binary.BigEndian.PutUint16(ip[4:], 8+18)
	ip[6], ip[7] = 17, 64
	s, d := src.As16(), dst.As16()
	copy(ip[8:], s[:])
	copy(ip[24:], d[:])
	udp := ip[40:]
	binary.BigEndian.PutUint16(udp[0:], 40000)
	binary.BigEndian.PutUint16(udp[2:], 5201)
	binary.BigEndian.PutUint16(udp[4:], 8+18)
	return b
}

// run runs prog on pkt as if it came in on ifindex; the verdict.
func run(t *testing.T, prog *ebpf.Program, ifindex int, pkt []byte) uint32 {
	t.Helper()
	var ctx struct{ Fields [11]uint32 } // struct __sk_buff up to ifindex
	ctx.Fields[10] = uint32(ifindex)
	ret, err := prog.Run(&ebpf.RunOptions{Data: pkt, Context: ctx})
	if err != nil {
		t.Fatal(err)
	}
	return ret
}

const (
	tcActOK       = 0
	tcActRedirect = 7
)

var (
	podA      = netip.MustParseAddr("10.1.0.2")
	podA6     = netip.MustParseAddr("fd00::a")
	remote6   = netip.MustParseAddr("fd00:2::5") // in a peer's IPv6 pod CIDR
	podB      = netip.MustParseAddr("10.1.0.3")
	remotePod = netip.MustParseAddr("10.2.0.5") // in a peer's pod CIDR
	world     = netip.MustParseAddr("10.3.0.9") // no owner node
	peerNode  = netip.MustParseAddr("192.168.50.2")
)

const (
	idA      = 70001
	idB      = 70002
	idRemote = 70003
)

// TestPrivilegedEncapDecision runs from_pod (BPF_PROG_TEST_RUN) on
// frames of a local pod: to another node's pod (the ipcache names the
// owner node), IPv4 or IPv6 inside, over an IPv4 or IPv6 underlay, it is
// redirected to the tunnel device and counted as sent
// to the overlay; to a local pod it is delivered directly, not tunnelled;
// to an address without an owner node, and in native routing (the map's
// device 0), it goes to the host stack. The tunnel key's contents (the
// owner node, the identity in the VNI) are not visible to a test run:
// TestPrivilegedOverlayCarriesIdentity sends real packets for that.
func TestPrivilegedEncapDecision(t *testing.T) {
	n := newNode(t)
	ifA := netlab.AddVeth(t, "tdrtun0", "tdrtunp0")
	ifB := netlab.AddVeth(t, "tdrtun1", "tdrtunp1")
	for _, ep := range []loader.EndpointInfo{
		{ID: 1, IfIndex: ifA, IfName: "tdrtun0", Addresses: []netip.Addr{podA, podA6}, Identity: idA, MAC: net.HardwareAddr{2, 0, 0, 0, 0, 1}},
		{ID: 2, IfIndex: ifB, IfName: "tdrtun1", Addresses: []netip.Addr{podB}, Identity: idB, MAC: net.HardwareAddr{2, 0, 0, 0, 0, 3}},
	} {
		if err := n.l.AttachEndpoint(ep); err != nil {
			t.Fatal(err)
		}
	}
	m := n.l.Maps()
	for p, e := range map[string]maps.IPCacheEntry{
		"10.1.0.2/32": {Identity: idA}, "10.1.0.3/32": {Identity: idB},
		"10.2.0.0/24": {Identity: idRemote, TunnelIP: peerNode},
		"10.3.0.0/24": {Identity: 2},
		"fd00::a/128": {Identity: idA}, "fd00:2::/64": {Identity: idRemote, TunnelIP: peerNode},
		"fd00:3::/64": {Identity: idRemote, TunnelIP: netip.MustParseAddr("fd99::2")}, // a node on an IPv6 underlay
	} {
		if err := m.IPCacheMap().Upsert(netip.MustParsePrefix(p), e); err != nil {
			t.Fatal(err)
		}
	}
	dev, err := EnsureDevice(n.nl, VXLAN, DefaultVXLANPort)
	if err != nil {
		t.Fatal(err)
	}
	tunMap := n.l.MapReplacements()[bpf.OverlayMapTdrTunnelV1]
	if err := SetDevice(tunMap, dev.Attrs().Index); err != nil {
		t.Fatal(err)
	}
	from, _ := n.l.Programs()
	overlay := func() uint64 {
		t.Helper()
		row, err := m.MetricsMap().Lookup(maps.ReasonToOverlay, maps.DirEgress)
		if err != nil {
			t.Fatal(err)
		}
		return row.Packets
	}

	if got := run(t, from, ifA, frame(podA, remotePod)); got != tcActRedirect {
		t.Fatalf("remote pod: verdict %d, want %d (redirect to the tunnel device)", got, tcActRedirect)
	}
	if got := overlay(); got != 1 {
		t.Fatalf("remote pod: %d packets sent to the overlay, want 1", got)
	}
	// IPv6 inside, the same IPv4 underlay.
	if got := run(t, from, ifA, frame6(podA6, remote6)); got != tcActRedirect {
		t.Fatalf("remote pod over IPv6: verdict %d, want %d", got, tcActRedirect)
	}
	if got := overlay(); got != 2 {
		t.Fatalf("remote pod over IPv6: %d packets sent to the overlay, want 2", got)
	}
	// An owner node on an IPv6 underlay (the key's IPv6 remote).
	if got := run(t, from, ifA, frame6(podA6, netip.MustParseAddr("fd00:3::7"))); got != tcActRedirect {
		t.Fatalf("remote pod of a node on an IPv6 underlay: verdict %d, want %d", got, tcActRedirect)
	}
	if got := overlay(); got != 3 {
		t.Fatalf("remote pod of a node on an IPv6 underlay: %d packets sent to the overlay, want 3", got)
	}
	// A local pod: delivered into its namespace (a redirect too), not
	// through the overlay.
	run(t, from, ifA, frame(podA, podB))
	if got := overlay(); got != 3 {
		t.Fatalf("local pod: %d packets sent to the overlay, want still 3", got)
	}
	if got := run(t, from, ifA, frame(podA, world)); got != tcActOK {
		t.Fatalf("address without an owner node: verdict %d, want %d (the host's routes)", got, tcActOK)
	}
	// Native routing: the map names no device.
	if err := SetDevice(tunMap, 0); err != nil {
		t.Fatal(err)
	}
	if got := run(t, from, ifA, frame(podA, remotePod)); got != tcActOK {
		t.Fatalf("native routing, remote pod: verdict %d, want %d", got, tcActOK)
	}
	if got := overlay(); got != 3 {
		t.Fatalf("after the other frames: %d packets sent to the overlay, want still 3", got)
	}
}

// TestPrivilegedOverlayAttach: the overlay programs load with the pod
// programs' maps (the verifier accepts them), attach to the device with
// pinned TCX links, take a new program in place on the same device (an
// agent's restart), move to a device created again, and go with Detach;
// EnsureDevice keeps a matching device (ARP off) and replaces one of
// another port.
func TestPrivilegedOverlayAttach(t *testing.T) {
	n := newNode(t)
	dev, err := EnsureDevice(n.nl, VXLAN, DefaultVXLANPort)
	if err != nil {
		t.Fatal(err)
	}
	if again, err := EnsureDevice(n.nl, VXLAN, DefaultVXLANPort); err != nil || again.Attrs().Index != dev.Attrs().Index {
		t.Fatalf("a matching device was not kept: %v", err)
	}
	if l, err := n.nl.LinkByName(DeviceName(VXLAN)); err != nil || l.Attrs().RawFlags&unix.IFF_NOARP == 0 {
		t.Errorf("tunnel device with ARP on (%v)", err)
	}
	root, err := os.MkdirTemp("/sys/fs/bpf", "tendril-tunlinks-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(root) })
	attached := func(ifindex int) int {
		t.Helper()
		count := 0
		for _, name := range []string{linkIngress, linkEgress} {
			lk, err := link.LoadPinnedLink(filepath.Join(root, name), nil)
			if err != nil {
				continue
			}
			if on, err := loader.TCXIfindex(lk); err == nil && on == ifindex {
				count++
			}
			lk.Close()
		}
		return count
	}
	for round := range 2 {
		p, err := Load(n.l.MapReplacements(), "", false)
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Attach(dev.Attrs().Index, root); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		p.Close()
		if got := attached(dev.Attrs().Index); got != 2 {
			t.Fatalf("round %d: %d pinned links on the device, want 2", round, got)
		}
	}
	// Another port: the device is replaced (a new ifindex), and the
	// programs follow it there.
	moved, err := EnsureDevice(n.nl, VXLAN, 4789)
	if err != nil {
		t.Fatal(err)
	}
	if moved.Attrs().Index == dev.Attrs().Index {
		t.Fatal("a device of another port was kept")
	}
	p, err := Load(n.l.MapReplacements(), "", false)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if err := p.Attach(moved.Attrs().Index, root); err != nil {
		t.Fatal(err)
	}
	if got := attached(moved.Attrs().Index); got != 2 {
		t.Fatalf("%d pinned links on the new device, want 2", got)
	}
	if err := Detach(root); err != nil {
		t.Fatal(err)
	}
	if got := attached(moved.Attrs().Index); got != 0 {
		t.Fatalf("%d pinned links after Detach", got)
	}
	if err := RemoveDevices(n.nl, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := n.nl.LinkByName(DeviceName(VXLAN)); err == nil {
		t.Fatal("the device is still there after RemoveDevices")
	}
}
