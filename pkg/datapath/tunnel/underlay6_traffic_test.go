package tunnel

import (
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/tendril-net/tendril/pkg/datapath/bpf"
	"github.com/tendril-net/tendril/pkg/datapath/loader"
	"github.com/tendril-net/tendril/pkg/datapath/maps"
	"github.com/tendril-net/tendril/pkg/testutil"
	"github.com/tendril-net/tendril/pkg/testutil/netlab"
	"github.com/tendril-net/tendril/pkg/testutil/rawcap"
)

// The IPv6-only underlay of TestPrivilegedTunnelIPv6Underlay: one veth
// between the two nodes' namespaces, named tdru6 on both sides.
const underDev = "tdru6"

var underAddrs = [2]netip.Addr{netip.MustParseAddr("fd00:99:6::1"), netip.MustParseAddr("fd00:99:6::2")}

// Identities of the two pods (one per node) and of the nodes as each
// other's remote node.
const (
	idPod0, idPod1 = 4101, 4102
	idPeerNode     = 6
)

// u6Node is one node of the IPv6-underlay lab: a netlab node whose
// datapath (loader, host programs on the underlay, overlay programs) runs
// in tunnel mode, with one pod.
type u6Node struct {
	*netlab.Node
	l   *loader.Loader
	pod *netlab.Pod
}

// tlogWriter puts the loader's warnings into the test's log.
type tlogWriter struct{ t testing.TB }

func (w tlogWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// inNode runs fn on the calling goroutine's thread moved into n's
// namespace (TCX attach, AF_PACKET sockets and /proc/sys/net resolve
// there).
func inNode(t *testing.T, n *netlab.Node, fn func()) {
	t.Helper()
	leave, err := n.Enter()
	if err != nil {
		t.Fatal(err)
	}
	defer leave()
	fn()
}

// newU6Lab builds the two nodes: their namespaces joined by the underlay
// veth with only fd00:99:6::1/64 and ::2/64 on it (no IPv4 address on the
// underlay), each with pod i (10.77.0.10+i, fd00:77::10+i), its loader in
// direct delivery, the host programs on the underlay device and the
// overlay of protocol p (VXLAN: the kernel's collect-metadata device;
// Geneve: Geneve in eBPF and its carrier), and in each node's ipcache the
// other's pod with the other's IPv6 underlay address as tunnel endpoint.
func newU6Lab(t *testing.T, p Protocol) [2]*u6Node {
	t.Helper()
	var nodes [2]*u6Node
	for i := range nodes {
		n, err := netlab.NewNode("tdru6")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = n.Close() })
		nodes[i] = &u6Node{Node: n}
	}
	la := netlink.NewLinkAttrs()
	la.Name = underDev
	if err := nodes[0].Handle.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: underDev, PeerNamespace: netlink.NsFd(int(nodes[1].NS))}); err != nil {
		t.Fatal(err)
	}
	for i, n := range nodes {
		pod, err := n.AddPod(fmt.Sprintf("u6p%d", i), i)
		if err != nil {
			t.Fatal(err)
		}
		n.pod = pod
		setPodMTU(t, pod, 1500-Overhead(p, true))
		inNode(t, n.Node, func() { setupU6Node(t, n, i, p) })
	}
	for i, n := range nodes {
		peer := nodes[1-i]
		m := n.l.Maps()
		entries := map[netip.Prefix]maps.IPCacheEntry{
			netip.PrefixFrom(underAddrs[i], 128):   {Identity: 1},
			netip.PrefixFrom(underAddrs[1-i], 128): {Identity: idPeerNode, Flags: maps.IPCacheFlagRemoteNode},
		}
		for _, a := range []netip.Addr{n.pod.IPv4, n.pod.IPv6} {
			entries[netip.PrefixFrom(a, a.BitLen())] = maps.IPCacheEntry{Identity: uint32(idPod0 + i)}
		}
		for _, a := range []netip.Addr{peer.pod.IPv4, peer.pod.IPv6} {
			entries[netip.PrefixFrom(a, a.BitLen())] = maps.IPCacheEntry{Identity: uint32(idPod0 + 1 - i), TunnelIP: underAddrs[1-i]}
		}
		for pfx, e := range entries {
			if err := m.IPCacheMap().Upsert(pfx, e); err != nil {
				t.Fatal(err)
			}
		}
	}
	return nodes
}

