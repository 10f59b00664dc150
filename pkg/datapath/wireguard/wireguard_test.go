package wireguard

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	"golang.zx2c4.com/wireguard/wgctrl"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/tendril-net/tendril/pkg/testutil"
	"github.com/tendril-net/tendril/pkg/testutil/rawcap"
)

// serveEnv makes the test binary a device process (Spawn runs it).
const serveEnv = "TDR_WG_TEST_SERVE"

func TestMain(m *testing.M) {
	if name := os.Getenv(serveEnv); name != "" {
		if err := Serve(name, 1500-Overhead, slog.New(slog.NewTextHandler(os.Stderr, nil))); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// fakeClient is a device in memory.
type fakeClient struct {
	dev     wgtypes.Device
	configs []wgtypes.Config
}

func (f *fakeClient) Device(string) (*wgtypes.Device, error) { d := f.dev; return &d, nil }

func (f *fakeClient) ConfigureDevice(_ string, cfg wgtypes.Config) error {
	f.configs = append(f.configs, cfg)
	if cfg.PrivateKey != nil {
		f.dev.PrivateKey = *cfg.PrivateKey
	}
	if cfg.ListenPort != nil {
		f.dev.ListenPort = *cfg.ListenPort
	}
	for _, pc := range cfg.Peers {
		i := -1
		for j, p := range f.dev.Peers {
			if p.PublicKey == pc.PublicKey {
				i = j
			}
		}
		if pc.Remove {
			if i >= 0 {
				f.dev.Peers = append(f.dev.Peers[:i], f.dev.Peers[i+1:]...)
			}
			continue
		}
		p := wgtypes.Peer{PublicKey: pc.PublicKey, Endpoint: pc.Endpoint, AllowedIPs: pc.AllowedIPs}
		if i >= 0 {
			f.dev.Peers[i] = p
		} else {
			f.dev.Peers = append(f.dev.Peers, p)
		}
	}
	return nil
}

func TestConfigureByDifference(t *testing.T) {
	key, _ := wgtypes.GeneratePrivateKey()
	k1, _ := wgtypes.GeneratePrivateKey()
	k2, _ := wgtypes.GeneratePrivateKey()
	p1 := Peer{Node: "n1", PublicKey: k1.PublicKey(), Endpoint: netip.MustParseAddrPort("192.168.1.1:51871"),
		AllowedIPs: []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24")}}
	p2 := Peer{Node: "n2", PublicKey: k2.PublicKey(), Endpoint: netip.MustParseAddrPort("192.168.1.2:51871"),
		AllowedIPs: []netip.Prefix{netip.MustParsePrefix("10.244.2.0/24"), netip.MustParsePrefix("fd00:2::/64")}}
	f := &fakeClient{}
	changed, err := Configure(f, "wg", key, 51871, 0, []Peer{p1, p2})
	if err != nil || !changed {
		t.Fatalf("first configure: %v %v", changed, err)
	}
	if len(f.dev.Peers) != 2 || f.dev.PrivateKey != key || f.dev.ListenPort != 51871 {
		t.Fatalf("device %+v", f.dev)
	}
	// Same again: nothing sent (sessions stay).
	if changed, err := Configure(f, "wg", key, 51871, 0, []Peer{p2, p1}); err != nil || changed {
		t.Fatalf("unchanged peers reconfigured: %v %v (%+v)", changed, err, f.configs[len(f.configs)-1])
	}
	// n2 goes, n1's CIDR changes: n1 updated in place, n2 removed, only
	// those two in the configuration.
	p1.AllowedIPs = []netip.Prefix{netip.MustParsePrefix("10.244.9.0/24")}
	if _, err := Configure(f, "wg", key, 51871, 0, []Peer{p1}); err != nil {
		t.Fatal(err)
	}
	last := f.configs[len(f.configs)-1]
	if last.PrivateKey != nil || last.ReplacePeers || len(last.Peers) != 2 {
		t.Fatalf("configuration %+v", last)
	}
	if len(f.dev.Peers) != 1 || f.dev.Peers[0].AllowedIPs[0].String() != "10.244.9.0/24" {
		t.Fatalf("peers %+v", f.dev.Peers)
	}
	// A new key: only the key is sent.
	key2, _ := wgtypes.GeneratePrivateKey()
	if _, err := Configure(f, "wg", key2, 51871, 0, []Peer{p1}); err != nil {
		t.Fatal(err)
	}
	if last := f.configs[len(f.configs)-1]; last.PrivateKey == nil || len(last.Peers) != 0 {
		t.Fatalf("rotation sent %+v", last)
	}
}

// inNS runs fn on a thread in ns.
func inNS(t *testing.T, ns netns.NsHandle, fn func() error) {
	t.Helper()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		// The thread is left in ns and dies with the goroutine (not
		// unlocked), so no other goroutine runs in ns by accident.
		if err := netns.Set(ns); err != nil {
			errc <- err
			return
		}
		errc <- fn()
	}()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

func newNS(t *testing.T) (netns.NsHandle, *netlink.Handle) {
	t.Helper()
	var ns netns.NsHandle
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		var err error
		ns, err = netns.New()
		errc <- err
	}()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close(); ns.Close() })
	lo, _ := h.LinkByName("lo")
	_ = h.LinkSetUp(lo)
	return ns, h
}

