package hostdev

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/tendril-net/tendril/pkg/datapath/linux"
	"github.com/tendril-net/tendril/pkg/datapath/loader"
	"github.com/tendril-net/tendril/pkg/datapath/maps"
	"github.com/tendril-net/tendril/pkg/testutil"
	"github.com/tendril-net/tendril/pkg/testutil/netlab"
)

// TestPrivilegedNodePortIPv6World: real IPv6 TCP from a "world" network
// namespace to a node port. The node (a netlab node namespace with a
// backend pod, the pod programs on its veth) has an uplink veth to the
// world holding its IPv6 address, with the host programs attached (TCX);
// the world holds a client address routed via its side of the veth. The
// world connects to [node6]:30080: the backend sees the client's own
// address (externalTrafficPolicy Cluster, local backend: no source NAT),
// the client's connection is answered from the node port (the reply
// turned back at to_netdev), and 1 MiB echoes intact with checksum
// offload off on both ends (a wrong L4 checksum is dropped by the
// receiver). A second node port's backend is "on another node" (an
// address of the world namespace, routed through the same link): it sees
// the node's address and a masquerade-range port, and the client the node
// port, 1 MiB echoed (SNAT, FIB redirect, the reply's reverse translation
// and redirect, for real). UDP to a node port whose backend has no socket on its port
// gets "connection refused" (the pod's ICMPv6 error translated on its
// way out). A node port whose only backend is elsewhere under
// externalTrafficPolicy Local refuses the connection (no SYN-ACK) and
// counts the drop's reason.
func TestPrivilegedNodePortIPv6World(t *testing.T) {
	testutil.Privileged(t)
	node, root := netlab.EnterNode(t, "tdrnp6", "np6world")
	be, err := node.AddPod("be", 0)
	if err != nil {
		t.Fatal(err)
	}

	// The world: its own namespace beyond the node's uplink.
	worldName := node.Name + "-world"
	if out, err := exec.Command("ip", "netns", "add", worldName).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", worldName).Run() })
	world, err := netns.GetFromName(worldName)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { world.Close() })
	la := netlink.NewLinkAttrs()
	la.Name = "tdrup"
	if err := node.Handle.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: "eth0", PeerNamespace: netlink.NsFd(int(world))}); err != nil {
		t.Fatal(err)
	}
	up, err := node.Handle.LinkByName("tdrup")
	if err != nil {
		t.Fatal(err)
	}
	worldGW := netip.MustParseAddr("fd00:ff::1")
	if err := node.Handle.AddrAdd(up, &netlink.Addr{IPNet: &net.IPNet{IP: node6.AsSlice(), Mask: net.CIDRMask(64, 128)}, Flags: unix.IFA_F_NODAD}); err != nil {
		t.Fatal(err)
	}
	if err := node.Handle.LinkSetUp(up); err != nil {
		t.Fatal(err)
	}
	wh, err := netlink.NewHandleAt(world)
	if err != nil {
		t.Fatal(err)
	}
	defer wh.Close()
	weth, err := wh.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range []*netlink.Addr{
		{IPNet: &net.IPNet{IP: worldGW.AsSlice(), Mask: net.CIDRMask(64, 128)}, Flags: unix.IFA_F_NODAD},
		{IPNet: &net.IPNet{IP: client6.AsSlice(), Mask: net.CIDRMask(128, 128)}, Flags: unix.IFA_F_NODAD},
		// A backend "on another node": the world namespace plays
		// that node too, reached through the same link.
		{IPNet: &net.IPNet{IP: peerPod6.AsSlice(), Mask: net.CIDRMask(128, 128)}, Flags: unix.IFA_F_NODAD},
	} {
		if err := wh.AddrAdd(weth, a); err != nil {
			t.Fatal(err)
		}
	}
	lo, err := wh.LinkByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range []netlink.Link{lo, weth} {
		if err := wh.LinkSetUp(l); err != nil {
			t.Fatal(err)
		}
	}
	// The node reaches the world's client addresses through the world's
	// side of the veth.
	if err := node.Handle.RouteAdd(&netlink.Route{LinkIndex: up.Attrs().Index, Dst: &net.IPNet{IP: net.ParseIP("2001:db8::"), Mask: net.CIDRMask(32, 128)}, Gw: worldGW.AsSlice()}); err != nil {
		t.Fatal(err)
	}
	if err := node.Handle.RouteAdd(&netlink.Route{LinkIndex: up.Attrs().Index, Dst: &net.IPNet{IP: net.ParseIP("fd00:10:1::"), Mask: net.CIDRMask(64, 128)}, Gw: worldGW.AsSlice()}); err != nil {
		t.Fatal(err)
	}
	// This thread is in the node's namespace: its /proc/sys/net is the node's.
	if err := os.WriteFile("/proc/sys/net/ipv6/conf/all/forwarding", []byte("1"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, cmd := range [][]string{
		{"nsenter", "--net=/run/netns/" + worldName, "ethtool", "-K", "eth0", "tx", "off"},
		{"nsenter", "--net=" + be.NetnsPath, "ethtool", "-K", "eth0", "tx", "off"},
	} {
		if out, err := exec.Command(cmd[0], cmd[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v: %s", strings.Join(cmd, " "), err, out)
		}
	}

	// The datapath: the pod programs on the backend's veth, the host
	// programs on the uplink.
	l := loader.New(loader.Config{BPFRoot: root}, nil)
	t.Cleanup(func() { _ = l.Remove() })
	if err := l.Start(); err != nil {
		t.Fatal(err)
	}
	if err := l.AttachEndpoint(loader.EndpointInfo{ID: 1, IfIndex: be.HostIfIndex, IfName: be.HostIf, Addresses: []netip.Addr{be.IPv4, be.IPv6},
		MAC: be.MAC, HostMAC: be.HostMAC, Identity: idPod}); err != nil {
		t.Fatal(err)
	}
	m := l.Maps()
	for p, id := range map[netip.Prefix]uint32{netip.MustParsePrefix("::/0"): 2, netip.PrefixFrom(be.IPv6, 128): idPod, netip.PrefixFrom(node6, 128): 1} {
		if err := m.IPCacheMap().Upsert(p, maps.IPCacheEntry{Identity: id}); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.NAT.SetHostDevice(maps.HostDevice{IfIndex: up.Attrs().Index, MasqIPv6: node6}); err != nil {
		t.Fatal(err)
	}
	h, err := Load(Options{BPFRoot: root, PortMin: 61000, PortMax: 61999, Maps: l.MapReplacements()}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	if err := h.Attach(up.Attrs().Index); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Detach(up.Attrs().Index) })
	for id, addr := range map[uint32]netip.Addr{1: be.IPv6, 2: peerPod6} {
		if err := m.LB.BackendMap().Upsert(id, maps.Backend{Addr: addr, Port: backendPort}); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.LB.ApplyService(maps.Frontend{Addr: node6, Port: npLocal, Proto: protoTCP}, maps.Service{ID: 1, RevNATID: 1, Flags: maps.SvcFlagExternal}, []uint32{1}, 0); err != nil {
		t.Fatal(err)
	}
	if err := m.LB.ApplyService(maps.Frontend{Addr: node6, Port: npETPNone, Proto: protoTCP},
		maps.Service{ID: 2, RevNATID: 2, Flags: maps.SvcFlagExternal | maps.SvcFlagExtLocal}, []uint32{2}, 0); err != nil {
		t.Fatal(err)
	}

	if err := m.LB.ApplyService(maps.Frontend{Addr: node6, Port: npRemote, Proto: protoTCP}, maps.Service{ID: 4, RevNATID: 4, Flags: maps.SvcFlagExternal}, []uint32{2}, 0); err != nil {
		t.Fatal(err)
	}

	// UDP to a port of the backend nobody listens on: the backend's
	// "port unreachable" must reach the client from the node port.
	if err := m.LB.BackendMap().Upsert(3, maps.Backend{Addr: be.IPv6, Port: 9}); err != nil {
		t.Fatal(err)
	}
	if err := m.LB.ApplyService(maps.Frontend{Addr: node6, Port: npLocal, Proto: protoUDP}, maps.Service{ID: 3, RevNATID: 3, Flags: maps.SvcFlagExternal}, []uint32{3}, 0); err != nil {
		t.Fatal(err)
	}

	// The backend: says whom it sees, then echoes.
	var ln net.Listener
	if err := be.Do(func() (err error) {
		ln, err = net.Listen("tcp", net.JoinHostPort(be.IPv6.String(), fmt.Sprint(backendPort)))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go serveWhoEcho(ln)

	// The remote backend, in the world: says whom it sees, then echoes.
	var rln net.Listener
	if err := linux.InNetNS(world, func() (err error) {
		rln, err = net.Listen("tcp", net.JoinHostPort(peerPod6.String(), fmt.Sprint(backendPort)))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer rln.Close()
	go serveWhoEcho(rln)

	// exchange connects from the world's client to the node port, reads
	// whom the backend saw and echoes 1 MiB through the connection.
	exchange := func(port uint16) (seen netip.AddrPort, peer string) {
		t.Helper()
		const size = 1 << 20
		var greeting string
		err := linux.InNetNS(world, func() error {
			// Room for SYN retransmissions (1 s, 3 s, 7 s) on a loaded
			// machine: neighbour discovery on the veths may cost the first.
			d := net.Dialer{Timeout: 10 * time.Second, LocalAddr: &net.TCPAddr{IP: client6.AsSlice()}}
			c, err := d.Dial("tcp", netip.AddrPortFrom(node6, port).String())
			if err != nil {
				return fmt.Errorf("connect to the node port: %w", err)
			}
			defer c.Close()
			peer = c.RemoteAddr().String()
			_ = c.SetDeadline(time.Now().Add(20 * time.Second))
			r := bufio.NewReader(c)
			if greeting, err = r.ReadString('\n'); err != nil {
				return fmt.Errorf("read the backend's greeting: %w", err)
			}
			data := make([]byte, size)
			_, _ = rand.Read(data)
			errc := make(chan error, 1)
			go func() { _, err := c.Write(data); errc <- err }()
			back := make([]byte, size)
			if _, err := io.ReadFull(r, back); err != nil {
				return fmt.Errorf("read the echo: %w", err)
			}
			if err := <-errc; err != nil {
				return fmt.Errorf("write: %w", err)
			}
			if !bytes.Equal(back, data) {
				return fmt.Errorf("the echo differs from what was sent")
			}
			return nil
		})
		if err != nil {
			t.Fatalf("node port %d: %v", port, err)
		}
		seen, err = netip.ParseAddrPort(strings.TrimSpace(greeting))
		if err != nil {
			t.Fatalf("node port %d: the backend's greeting %q: %v", port, greeting, err)
		}
		return seen, peer
	}

	seen, peer := exchange(npLocal)
	if want := netip.AddrPortFrom(node6, npLocal).String(); peer != want {
		t.Fatalf("the client talks to %s, want the node port %s", peer, want)
	}
	if seen.Addr() != client6 {
		t.Fatalf("the local backend saw %s, want the client %s (source kept)", seen, client6)
	}
	if n := metric(t, l, maps.ReasonNodeport, maps.DirIngress); n == 0 {
		t.Fatal("no packet counted as translated to a backend")
	}
	// The remote backend sees the node's address and a masquerade
	// port; its replies reach the client from the node port.
	seen, peer = exchange(npRemote)
	if want := netip.AddrPortFrom(node6, npRemote).String(); peer != want {
		t.Fatalf("the client talks to %s, want the node port %s", peer, want)
	}
	if seen.Addr() != node6 || !inRange(seen.Port(), 61000, 61999) {
		t.Fatalf("the remote backend saw %s, want %s and a port of 61000-61999", seen, node6)
	}
	if n := metric(t, l, maps.ReasonNodeportReply, maps.DirEgress); n == 0 {
		t.Fatal("no remote backend's reply counted as translated")
	}

	// A closed UDP port behind the node port: the client's connected
	// socket gets "connection refused" (the pod's ICMPv6 error, its
	// source and quoted destination turned into the node port).
	err = linux.InNetNS(world, func() error {
		c, err := net.DialUDP("udp6", &net.UDPAddr{IP: client6.AsSlice()}, net.UDPAddrFromAddrPort(netip.AddrPortFrom(node6, npLocal)))
		if err != nil {
			return err
		}
		defer c.Close()
		// A datagram every 200 ms until refused: the first may wait
		// for neighbour discovery, and the pod's kernel rate-limits
		// its ICMPv6 errors.
		var last error
		for range 50 {
			if _, err := c.Write([]byte("anyone?")); err != nil && !errors.Is(err, unix.ECONNREFUSED) {
				return fmt.Errorf("send: %w", err)
			} else if err != nil {
				return nil
			}
			_ = c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
			_, last = c.Read(make([]byte, 16))
			if errors.Is(last, unix.ECONNREFUSED) {
				return nil
			}
		}
		return fmt.Errorf("read after sending to a closed port: %v, want connection refused", last)
	})
	if err != nil {
		t.Fatal(err)
	}
	if n := metric(t, l, maps.ReasonNodeportICMPError, maps.DirEgress); n == 0 {
		t.Fatal("the backend's ICMPv6 error was not counted as translated")
	}

	// externalTrafficPolicy Local without a local backend: refused.
	drops := metric(t, l, maps.ReasonSvcNoLocalBackend, maps.DirIngress)
	err = linux.InNetNS(world, func() error {
		d := net.Dialer{Timeout: time.Second, LocalAddr: &net.TCPAddr{IP: client6.AsSlice()}}
		c, err := d.Dial("tcp", netip.AddrPortFrom(node6, npETPNone).String())
		if err == nil {
			c.Close()
			return fmt.Errorf("connected to a node port with no local backend")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n := metric(t, l, maps.ReasonSvcNoLocalBackend, maps.DirIngress); n <= drops {
		t.Fatalf("drops for no local backend: %d before, %d after, want more", drops, n)
	}
}

func metric(t *testing.T, l *loader.Loader, reason, dir uint8) uint64 {
	t.Helper()
	row, err := l.Maps().MetricsMap().Lookup(reason, dir)
	if err != nil {
		t.Fatal(err)
	}
	return row.Packets
}

// serveWhoEcho serves ln until it is closed: each connection is told whom
// the server sees (its remote address, a line), then echoed.
func serveWhoEcho(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			_, _ = fmt.Fprintf(c, "%s\n", c.RemoteAddr())
			_, _ = io.Copy(c, c)
		}()
	}
}