// setPodMTU gives the pod's eth0 the MTU the agent gives pods in tunnel
// mode (agentendpoints.MTUOverhead): 1500 less the encapsulation over the
// IPv6 underlay, so its packets fit the underlay once encapsulated.
func setPodMTU(t *testing.T, pod *netlab.Pod, mtu int) {
	t.Helper()
	ph, err := netlink.NewHandleAt(pod.NS)
	if err != nil {
		t.Fatal(err)
	}
	defer ph.Close()
	eth, err := ph.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	if err := ph.LinkSetMTU(eth, mtu); err != nil {
		t.Fatal(err)
	}
}

// setupU6Node is node i's part of newU6Lab, run in its namespace.
func setupU6Node(t *testing.T, n *u6Node, i int, p Protocol) {
	t.Helper()
	for _, knob := range []string{"ipv4/conf/all/forwarding", "ipv6/conf/all/forwarding"} {
		if err := os.WriteFile("/proc/sys/net/"+knob, []byte("1"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	under, err := n.Handle.LinkByName(underDev)
	if err != nil {
		t.Fatal(err)
	}
	a, _ := netlink.ParseAddr(underAddrs[i].String() + "/64")
	a.Flags = unix.IFA_F_NODAD
	if err := n.Handle.AddrAdd(under, a); err != nil {
		t.Fatal(err)
	}
	if err := n.Handle.LinkSetUp(under); err != nil {
		t.Fatal(err)
	}
	root := filepath.Join("/sys/fs/bpf", fmt.Sprintf("tendril-u6test-%s", n.Name))
	t.Cleanup(func() { _ = os.RemoveAll(root) })
	n.l = loader.New(loader.Config{BPFRoot: root, DirectDelivery: true},
		slog.New(slog.NewTextHandler(tlogWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn})))
	t.Cleanup(func() { _ = n.l.Close() })
	if err := n.l.Start(); err != nil {
		t.Fatal(err)
	}
	ep := loader.EndpointInfo{ID: uint16(1 + i), IfIndex: n.pod.HostIfIndex, IfName: n.pod.HostIf,
		Addresses: []netip.Addr{n.pod.IPv4, n.pod.IPv6}, MAC: n.pod.MAC, HostMAC: n.pod.HostMAC, Identity: uint32(idPod0 + i)}
	if err := n.l.AttachEndpoint(ep); err != nil {
		t.Fatal(err)
	}
	m := n.l.Maps()
	if err := m.NAT.SetNoMasquerade([]netip.Prefix{netip.MustParsePrefix("10.77.0.0/24"), netip.MustParsePrefix("fd00:77::/64")}); err != nil {
		t.Fatal(err)
	}
	attachHost(t, n.l, under.Attrs().Index)

	r := n.l.MapReplacements()
	overlay, err := Load(r, "", false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = overlay.Close() })
	links := filepath.Join(root, "overlay-links")
	var dev netlink.Link
	if p == Geneve {
		if dev, err = EnsureCarrier(n.Handle, true); err != nil {
			t.Fatal(err)
		}
		if err := SetGeneveBPF(r[bpf.OverlayMapTdrTunnelV1], r[bpf.OverlayMapTdrOverlayCallsV1], overlay); err != nil {
			t.Fatal(err)
		}
	} else {
		if dev, err = EnsureDevice(n.Handle, VXLAN, DefaultVXLANPort); err != nil {
			t.Fatal(err)
		}
		if err := SetDevice(r[bpf.OverlayMapTdrTunnelV1], dev.Attrs().Index); err != nil {
			t.Fatal(err)
		}
	}
	if err := overlay.Attach(dev.Attrs().Index, links); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = Detach(links) })
}