// veth makes a pair a (in ha) and b (in nsb) with the addresses, up.
func veth(t *testing.T, ha *netlink.Handle, a string, addrA netip.Prefix, hb *netlink.Handle, nsb netns.NsHandle, b string, addrB netip.Prefix) {
	t.Helper()
	if err := ha.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: a}, PeerName: b, PeerNamespace: netlink.NsFd(nsb)}); err != nil {
		t.Fatalf("veth %s: %v", a, err)
	}
	for _, x := range []struct {
		h    *netlink.Handle
		name string
		addr netip.Prefix
	}{{ha, a, addrA}, {hb, b, addrB}} {
		l, err := x.h.LinkByName(x.name)
		if err != nil {
			t.Fatal(err)
		}
		// IPv6 without duplicate address detection: usable at once.
		if err := x.h.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: x.addr.Addr().AsSlice(), Mask: net.CIDRMask(x.addr.Bits(), x.addr.Addr().BitLen())},
			Flags: unix.IFA_F_NODAD}); err != nil {
			t.Fatal(err)
		}
		if err := x.h.LinkSetUp(l); err != nil {
			t.Fatal(err)
		}
	}
}

// TestPrivilegedEncryptedBetweenNodes: two namespaces as nodes on one
// link, each with a pod; each node runs the userspace device in a process
// of its own (Spawn), configured by Configure with the other node as peer
// and its pod CIDR routed to the device. Pods exchange TCP and UDP; a
// capture on the link sees only UDP between the node addresses on the
// WireGuard port, never a pod address or the payload. Then the device's
// process outlives its client, is found again by a new client, and goes
// with Stop.
func TestPrivilegedEncryptedBetweenNodes(t *testing.T) {
	testutil.Privileged(t)
	tp := newTopology(t, false)
	nsA, hA, nsB, hB, podA, podB := tp.nsA, tp.hA, tp.nsB, tp.hB, tp.podA, tp.podB
	nodeA, nodeB, cidrA, cidrB, ipB := tp.nodeA, tp.nodeB, tp.cidrA, tp.cidrB, tp.ipB

	client, err := wgctrl.New()
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	devA, devB := "tdwgtestA", "tdwgtestB"
	keyA, _ := wgtypes.GeneratePrivateKey()
	keyB, _ := wgtypes.GeneratePrivateKey()
	logPath := filepath.Join(t.TempDir(), "device.log")
	pids := startDevices(t, client, logPath,
		wgNode{nsA, hA, devA, keyA, Peer{Node: "b", PublicKey: keyB.PublicKey(), Endpoint: netip.AddrPortFrom(nodeB, DefaultPort), AllowedIPs: []netip.Prefix{cidrB}}},
		wgNode{nsB, hB, devB, keyB, Peer{Node: "a", PublicKey: keyA.PublicKey(), Endpoint: netip.AddrPortFrom(nodeA, DefaultPort), AllowedIPs: []netip.Prefix{cidrA}}})

	// The capture on node A's end of the link: both directions.
	frames := capture(t, nsA, "link")
	marker := []byte("tendril-wireguard-cleartext-marker")

	// TCP: pod A sends to pod B, which echoes.
	payload := bytes.Repeat(marker, 2000)
	tc := echoConn(t, podA, podB, ipB)
	// The connection's socket stays in pod A's namespace: it is used
	// from any thread.
	echo := func(what string) {
		t.Helper()
		go func() { _, _ = tc.Write(payload) }()
		got := make([]byte, len(payload))
		if _, err := io.ReadFull(tc, got); err != nil {
			t.Fatalf("tcp echo %s: %v", what, err)
		}
		if !bytes.Equal(got, payload) {
			t.Fatalf("tcp echo %s differs", what)
		}
	}
	echo("before")
	// UDP: pod A to pod B and back.
	var uc net.PacketConn
	inNS(t, podB, func() error {
		var err error
		uc, err = net.ListenPacket("udp", netip.AddrPortFrom(ipB, 5002).String())
		return err
	})
	defer uc.Close()
	go func() {
		buf := make([]byte, 2048)
		for {
			n, from, err := uc.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = uc.WriteTo(buf[:n], from)
		}
	}()
	inNS(t, podA, func() error {
		c, err := net.Dial("udp", netip.AddrPortFrom(ipB, 5002).String())
		if err != nil {
			return err
		}
		defer c.Close()
		buf := make([]byte, 2048)
		// Retried: a datagram may be lost while nothing is wrong.
		for i := 0; i < 50; i++ {
			if _, err := c.Write(marker); err != nil {
				return err
			}
			_ = c.SetReadDeadline(time.Now().Add(time.Second))
			n, err := c.Read(buf)
			if err == nil && bytes.Equal(buf[:n], marker) {
				return nil
			}
		}
		return fmt.Errorf("udp pod to pod: no answer")
	})

	got := frames()
	var wg int
	for _, f := range got {
		if bytes.Contains(f, marker) {
			t.Fatalf("payload in the clear on the link: % x", f[:min(len(f), 64)])
		}
		if len(f) < 14 {
			continue
		}
		switch binary.BigEndian.Uint16(f[12:14]) {
		case unix.ETH_P_ARP, unix.ETH_P_IPV6:
			// Neighbour resolution, IPv6 link-local chatter: no pod
			// address in either (checked below for IPv4 only: the pods
			// here have none of IPv6).
			continue
		case unix.ETH_P_IP:
		default:
			t.Fatalf("unexpected frame type %#x on the link", binary.BigEndian.Uint16(f[12:14]))
		}
		ip := f[14:]
		src, _ := netip.AddrFromSlice(ip[12:16])
		dst, _ := netip.AddrFromSlice(ip[16:20])
		ihl := int(ip[0]&0xf) * 4
		if ip[9] != unix.IPPROTO_UDP {
			t.Fatalf("IPv4 protocol %d between %s and %s on the link, want only UDP", ip[9], src, dst)
		}
		sport, dport := binary.BigEndian.Uint16(ip[ihl:]), binary.BigEndian.Uint16(ip[ihl+2:])
		nodes := (src == nodeA && dst == nodeB) || (src == nodeB && dst == nodeA)
		if !nodes || sport != DefaultPort || dport != DefaultPort {
			t.Fatalf("UDP %s:%d > %s:%d on the link, want only the nodes' WireGuard port", src, sport, dst, dport)
		}
		wg++
	}
	if wg == 0 {
		t.Fatalf("no WireGuard datagram captured (%d frames)", len(got))
	}
	t.Logf("%d frames on the link, %d WireGuard datagrams between the nodes", len(got), wg)

	// Peers and counters as the status will show them.
	d, err := client.Device(devA)
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Peers) != 1 || d.Peers[0].LastHandshakeTime.IsZero() || d.Peers[0].ReceiveBytes == 0 || d.Peers[0].TransmitBytes == 0 {
		t.Fatalf("device A's peer %+v", d.Peers)
	}

	// Key rotation under an open connection: node A takes a new key,
	// node B learns it (the old peer removed, the new one added, as the
	// agent's reconciler does when A's TendrilNode changes); the
	// connection goes on, not reset.
	newA, _ := wgtypes.GeneratePrivateKey()
	if _, err := Configure(client, devA, newA, DefaultPort, 0, []Peer{{Node: "b", PublicKey: keyB.PublicKey(),
		Endpoint: netip.AddrPortFrom(nodeB, DefaultPort), AllowedIPs: []netip.Prefix{cidrB}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := Configure(client, devB, keyB, DefaultPort, 0, []Peer{{Node: "a", PublicKey: newA.PublicKey(),
		Endpoint: netip.AddrPortFrom(nodeA, DefaultPort), AllowedIPs: []netip.Prefix{cidrA}}}); err != nil {
		t.Fatal(err)
	}
	echo("after the key rotation")
	if d, err := client.Device(devB); err != nil || len(d.Peers) != 1 || d.Peers[0].PublicKey != newA.PublicKey() || d.Peers[0].LastHandshakeTime.IsZero() {
		t.Fatalf("device B after the rotation: %+v %v", d, err)
	}

	// The device outlives its client: a new client finds it, as an agent
	// restarted would.
	client.Close()
	c2, err := wgctrl.New()
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	inNS(t, nsA, func() error {
		if !Running(c2, devA) {
			return fmt.Errorf("device %s not found by a new client", devA)
		}
		return nil
	})

	// The device's process killed (as a container runtime kills every
	// process of a restarted agent container): the persistent TUN link
	// stays with its ifindex and the route to it, so pod A's packets for
	// pod B are dropped there, none leaves on the link in the clear. A
	// new process attaches to the same link; configured again (its key
	// and peer lived in the dead process), the same TCP connection goes
	// on.
	lA, err := hA.LinkByName(devA)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pids[devA], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 30*time.Second, "the killed device process to be reaped", func() bool {
		return syscall.Kill(pids[devA], 0) != nil
	})
	gap := capture(t, nsA, "link")
	l, err := hA.LinkByName(devA)
	if err != nil {
		t.Fatalf("device %s gone with its process: %v", devA, err)
	}
	if l.Attrs().Index != lA.Attrs().Index {
		t.Fatalf("device %s after its process died: ifindex %d, was %d", devA, l.Attrs().Index, lA.Attrs().Index)
	}
	routes, err := hA.RouteList(l, netlink.FAMILY_V4)
	if err != nil || !slices.ContainsFunc(routes, func(r netlink.Route) bool { return r.Dst != nil && r.Dst.String() == cidrB.String() }) {
		t.Fatalf("route %s to %s gone with the process: %v %v", cidrB, devA, routes, err)
	}
	inNS(t, nsA, func() error {
		if Running(c2, devA) {
			return fmt.Errorf("device %s answers wgctrl with no process", devA)
		}
		return nil
	})
	// Pod A writes while no process reads the device: queued in its
	// socket, retransmitted, dropped at the device.
	go func() { _, _ = tc.Write(payload) }()
	time.Sleep(2 * time.Second)
	inNS(t, nsA, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		pid, err := Spawn(ctx, c2, devA, []string{"/usr/bin/env", serveEnv + "=" + devA, os.Args[0]}, logPath)
		pids[devA] = pid
		return err
	})
	if l, err := hA.LinkByName(devA); err != nil || l.Attrs().Index != lA.Attrs().Index {
		t.Fatalf("the new process made another device: %v", err)
	}
	// The new process restored what the dead one saved (its key, port
	// and peer): the agent's next reconcile finds nothing to change, and
	// the connection goes on before it.
	echoed := make([]byte, len(payload))
	if err := tc.SetReadDeadline(time.Now().Add(20 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(tc, echoed); err != nil || !bytes.Equal(echoed, payload) {
		t.Fatalf("tcp echo across the device process's restart, before any configuration: %v", err)
	}
	if changed, err := Configure(c2, devA, newA, DefaultPort, 0, []Peer{{Node: "b", PublicKey: keyB.PublicKey(),
		Endpoint: netip.AddrPortFrom(nodeB, DefaultPort), AllowedIPs: []netip.Prefix{cidrB}}}); err != nil || changed {
		t.Fatalf("configuring the restored device: changed %v, %v; want nothing to change", changed, err)
	}
	if _, err := tc.Write(payload); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(tc, echoed); err != nil || !bytes.Equal(echoed, payload) {
		t.Fatalf("tcp echo across the device process's restart: %v", err)
	}
	for _, f := range gap() {
		if bytes.Contains(f, marker) {
			t.Fatalf("payload in the clear on the link while the device had no process")
		}
		if len(f) >= 34 && binary.BigEndian.Uint16(f[12:14]) == unix.ETH_P_IP {
			if src, _ := netip.AddrFromSlice(f[26:30]); cidrA.Contains(src) || cidrB.Contains(src) {
				t.Fatalf("a pod's packet (%s) on the link while the device had no process", src)
			}
		}
	}

	// Stop ends the process, and removes the saved configuration (it
	// holds the private key).
	inNS(t, nsA, func() error { return Stop(devA) })
	if _, err := os.Stat(StatePath(devA)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s after Stop: %v, want it removed", StatePath(devA), err)
	}
	// Spawn's waiter reaps it: then it is gone.
	testutil.Eventually(t, 30*time.Second, "the device process to end", func() bool {
		return syscall.Kill(pids[devA], 0) != nil
	})
}

// capture reads every frame on dev in ns until the returned function is
// called, which returns them.
func capture(t *testing.T, ns netns.NsHandle, dev string) func() [][]byte {
	t.Helper()
	var c *rawcap.Capture
	inNS(t, ns, func() (err error) {
		c, err = rawcap.Start(dev)
		return err
	})
	return c.Stop
}

// TestPrivilegedWaitRunning: a device another process serves (the chart's
// wireguard-device container): WaitRunning gives up with an error while
// no process serves the name, returns once one does, and SetMTU sets the
// link's MTU the device was made with (1420 here) to the agent's.
func TestPrivilegedWaitRunning(t *testing.T) {
	testutil.Privileged(t)
	ns, h := newNS(t)
	client, err := wgctrl.New()
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	const dev = "tdwgtestW"
	inNS(t, ns, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		if err := WaitRunning(ctx, client, dev); err == nil {
			return errors.New("WaitRunning returned with no device served")
		}
		return nil
	})
	cmd := exec.Command("nsenter", "--net=/proc/self/fd/3", "/usr/bin/env", serveEnv+"="+dev, os.Args[0])
	// A duplicate of the handle's descriptor: an os.File owns its
	// descriptor and closes it when collected, which would close the
	// handle's number under whatever test reuses it next.
	dup, err := unix.Dup(int(ns))
	if err != nil {
		t.Fatal(err)
	}
	nsFile := os.NewFile(uintptr(dup), "netns")
	defer nsFile.Close()
	cmd.ExtraFiles = []*os.File{nsFile}
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		inNS(t, ns, func() error { return Stop(dev) })
		_ = cmd.Wait()
	})
	inNS(t, ns, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := WaitRunning(ctx, client, dev); err != nil {
			return err
		}
		return SetMTU(dev, 1330)
	})
	l, err := h.LinkByName(dev)
	if err != nil {
		t.Fatal(err)
	}
	if l.Attrs().MTU != 1330 {
		t.Errorf("%s MTU %d, want 1330", dev, l.Attrs().MTU)
	}
}

