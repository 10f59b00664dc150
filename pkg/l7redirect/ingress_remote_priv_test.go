package l7redirect

import (
	"bufio"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	flowpb "github.com/cilium/cilium/api/v1/flow"
	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/tendril-net/tendril/pkg/agent/hostdev"
	"github.com/tendril-net/tendril/pkg/datapath/linux"
	"github.com/tendril-net/tendril/pkg/datapath/loader"
	"github.com/tendril-net/tendril/pkg/datapath/maps"
	"github.com/tendril-net/tendril/pkg/datapath/tunnel"
	"github.com/tendril-net/tendril/pkg/policy"
	"github.com/tendril-net/tendril/pkg/policy/api"
	"github.com/tendril-net/tendril/pkg/testutil"
)

// Real traffic between network namespaces, ingress from another node
// (native routing): a second namespace stands for the other node, wired to
// this node's device by a veth pair, and sends from remote pod addresses
// (10.78.0.0/24, routed through it) that the ipcache gives identities of
// their own: in native routing the node's device runs the host programs
// (from_netdev); in tunnel mode the other node sends through VXLAN to the
// node's tendril_vxlan, which runs from_overlay. Pod
// b's ingress entry for remote client a's identity on TCP 8080 names the
// HTTP proxy (GET only); client d's identity has no entry.
//
// a's GET, POST, GET on one kept-alive connection are answered 200, 403,
// 200 through the ingress listener, b's server sees the two GETs over one
// upstream connection, the proxy asks for b's rules for a's identity (the
// datapath's, read from the flow's conntrack entry: the proxy knows no
// endpoint at a's address), and the flows are INGRESS with a's identity
// and name the rule. d cannot connect. With the proxies closed, a cannot
// connect either (fail closed). Before from_netdev redirected such flows,
// b's to_pod dropped a's SYN and the first request failed. The _IPv6
// subtests do the same over IPv6 (remote pods in fd00:78::/64; the other
// node's own address, the underlay, stays IPv4).
func TestPrivilegedIngressRedirectRemoteNode(t *testing.T) {
	testutil.Privileged(t)
	t.Run("native", func(t *testing.T) { testIngressRemote(t, false, false) })
	t.Run("vxlan", func(t *testing.T) { testIngressRemote(t, true, false) })
	t.Run("native_IPv6", func(t *testing.T) { testIngressRemote(t, false, true) })
	t.Run("vxlan_IPv6", func(t *testing.T) { testIngressRemote(t, true, true) })
}