// attachHost loads bpf/bpf_host.c's programs with l's maps, as
// pkg/agent/hostdev does by default, and attaches them to the underlay
// device ifindex (from_netdev decapsulates Geneve in eBPF).
func attachHost(t *testing.T, l *loader.Loader, ifindex int) {
	t.Helper()
	spec, err := bpf.LoadHost()
	if err != nil {
		t.Fatal(err)
	}
	for name, v := range map[string]any{"MASQ_PORT_MIN": uint16(61000), "MASQ_PORT_MAX": uint16(65535), "NODEPORT_OFF": uint8(0)} {
		if err := spec.Variables[name].Set(v); err != nil {
			t.Fatalf("set %s: %v", name, err)
		}
	}
	var objs struct {
		To   *ebpf.Program `ebpf:"to_netdev"`
		From *ebpf.Program `ebpf:"from_netdev"`
	}
	if err := spec.LoadAndAssign(&objs, &ebpf.CollectionOptions{MapReplacements: l.MapReplacements()}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { objs.To.Close(); objs.From.Close() })
	for _, a := range []struct {
		prog *ebpf.Program
		at   ebpf.AttachType
	}{{objs.From, ebpf.AttachTCXIngress}, {objs.To, ebpf.AttachTCXEgress}} {
		lk, err := link.AttachTCX(link.TCXOptions{Interface: ifindex, Program: a.prog, Attach: a.at})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = lk.Close() })
	}
}

// TestPrivilegedTunnelIPv6Underlay: two IPv6-only nodes (their underlay
// has no IPv4 address), each with a pod behind the real datapath in
// tunnel mode, Geneve in eBPF and the kernel's VXLAN device in turn: TCP,
// UDP and ping between the pods, IPv4 and IPv6 inside, cross the
// underlay, where every frame is IPv6 (UDP to the tunnel's port, or the
// neighbour discovery of the underlay) and no pod address shows.
func TestPrivilegedTunnelIPv6Underlay(t *testing.T) {
	testutil.Privileged(t)
	for _, tc := range []struct {
		name  string
		proto Protocol
		port  uint16
	}{{"Geneve", Geneve, DefaultGenevePort}, {"VXLAN", VXLAN, DefaultVXLANPort}} {
		t.Run(tc.name, func(t *testing.T) {
			nodes := newU6Lab(t, tc.proto)
			var capture *rawcap.Capture
			inNode(t, nodes[0].Node, func() {
				var err error
				if capture, err = rawcap.Start(underDev); err != nil {
					t.Fatal(err)
				}
			})
			defer capture.Stop()
			for _, fam := range []struct {
				name string
				addr func(*netlab.Pod) netip.Addr
			}{{"IPv4", func(p *netlab.Pod) netip.Addr { return p.IPv4 }}, {"IPv6", func(p *netlab.Pod) netip.Addr { return p.IPv6 }}} {
				t.Run(fam.name+"_over_IPv6", func(t *testing.T) {
					client, server := nodes[0].pod, nodes[1].pod
					dst := fam.addr(server)
					podTCP(t, client, server, dst)
					podUDP(t, client, server, dst)
					if out, err := client.Command("ping", "-c", "3", "-i", "0.2", "-W", "2", dst.String()).CombinedOutput(); err != nil {
						t.Errorf("ping %s: %v: %s", dst, err, out)
					}
				})
			}
			checkUnderlay6Wire(t, capture.Stop(), tc.port, nodes)
		})
	}
}