// TestPrivilegedEncryptedIPv6: the device over an IPv6 underlay carrying
// IPv6 pods' traffic (the lab's nodes talk IPv4, so this is where the
// IPv6 underlay runs): two nodes with only IPv6 addresses on their link,
// peers at each other's [address]:port, each pod's /64 routed to the
// device. A TCP stream from pod A to pod B's echo server comes back
// whole, and a capture on node A's link sees only UDP over IPv6 between
// the node addresses on the WireGuard port: no pod address, no payload.
// The device's MTU (1500 less Overhead, TestMain's) leaves room for the
// IPv6 outer header: the stream's full-sized segments arrive without
// fragments.
func TestPrivilegedEncryptedIPv6(t *testing.T) {
	testutil.Privileged(t)
	tp := newTopology(t, true)
	nsA, hA, nsB, hB, podA, podB := tp.nsA, tp.hA, tp.nsB, tp.hB, tp.podA, tp.podB
	nodeA, nodeB, cidrA, cidrB, ipB := tp.nodeA, tp.nodeB, tp.cidrA, tp.cidrB, tp.ipB
	client, err := wgctrl.New()
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	devA, devB := "tdwgtest6A", "tdwgtest6B"
	keyA, _ := wgtypes.GeneratePrivateKey()
	keyB, _ := wgtypes.GeneratePrivateKey()
	startDevices(t, client, filepath.Join(t.TempDir(), "device.log"),
		wgNode{nsA, hA, devA, keyA, Peer{Node: "b", PublicKey: keyB.PublicKey(), Endpoint: netip.AddrPortFrom(nodeB, DefaultPort), AllowedIPs: []netip.Prefix{cidrB}}},
		wgNode{nsB, hB, devB, keyB, Peer{Node: "a", PublicKey: keyA.PublicKey(), Endpoint: netip.AddrPortFrom(nodeA, DefaultPort), AllowedIPs: []netip.Prefix{cidrA}}})

	frames := capture(t, nsA, "link")
	marker := []byte("tendril-wireguard-ipv6-cleartext-marker")
	payload := bytes.Repeat(marker, 2000)
	tc := echoConn(t, podA, podB, ipB)
	if err := tc.SetDeadline(time.Now().Add(30 * time.Second)); err != nil {
		t.Fatal(err)
	}
	go func() { _, _ = tc.Write(payload) }()
	got := make([]byte, len(payload))
	if _, err := io.ReadFull(tc, got); err != nil || !bytes.Equal(got, payload) {
		t.Fatalf("tcp echo over the IPv6 underlay: %v", err)
	}
	wg, fragments := 0, 0
	all := frames()
	for _, f := range all {
		if bytes.Contains(f, marker) {
			t.Fatal("payload in the clear on the link")
		}
		if len(f) < 58 || binary.BigEndian.Uint16(f[12:14]) != unix.ETH_P_IPV6 {
			continue
		}
		src, _ := netip.AddrFromSlice(f[22:38])
		dst, _ := netip.AddrFromSlice(f[38:54])
		if cidrA.Contains(src) || cidrA.Contains(dst) || cidrB.Contains(src) || cidrB.Contains(dst) {
			t.Fatalf("a pod's packet %s -> %s on the link", src, dst)
		}
		switch f[20] {
		case unix.IPPROTO_FRAGMENT:
			fragments++
		case unix.IPPROTO_UDP:
			if binary.BigEndian.Uint16(f[54:56]) == DefaultPort && binary.BigEndian.Uint16(f[56:58]) == DefaultPort &&
				((src == nodeA && dst == nodeB) || (src == nodeB && dst == nodeA)) {
				wg++
			}
		}
	}
	if wg == 0 || fragments > 0 {
		t.Fatalf("%d frames on the link: %d WireGuard datagrams over IPv6 between the nodes, %d fragments; want some and none", len(all), wg, fragments)
	}
	t.Logf("%d frames on the link, %d WireGuard datagrams over IPv6 between the nodes, no fragment, nothing of a pod", len(all), wg)
}