// testIngressRemote is TestPrivilegedIngressRedirectRemoteNode in native
// routing (the node's device eth1 runs from_netdev) or tunnel mode (the
// other node sends through a VXLAN device to the node's tendril_vxlan,
// which runs from_overlay; its VNI is ignored there, the identity is the
// ipcache's for the inner source, whose owner must be the outer source).
// v6: the pods' traffic is IPv6.
func testIngressRemote(t *testing.T, vxlan, v6 bool) {
	node, l, root, pods := redirectNode(t, "tdrl7r", "b")
	pb := pods[0]
	addrB := podAddr(pb, v6)
	m := l.Maps()
	remoteA, remoteD := netip.MustParseAddr("10.78.0.10"), netip.MustParseAddr("10.78.0.11")
	// ip's arguments for the remote pods' addresses and prefix, this
	// node's pods' prefix, and the other node's next hop (native).
	remoteBits, remoteNet, localNet, family := "/32", "10.78.0.0/24", "10.77.0.0/24", "-4"
	if v6 {
		remoteA, remoteD = netip.MustParseAddr("fd00:78::10"), netip.MustParseAddr("fd00:78::11")
		remoteBits, remoteNet, localNet, family = "/128", "fd00:78::/64", "fd00:77::/64", "-6"
	}
	peerNode := netip.MustParseAddr("192.168.78.2")
	const idA, idB, idD, idPeerNode = 3301, 3302, 3304, 6

	// The other node: a namespace behind this node's device eth1.
	peerName := node.Name + "-peer"
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	run("netns", "add", peerName)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", peerName).Run() })
	peerNS, err := netns.GetFromName(peerName)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { peerNS.Close() })
	run("-n", node.Name, "link", "add", "eth1", "type", "veth", "peer", "name", "eth0", "netns", peerName)
	run("-n", node.Name, "addr", "add", "192.168.78.1/24", "dev", "eth1")
	run("-n", node.Name, "link", "set", "eth1", "up")
	run("-n", peerName, "addr", "add", peerNode.String()+"/24", "dev", "eth0")
	run("-n", peerName, "link", "set", "eth0", "up")
	run("-n", peerName, "link", "set", "lo", "up")
	if !vxlan {
		nodeHop, peerHop := "192.168.78.1", peerNode.String()
		if v6 {
			nodeHop, peerHop = "fd00:1:78::1", "fd00:1:78::2"
			run("-n", node.Name, "addr", "add", nodeHop+"/64", "dev", "eth1", "nodad")
			run("-n", peerName, "addr", "add", peerHop+"/64", "dev", "eth0", "nodad")
		}
		run("-n", node.Name, family, "route", "add", remoteNet, "via", peerHop, "dev", "eth1")
		run("-n", peerName, "addr", "add", remoteA.String()+remoteBits, "dev", "eth0", "nodad")
		run("-n", peerName, "addr", "add", remoteD.String()+remoteBits, "dev", "eth0", "nodad")
		run("-n", peerName, family, "route", "add", localNet, "via", nodeHop, "dev", "eth0")
		dev, err := netlink.LinkByName("eth1")
		if err != nil {
			t.Fatal(err)
		}
		host, err := hostdev.Load(hostdev.Options{BPFRoot: root, PortMin: 61000, PortMax: 61999, Maps: l.MapReplacements()}, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(host.Close)
		if err := host.Attach(dev.Attrs().Index); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = host.Detach(dev.Attrs().Index) })
	} else {
		dev, err := tunnel.EnsureDevice(node.Handle, tunnel.VXLAN, tunnel.DefaultVXLANPort)
		if err != nil {
			t.Fatal(err)
		}
		progs, err := tunnel.Load(l.MapReplacements(), root, false)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = progs.Close() })
		links := filepath.Join(root, "links")
		if err := progs.Attach(dev.Attrs().Index, links); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = tunnel.Detach(links) })
		run("-n", node.Name, family, "route", "add", remoteNet, "dev", dev.Attrs().Name)
		// The other node's VXLAN device: b's replies come with b's
		// identity as VNI (to_overlay), so that is the device's. The
		// node's device has no ARP and addresses its frames to its own
		// MAC (from_overlay makes a frame the host's); the other node
		// takes them as its host's too (hostFrames).
		run("-n", peerName, "link", "add", "vx0", "type", "vxlan", "id", fmt.Sprint(idB), "remote", "192.168.78.1",
			"local", peerNode.String(), "dstport", fmt.Sprint(tunnel.DefaultVXLANPort), "dev", "eth0")
		run("-n", peerName, "link", "set", "vx0", "arp", "off")
		hostFrames(t, peerNS, "vx0")
		run("-n", peerName, "addr", "add", remoteA.String()+remoteBits, "dev", "vx0", "nodad")
		run("-n", peerName, "addr", "add", remoteD.String()+remoteBits, "dev", "vx0", "nodad")
		run("-n", peerName, "link", "set", "vx0", "up")
		run("-n", peerName, family, "route", "add", localNet, "dev", "vx0")
		if err := m.IPCacheMap().Upsert(netip.PrefixFrom(peerNode, 32), maps.IPCacheEntry{Identity: idPeerNode, Flags: maps.IPCacheFlagRemoteNode}); err != nil {
			t.Fatal(err)
		}
	}
	var tunnelIP netip.Addr
	if vxlan {
		tunnelIP = peerNode
	}
	for p, id := range map[netip.Addr]uint32{remoteA: idA, remoteD: idD} {
		if err := m.IPCacheMap().Upsert(netip.PrefixFrom(p, p.BitLen()), maps.IPCacheEntry{Identity: id, TunnelIP: tunnelIP}); err != nil {
			t.Fatal(err)
		}
	}
	for p, id := range map[netip.Addr]uint32{addrB: idB} {
		if err := m.IPCacheMap().Upsert(netip.PrefixFrom(p, p.BitLen()), maps.IPCacheEntry{Identity: id}); err != nil {
			t.Fatal(err)
		}
	}
	bEP := loader.EndpointInfo{ID: 2, IfIndex: pb.HostIfIndex, IfName: pb.HostIf, Addresses: []netip.Addr{pb.IPv4, pb.IPv6},
		MAC: pb.MAC, HostMAC: pb.HostMAC, Identity: idB, EnforceIngress: true, L7Ingress: true}
	if err := l.AttachEndpoint(bEP); err != nil {
		t.Fatal(err)
	}
	k := maps.PolicyKey{EndpointID: 2, Direction: maps.DirIngress, Identity: idA, Proto: 6, Port: 8080, PortPrefixLen: 16}
	if err := m.PolicyMap().Upsert(k, maps.PolicyValue{Cookie: 12, Proxy: maps.ProxyHttp}); err != nil {
		t.Fatal(err)
	}

	var mu sync.Mutex
	var methods []string
	remotes := map[string]bool{}
	var httpL net.Listener
	if err := pb.Do(func() (err error) {
		httpL, err = net.Listen("tcp", net.JoinHostPort(addrB.String(), "8080"))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		methods = append(methods, r.Method)
		remotes[r.RemoteAddr] = true
		mu.Unlock()
		_, _ = io.Copy(io.Discard, r.Body)
		fmt.Fprint(w, "hello from b")
	})}
	go func() { _ = srv.Serve(httpL) }()
	t.Cleanup(func() { _ = srv.Close() })

	var flows []*flowpb.Flow
	var asked []string
	rule := api.PortRuleHTTP{Method: "GET", Path: "/ok.*"}
	cfg := Config{
		BPFRoot: root,
		Log:     slog.New(slog.NewTextHandler(testLog{t}, &slog.HandlerOptions{Level: slog.LevelDebug})),
		// Only b is a local endpoint: the remote clients' identities
		// can come from the datapath alone.
		Endpoint: func(addr netip.Addr) (Sender, bool) {
			if addr == pb.IPv4 || addr == pb.IPv6 {
				return Sender{2, idB}, true
			}
			return Sender{}, false
		},
		Rules: func(uint16, netip.AddrPort, uint8) *policy.L7Rules { return nil },
		IngressRules: func(ep uint16, src uint32, srcAddr netip.Addr, port uint16) *policy.L7Rules {
			mu.Lock()
			asked = append(asked, fmt.Sprintf("%d<-%d@%s:%d", ep, src, srcAddr, port))
			mu.Unlock()
			if ep != 2 || src != idA || port != 8080 {
				return nil
			}
			return &policy.L7Rules{HTTP: []api.PortRuleHTTP{rule}}
		},
		DNS: fqdnConfig(&mu, new([]string), new([]*flowpb.Flow)),
		HTTPFlow: func(f *flowpb.Flow) {
			mu.Lock()
			flows = append(flows, f)
			mu.Unlock()
		},
		InNodeNS: func(fn func() error) error { return linux.InNetNS(node.NS, fn) },
	}
	r, closeProxies := startRedirect(t, cfg)

	dialFrom := func(src netip.Addr, timeout time.Duration) (net.Conn, error) {
		var c net.Conn
		err := linux.InNetNS(peerNS, func() (err error) {
			d := net.Dialer{Timeout: timeout, LocalAddr: &net.TCPAddr{IP: src.AsSlice()}}
			c, err = d.Dial("tcp", net.JoinHostPort(addrB.String(), "8080"))
			return err
		})
		return c, err
	}

	// a: GET, POST, GET on one connection.
	var codes []int
	var bodies []string
	var srcPort uint16
	err = func() error {
		c, err := dialFrom(remoteA, 5*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		srcPort = uint16(c.LocalAddr().(*net.TCPAddr).Port)
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		br := bufio.NewReader(c)
		for _, req := range []string{
			"GET /ok HTTP/1.1\r\nHost: b\r\n\r\n",
			"POST /ok HTTP/1.1\r\nHost: b\r\nContent-Length: 2\r\n\r\nhi",
			"GET /ok/again HTTP/1.1\r\nHost: b\r\n\r\n",
		} {
			if _, err := io.WriteString(c, req); err != nil {
				return err
			}
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				return err
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			codes = append(codes, resp.StatusCode)
			bodies = append(bodies, string(b))
		}
		// The flow's entry as the datapath wrote it, while the
		// connection is open.
		e, ok, err := r.ct.Lookup(maps.CTEntry{Proto: unix.IPPROTO_TCP, Src: remoteA, SrcPort: srcPort, Dst: addrB, DstPort: 8080})
		if err != nil || !ok {
			return fmt.Errorf("no conntrack entry for a's flow (%v)", err)
		}
		if e.Proxy != maps.ProxyHttpIngress || e.SrcIdentity != idA || e.SrcEndpoint != 0 || e.DstEndpoint != 2 || e.Flags&maps.CTFlagSrcNotLocal == 0 {
			return fmt.Errorf("a's conntrack entry %+v: want the ingress proxy, a's identity %d, source not local, b admitting", e, idA)
		}
		return nil
	}()
	if err != nil {
		mu.Lock()
		t.Logf("rules asked for %v, %d flows", asked, len(flows))
		mu.Unlock()
		t.Fatalf("remote a's HTTP to b's 8080 through the ingress proxy: %v", err)
	}
	if fmt.Sprint(codes) != "[200 403 200]" || bodies[0] != "hello from b" || bodies[2] != "hello from b" {
		t.Errorf("GET, POST, GET answered %v %q, want [200 403 200] with b's body for the GETs", codes, bodies)
	}
	mu.Lock()
	if fmt.Sprint(methods) != "[GET GET]" {
		t.Errorf("b's server got %v, want [GET GET] (the POST never leaves the proxy)", methods)
	}
	if len(remotes) != 1 {
		t.Errorf("b's server saw connections from %v, want one kept-alive upstream connection", remotes)
	}
	if len(asked) != 1 || asked[0] != fmt.Sprintf("2<-%d@%s:8080", idA, remoteA) {
		t.Errorf("the proxy asked for rules %v, want once, b's ingress for a's identity from the datapath", asked)
	}
	var allowed, denied int
	for _, f := range flows {
		if f.GetTrafficDirection() != flowpb.TrafficDirection_INGRESS || f.GetSource().GetIdentity() != idA ||
			f.GetIP().GetSource() != remoteA.String() || f.GetIP().GetDestination() != addrB.String() {
			t.Errorf("flow %v: want ingress, from a (%s, identity %d), to b", f, remoteA, idA)
			continue
		}
		switch f.GetVerdict() {
		case flowpb.Verdict_FORWARDED:
			if strings.Contains(f.GetSummary(), `"/ok.*"`) {
				allowed++
			}
		case flowpb.Verdict_DROPPED:
			if f.GetL7().GetHttp().GetMethod() == "POST" && f.GetL7().GetHttp().GetCode() == 403 {
				denied++
			}
		}
	}
	if allowed != 2 || denied != 1 {
		for _, f := range flows {
			t.Logf("flow: %s %s %s", f.GetVerdict(), f.GetSummary(), f.GetL7().GetHttp())
		}
		t.Errorf("%d forwarded flows naming the rule and %d dropped POST flows, want 2 and 1", allowed, denied)
	}
	mu.Unlock()

	refusedFrom := func(src netip.Addr, why string) {
		t.Helper()
		if c, err := dialFrom(src, 2*time.Second); err == nil {
			c.Close()
			t.Errorf("%s connected to b's 8080 (%s)", src, why)
		}
	}
	// d's identity has no entry at b's ingress: dropped before any proxy.
	refusedFrom(remoteD, "no entry admits its identity")
	mu.Lock()
	if len(asked) != 1 {
		t.Errorf("the proxy was asked about %v: d's connection reached it", asked[1:])
	}
	mu.Unlock()

	if !vxlan {
		// Without EP_L7_INGRESS (the agent has not yet flagged b, or
		// b's HTTP rules went) from_netdev does not look at the flow:
		// to_pod meets an entry naming the proxy and drops it, so the
		// port stays closed rather than open to every request.
		bEP.L7Ingress = false
		if err := l.WriteEndpoint(bEP); err != nil {
			t.Fatal(err)
		}
		refusedFrom(remoteA, "b is not flagged for the ingress proxy: to_pod drops the flow")
		mu.Lock()
		if len(asked) != 1 || fmt.Sprint(methods) != "[GET GET]" {
			t.Errorf("without the flag the proxy was asked %v and b's server got %v", asked, methods)
		}
		mu.Unlock()
		bEP.L7Ingress = true
		if err := l.WriteEndpoint(bEP); err != nil {
			t.Fatal(err)
		}
	}

	// No proxy (the agent is down): the port is closed to a too.
	if err := closeProxies(); err != nil {
		t.Fatal(err)
	}
	refusedFrom(remoteA, "no proxy enforces its rules")
	mu.Lock()
	if fmt.Sprint(methods) != "[GET GET]" {
		t.Errorf("b's server got %v after the proxies closed", methods)
	}
	mu.Unlock()
}

// hostFrames attaches to device name in namespace ns, at tcx ingress, a
// program that makes every frame the host's (bpf_skb_change_type
// PACKET_HOST): the test's other node, which runs no Tendril program,
// takes the frames the node's tunnel device addresses to its own MAC.
func hostFrames(t *testing.T, ns netns.NsHandle, name string) {
	t.Helper()
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type: ebpf.SchedCLS,
		Instructions: asm.Instructions{
			asm.Mov.Imm(asm.R2, 0), // PACKET_HOST
			asm.FnSkbChangeType.Call(),
			asm.Mov.Imm(asm.R0, 0), // TC_ACT_OK
			asm.Return(),
		},
		License: "GPL",
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = prog.Close() })
	if err := linux.InNetNS(ns, func() error {
		dev, err := netlink.LinkByName(name)
		if err != nil {
			return err
		}
		l, err := link.AttachTCX(link.TCXOptions{Interface: dev.Attrs().Index, Program: prog, Attach: ebpf.AttachTCXIngress})
		if err != nil {
			return err
		}
		t.Cleanup(func() { _ = l.Close() })
		return nil
	}); err != nil {
		t.Fatalf("attach to %s: %v", name, err)
	}
}