// podTCP sends 256 KiB from client to an echo server in server on dst
// and reads it back whole.
func podTCP(t *testing.T, client, server *netlab.Pod, dst netip.Addr) {
	t.Helper()
	var ln net.Listener
	if err := server.Do(func() (err error) {
		ln, err = net.Listen("tcp", net.JoinHostPort(dst.String(), "7001"))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		_, _ = io.Copy(c, c)
	}()
	var c net.Conn
	if err := client.Do(func() (err error) {
		c, err = net.DialTimeout("tcp", net.JoinHostPort(dst.String(), "7001"), 5*time.Second)
		return err
	}); err != nil {
		t.Fatalf("TCP to %s: %v", dst, err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	want := make([]byte, 256<<10)
	for i := range want {
		want[i] = byte(i * 7)
	}
	go func() { _, _ = c.Write(want) }()
	got := make([]byte, len(want))
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatalf("TCP to %s: echo: %v", dst, err)
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("TCP to %s: byte %d differs", dst, i)
		}
	}
}

// podUDP sends datagrams from client to an echo server in server on dst
// until one comes back (the first may meet the underlay's neighbour
// resolution), then checks ten more round trips.
func podUDP(t *testing.T, client, server *netlab.Pod, dst netip.Addr) {
	t.Helper()
	var srv net.PacketConn
	if err := server.Do(func() (err error) {
		srv, err = net.ListenPacket("udp", net.JoinHostPort(dst.String(), "7002"))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	go func() {
		buf := make([]byte, 2048)
		for {
			n, from, err := srv.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = srv.WriteTo(buf[:n], from)
		}
	}()
	var c net.Conn
	if err := client.Do(func() (err error) {
		c, err = net.Dial("udp", net.JoinHostPort(dst.String(), "7002"))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	answered := 0
	buf := make([]byte, 2048)
	for i := 0; i < 30 && answered < 11; i++ {
		msg := fmt.Sprintf("datagram %d to %s", i, dst)
		if _, err := c.Write([]byte(msg)); err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
		n, err := c.Read(buf)
		if err == nil && string(buf[:n]) == msg {
			answered++
		}
	}
	if answered < 11 {
		t.Fatalf("UDP to %s: %d of 11 datagrams echoed", dst, answered)
	}
}

// checkUnderlay6Wire: what node 0's underlay device saw carries no IPv4
// frame and no pod address in the clear; every IPv6 frame is UDP to port
// (the tunnel's, both ways) between the underlay addresses, or ICMPv6 (with MLD's
// hop-by-hop header); the tunnel frames are many (the TCP stream alone is hundreds).
func checkUnderlay6Wire(t *testing.T, frames [][]byte, port uint16, nodes [2]*u6Node) {
	t.Helper()
	pods := map[netip.Addr]bool{}
	for _, n := range nodes {
		pods[n.pod.IPv4], pods[n.pod.IPv6] = true, true
	}
	tunnelFrames, tunnelBytes := 0, 0
	for _, f := range frames {
		if len(f) < 14 {
			continue
		}
		switch binary.BigEndian.Uint16(f[12:14]) {
		case 0x86dd:
		case 0x0800, 0x0806:
			t.Errorf("IPv4 or ARP on the IPv6-only underlay: % x", f[:min(len(f), 48)])
			continue
		default:
			continue
		}
		if len(f) < 14+40 {
			t.Errorf("short IPv6 frame: % x", f)
			continue
		}
		ip := f[14:]
		src, _ := netip.AddrFromSlice(ip[8:24])
		dst, _ := netip.AddrFromSlice(ip[24:40])
		if pods[src] || pods[dst] {
			t.Errorf("pod traffic in the clear on the underlay: %s -> %s", src, dst)
			continue
		}
		switch {
		case ip[6] == unix.IPPROTO_ICMPV6:
		case ip[6] == 0 && dst.IsMulticast():
			// A hop-by-hop header: the underlay's own MLD reports.
		case ip[6] == unix.IPPROTO_UDP:
			if len(ip) < 48 {
				t.Errorf("short UDP frame: % x", f)
				continue
			}
			if got := binary.BigEndian.Uint16(ip[42:44]); got != port {
				t.Errorf("UDP %s -> %s to port %d, want the tunnel's %d", src, dst, got, port)
				continue
			}
			if src != underAddrs[0] && src != underAddrs[1] || dst != underAddrs[0] && dst != underAddrs[1] {
				t.Errorf("tunnel frame %s -> %s not between the underlay addresses", src, dst)
				continue
			}
			tunnelFrames++
			tunnelBytes += len(f)
		default:
			t.Errorf("IPv6 next header %d on the underlay: %s -> %s", ip[6], src, dst)
		}
	}
	// The TCP streams alone are 1 MiB on the underlay (256 KiB each way,
	// both families); a quarter less leaves room for what the capture's
	// socket may still drop under load (the frames are GSO's, up to 64 KiB).
	if tunnelBytes < 768<<10 {
		t.Errorf("%d bytes in %d tunnel frames to port %d on the underlay, want the pods' TCP streams (1 MiB)", tunnelBytes, tunnelFrames, port)
	}
	t.Logf("%d frames on the underlay, %d of them UDP over IPv6 to port %d (%d bytes)", len(frames), tunnelFrames, port, tunnelBytes)
}