// wgNode is one node of a two-node test: its namespace, the device's
// name and key, and its one peer (whose allowed IPs are routed to the
// device).
type wgNode struct {
	ns   netns.NsHandle
	h    *netlink.Handle
	dev  string
	key  wgtypes.Key
	peer Peer
}

// startDevices starts each node's device process in its namespace
// (stopped at the end of the test), configures its key and peer, and
// routes the peer's allowed IPs to the device; it returns the processes'
// pids by device.
func startDevices(t *testing.T, client *wgctrl.Client, logPath string, nodes ...wgNode) map[string]int {
	t.Helper()
	pids := map[string]int{}
	for _, n := range nodes {
		// The cleanup first: a device process a failed start left alive
		// would hold the name's socket for the next run.
		t.Cleanup(func() {
			inNS(t, n.ns, func() error { return Stop(n.dev) })
			// Only while the pid is still that device's process (a
			// reaped one's pid may be another process's by now).
			if pid := pids[n.dev]; pid > 0 {
				if env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid)); err == nil && bytes.Contains(env, []byte(serveEnv+"="+n.dev+"\x00")) {
					_ = syscall.Kill(pid, syscall.SIGKILL)
				}
			}
		})
		inNS(t, n.ns, func() error {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			pid, err := Spawn(ctx, client, n.dev, []string{"/usr/bin/env", serveEnv + "=" + n.dev, os.Args[0]}, logPath)
			pids[n.dev] = pid
			return err
		})
		if _, err := Configure(client, n.dev, n.key, DefaultPort, 0, []Peer{n.peer}); err != nil {
			t.Fatal(err)
		}
		l, err := n.h.LinkByName(n.dev)
		if err != nil {
			t.Fatalf("device %s not in the node's namespace: %v", n.dev, err)
		}
		for _, c := range n.peer.AllowedIPs {
			if err := n.h.RouteAdd(&netlink.Route{Dst: &net.IPNet{IP: c.Addr().AsSlice(), Mask: net.CIDRMask(c.Bits(), c.Addr().BitLen())},
				LinkIndex: l.Attrs().Index, Scope: netlink.SCOPE_LINK}); err != nil {
				t.Fatal(err)
			}
		}
	}
	return pids
}

