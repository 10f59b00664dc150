package prefilter

import (
	"net"
	"net/netip"
	"runtime"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/tendril-net/tendril/pkg/testutil/netlab"
)

// BenchmarkPrefilterRealTraffic: UDP datagrams from a denied source sent
// through a veth into a node namespace, dropped there either in XDP (the
// prefilter as the agent attaches it) or at tc ingress by the same check
// (tc_prefilter, TCX: where the host device programs run), in the same
// run. A veth delivers on the sender's CPU, so the sender's rate is the
// rate the receiving side drops at, each packet's whole cost included
// (the skb the kernel builds before tc, which XDP never needs).
func BenchmarkPrefilterRealTraffic(b *testing.B) {
	d, _ := openTest(b)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		b.Fatal(err)
	}
	defer orig.Close()
	node, err := netns.New()
	if err != nil {
		b.Fatal(err)
	}
	defer node.Close()
	world, err := netns.New()
	if err != nil {
		b.Fatal(err)
	}
	defer world.Close()
	defer func() { _ = netns.Set(orig) }()
	if err := netns.Set(node); err != nil {
		b.Fatal(err)
	}
	uplink := netlab.AddVeth(b, "tdrpfb", "tdrpfbw")
	up, _ := netlink.LinkByIndex(uplink)
	_ = netlink.AddrAdd(up, &netlink.Addr{IPNet: &net.IPNet{IP: net.IPv4(192, 0, 2, 1), Mask: net.CIDRMask(24, 32)}})
	peer, _ := netlink.LinkByName("tdrpfbw")
	if err := netlink.LinkSetNsFd(peer, int(world)); err != nil {
		b.Fatal(err)
	}
	wh, err := netlink.NewHandleAt(world)
	if err != nil {
		b.Fatal(err)
	}
	defer wh.Close()
	weth, _ := wh.LinkByName("tdrpfbw")
	_ = wh.AddrAdd(weth, &netlink.Addr{IPNet: &net.IPNet{IP: net.IPv4(198, 51, 100, 7), Mask: net.CIDRMask(24, 32)}})
	_ = wh.AddrAdd(weth, &netlink.Addr{IPNet: &net.IPNet{IP: net.IPv4(192, 0, 2, 2), Mask: net.CIDRMask(24, 32)}})
	_ = wh.LinkSetUp(weth)
	_ = wh.NeighAdd(&netlink.Neigh{LinkIndex: weth.Attrs().Index, IP: net.IPv4(192, 0, 2, 1), HardwareAddr: up.Attrs().HardwareAddr, State: netlink.NUD_PERMANENT})
	if err := d.Put(netip.MustParsePrefix("198.51.100.0/24")); err != nil {
		b.Fatal(err)
	}
	if err := netns.Set(world); err != nil {
		b.Fatal(err)
	}
	tx, err := net.DialUDP("udp4", &net.UDPAddr{IP: net.IPv4(198, 51, 100, 7)}, &net.UDPAddr{IP: net.IPv4(192, 0, 2, 1), Port: 4789})
	if err != nil {
		b.Fatal(err)
	}
	defer tx.Close()
	payload := make([]byte, 18)

	run := func(b *testing.B) {
		before, _ := d.Counters()
		var werr error
		for b.Loop() {
			if _, err := tx.Write(payload); err != nil && werr == nil {
				werr = err
			}
		}
		if werr != nil {
			b.Fatalf("send: %v", werr)
		}
		after, _ := d.Counters()
		if dropped := after.IPv4Packets - before.IPv4Packets; dropped < uint64(b.N) {
			b.Fatalf("%d of %d datagrams dropped by the check", dropped, b.N)
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "pkts/s")
	}
	// Attached from this goroutine, whose thread is in the node's
	// namespace (a sub-benchmark runs on another goroutine: an ifindex
	// there would name a device of the machine's own namespace); the
	// sub-benchmarks only send, on the socket of the world namespace.
	if err := netns.Set(node); err != nil {
		b.Fatal(err)
	}
	l, err := link.AttachXDP(link.XDPOptions{Program: d.XDP(), Interface: uplink})
	if err != nil {
		b.Fatal(err)
	}
	b.Run("xdp", run)
	l.Close()
	l, err = link.AttachTCX(link.TCXOptions{Program: d.TC(), Attach: ebpf.AttachTCXIngress, Interface: uplink})
	if err != nil {
		b.Fatal(err)
	}
	b.Run("tc", run)
	l.Close()
}