// topology is two nodes on one link, each with a pod behind a veth whose
// node side is the pod's gateway (the first address of its CIDR), and
// forwarding on.
type topology struct {
	nsA, nsB, podA, podB netns.NsHandle
	hA, hB               *netlink.Handle
	nodeA, nodeB         netip.Addr
	cidrA, cidrB         netip.Prefix
	ipA, ipB             netip.Addr
}

// newTopology builds a topology of one family: IPv4 (192.168.77.0/24
// between the nodes, pods in 10.201.1.0/24 and 10.201.2.0/24) or IPv6
// (fd00:77::/64, pods in fd00:201:1::/64 and fd00:201:2::/64).
func newTopology(t *testing.T, v6 bool) topology {
	t.Helper()
	tp := topology{
		nodeA: netip.MustParseAddr("192.168.77.1"), nodeB: netip.MustParseAddr("192.168.77.2"),
		cidrA: netip.MustParsePrefix("10.201.1.0/24"), cidrB: netip.MustParsePrefix("10.201.2.0/24"),
	}
	link, forward, any := 24, "/proc/sys/net/ipv4/ip_forward", net.IPv4zero.To4()
	if v6 {
		tp.nodeA, tp.nodeB = netip.MustParseAddr("fd00:77::1"), netip.MustParseAddr("fd00:77::2")
		tp.cidrA, tp.cidrB = netip.MustParsePrefix("fd00:201:1::/64"), netip.MustParsePrefix("fd00:201:2::/64")
		link, forward, any = 64, "/proc/sys/net/ipv6/conf/all/forwarding", net.IPv6zero
	}
	tp.ipA, tp.ipB = tp.cidrA.Addr().Next().Next(), tp.cidrB.Addr().Next().Next()
	var hPA, hPB *netlink.Handle
	tp.nsA, tp.hA = newNS(t)
	tp.nsB, tp.hB = newNS(t)
	tp.podA, hPA = newNS(t)
	tp.podB, hPB = newNS(t)
	veth(t, tp.hA, "link", netip.PrefixFrom(tp.nodeA, link), tp.hB, tp.nsB, "link", netip.PrefixFrom(tp.nodeB, link))
	for _, p := range []struct {
		h     *netlink.Handle
		node  string
		hPod  *netlink.Handle
		pod   netns.NsHandle
		cidr  netip.Prefix
		podIP netip.Addr
	}{{tp.hA, "poda", hPA, tp.podA, tp.cidrA, tp.ipA}, {tp.hB, "podb", hPB, tp.podB, tp.cidrB, tp.ipB}} {
		gw := p.cidr.Addr().Next()
		veth(t, p.h, p.node, netip.PrefixFrom(gw, p.cidr.Bits()), p.hPod, p.pod, "eth0", netip.PrefixFrom(p.podIP, p.cidr.Bits()))
		if err := p.hPod.RouteAdd(&netlink.Route{Dst: &net.IPNet{IP: any, Mask: net.CIDRMask(0, 8*len(any))}, Gw: gw.AsSlice()}); err != nil {
			t.Fatal(err)
		}
	}
	for _, ns := range []netns.NsHandle{tp.nsA, tp.nsB} {
		inNS(t, ns, func() error { return os.WriteFile(forward, []byte("1"), 0) })
	}
	return tp
}

// echoConn starts a TCP echo server in the namespace server at addr:5001
// and returns a connection to it from the namespace client (closed at the
// end of the test; its socket stays in client's namespace, usable from
// any thread).
func echoConn(t *testing.T, client, server netns.NsHandle, addr netip.Addr) net.Conn {
	t.Helper()
	var ln net.Listener
	inNS(t, server, func() error {
		var err error
		ln, err = net.Listen("tcp", netip.AddrPortFrom(addr, 5001).String())
		return err
	})
	t.Cleanup(func() { ln.Close() })
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		_, _ = io.Copy(c, c)
	}()
	var tc net.Conn
	inNS(t, client, func() error {
		var err error
		tc, err = net.DialTimeout("tcp", netip.AddrPortFrom(addr, 5001).String(), 30*time.Second)
		if err != nil {
			return fmt.Errorf("tcp pod to pod: %w", err)
		}
		return nil
	})
	t.Cleanup(func() { tc.Close() })
	return tc
}

// TestPrivilegedCreateKernel: the kernel's WireGuard where it has the
// module, else false with no error and nothing made, so the caller runs
// the userspace device; a link of another kind already holding the name
// (a userspace device's persistent TUN) is left to it. This machine's
// kernel has no WireGuard module: the kernel branch (a "wireguard" link,
// configured by wgctrl over generic netlink) runs only where it has one.
func TestPrivilegedCreateKernel(t *testing.T) {
	testutil.Privileged(t)
	ns, h := newNS(t)
	client, err := wgctrl.New()
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	inNS(t, ns, func() error {
		made, err := CreateKernel("tdwgk", 1420)
		if err != nil {
			return err
		}
		l, lerr := netlink.LinkByName("tdwgk")
		if made {
			t.Log("the kernel has WireGuard: a kernel device was made")
			if lerr != nil || l.Type() != "wireguard" || l.Attrs().MTU != 1420 {
				return fmt.Errorf("kernel device: %v %v", l, lerr)
			}
			if _, err := client.Device("tdwgk"); err != nil {
				return fmt.Errorf("wgctrl on the kernel device: %w", err)
			}
			if again, err := CreateKernel("tdwgk", 1420); err != nil || !again {
				return fmt.Errorf("the kernel device made again: %v, %v; want it taken as made", again, err)
			}
			return Stop("tdwgk")
		}
		t.Log("the kernel has no WireGuard: the userspace device's turn")
		if lerr == nil {
			return fmt.Errorf("no kernel WireGuard, yet a link %s (%s) was made", l.Attrs().Name, l.Type())
		}
		return nil
	})
	// A TUN link holds the name: not taken for a kernel device.
	inNS(t, ns, func() error {
		tun := &netlink.Tuntap{LinkAttrs: netlink.LinkAttrs{Name: "tdwgk"}, Mode: netlink.TUNTAP_MODE_TUN, Flags: netlink.TUNTAP_NO_PI}
		if err := netlink.LinkAdd(tun); err != nil {
			return err
		}
		made, err := CreateKernel("tdwgk", 1420)
		if err != nil || made {
			return fmt.Errorf("name held by a TUN link: made %v, %v; want false, nil", made, err)
		}
		return nil
	})
	if l, err := h.LinkByName("tdwgk"); err != nil || l.Type() != "tuntap" {
		t.Fatalf("the TUN link after CreateKernel: %v %v", l, err)
	}
}
