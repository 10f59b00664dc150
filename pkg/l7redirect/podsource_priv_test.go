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
	"github.com/tendril-net/tendril/pkg/testutil/netlab"
)

// Real traffic between network namespaces: pod a's egress entry for its
// server's identity on TCP 80 names the HTTP proxy (GET only), and the
// proxy's upstream connection must reach the server as a, not as the node
// (issue 30). a sends GET, POST, GET on one kept-alive connection; the
// answers must be 200, 403, 200 with the server's body, and the server
// must see the two GETs from a's own address and port (the upstream keeps
// a's tuple). Then the server closes its connection (an idle timeout) and
// a sends one more GET on its connection: the proxy connects again, from
// a's tuple again (the server sees no other), and it is answered 200.
// (Before to_pod took the upstream's packets by their mark, that last GET
// failed on the same node: the new connection's SYN, on the entry the old
// upstream's RST had closed, replaced the client's entry, and the server's
// SYN-ACK went to a, which the server's answer to a's ACK then reset.)
//
//   - same-node: the server is pod b on the node, enforcing ingress and
//     admitting only a's identity on 80 (not the host's): the datapath
//     decides it (with the node's address upstream, b's to_pod dropped the
//     proxy's connection). b's replies go back to the proxy's socket from
//     b's from_pod, not to a. When b's ingress admits a only through the
//     HTTP proxy (b's own HTTP rules), the flow is PROXY_HTTP_BOTH and the
//     egress proxy applies b's rules too (none here: 403).
//   - native: the server is on another node (a namespace behind the node's
//     device eth1, which runs the host programs with masquerade on), routed;
//     it admits only a's address, which the other node's ipcache would give
//     a's identity (with the node's address upstream it saw 192.168.78.1).
//     Its replies arrive at from_netdev and go to the proxy's socket.
//     Masquerade leaves the in-cluster destination alone.
//   - vxlan: the same server behind the other node's VXLAN device, whose
//     VNI is a's identity: a packet carrying any other identity (the host's,
//     which to_overlay gave the node's own connection) is not taken. The
//     replies arrive at from_overlay and go to the proxy's socket.
//   - world: native, to a destination outside the cluster (no ipcache
//     entry): the upstream is masqueraded to the node's address as a's own
//     traffic would be, and the reply, translated back to a's address and
//     port by from_netdev, goes to the proxy's socket; the connection
//     after the server closed the first gets the same mapping (the same
//     tuple). (With the node's address upstream the first three answers
//     were right too: the node's own connection was not masqueraded; the
//     new connection came from another port.)
func TestPrivilegedRedirectKeepsPodSource(t *testing.T) {
	testutil.Privileged(t)
	t.Run("same-node", func(t *testing.T) { testPodSource(t, "local") })
	t.Run("native", func(t *testing.T) { testPodSource(t, "native") })
	t.Run("vxlan", func(t *testing.T) { testPodSource(t, "vxlan") })
	t.Run("world", func(t *testing.T) { testPodSource(t, "world") })
}

// podSourceServer is an HTTP server that records each request's method
// and the connection it came on, and serves only connections from allow
// (invalid: any).
type podSourceServer struct {
	mu      sync.Mutex
	methods []string
	remotes map[string]bool
	refused []string
	conns   []net.Conn
}

// closeConns closes the server's connections (an idle timeout).
func (s *podSourceServer) closeConns() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.conns {
		c.Close()
	}
	s.conns = nil
}

func (s *podSourceServer) serve(t *testing.T, l net.Listener, allow netip.Addr) {
	s.remotes = map[string]bool{}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.methods = append(s.methods, r.Method)
		s.remotes[r.RemoteAddr] = true
		s.mu.Unlock()
		_, _ = io.Copy(io.Discard, r.Body)
		fmt.Fprint(w, "hello from the server")
	}), ConnState: func(c net.Conn, st http.ConnState) {
		if st == http.StateNew {
			s.mu.Lock()
			s.conns = append(s.conns, c)
			s.mu.Unlock()
		}
	}}
	go func() { _ = srv.Serve(&admitListener{Listener: l, allow: allow, s: s}) }()
	t.Cleanup(func() { _ = srv.Close() })
}

// admitListener closes connections from anyone but allow: the server's
// ingress admits only the client pod's address.
type admitListener struct {
	net.Listener
	allow netip.Addr
	s     *podSourceServer
}

func (l *admitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		from := addrPort(c.RemoteAddr()).Addr().Unmap()
		if !l.allow.IsValid() || from == l.allow {
			return c, nil
		}
		l.s.mu.Lock()
		l.s.refused = append(l.s.refused, from.String())
		l.s.mu.Unlock()
		c.Close()
	}
}

func testPodSource(t *testing.T, mode string) {
	node, l, root, pods := redirectNode(t, "tdrl7s", "a", "b")
	pa, pb := pods[0], pods[1]
	m := l.Maps()
	peerNode := netip.MustParseAddr("192.168.78.2")
	const idA, idB, idS = 3401, 3402, 3403
	server := netip.AddrPortFrom(pb.IPv4, 80)
	srvID := uint32(idB)
	switch mode {
	case "native", "vxlan":
		server, srvID = netip.MustParseAddrPort("10.78.0.20:80"), idS
	case "world":
		server, srvID = netip.MustParseAddrPort("10.78.0.30:80"), 2 // ID_WORLD
	}
	for p, id := range map[netip.Addr]uint32{pa.IPv4: idA, pb.IPv4: idB, netlab.Router4: 1} {
		if err := m.IPCacheMap().Upsert(netip.PrefixFrom(p, 32), maps.IPCacheEntry{Identity: id}); err != nil {
			t.Fatal(err)
		}
	}
	// b enforces ingress and admits a on 80 (not the host).
	for _, ep := range []loader.EndpointInfo{
		{ID: 1, IfIndex: pa.HostIfIndex, IfName: pa.HostIf, Addresses: []netip.Addr{pa.IPv4}, MAC: pa.MAC, HostMAC: pa.HostMAC, Identity: idA, EnforceEgress: true, L7Egress: true},
		{ID: 2, IfIndex: pb.HostIfIndex, IfName: pb.HostIf, Addresses: []netip.Addr{pb.IPv4}, MAC: pb.MAC, HostMAC: pb.HostMAC, Identity: idB, EnforceIngress: true},
	} {
		if err := l.AttachEndpoint(ep); err != nil {
			t.Fatal(err)
		}
	}
	egress := maps.PolicyKey{EndpointID: 1, Direction: maps.DirEgress, Identity: srvID, Proto: 6, Port: 80, PortPrefixLen: 16}
	if err := m.PolicyMap().Upsert(egress, maps.PolicyValue{Cookie: 21, Proxy: maps.ProxyHttp}); err != nil {
		t.Fatal(err)
	}
	ingress := maps.PolicyKey{EndpointID: 2, Direction: maps.DirIngress, Identity: idA, Proto: 6, Port: 80, PortPrefixLen: 16}
	if err := m.PolicyMap().Upsert(ingress, maps.PolicyValue{Cookie: 22}); err != nil {
		t.Fatal(err)
	}

	srv := &podSourceServer{}
	var srvL net.Listener
	if mode == "local" {
		if err := pb.Do(func() (err error) {
			srvL, err = net.Listen("tcp4", server.String())
			return err
		}); err != nil {
			t.Fatal(err)
		}
		// The datapath is b's ingress policy here.
		srv.serve(t, srvL, netip.Addr{})
	} else {
		peerNS := podSourcePeer(t, node, l, root, mode, server.Addr(), peerNode, idA)
		if mode != "vxlan" {
			dev, err := netlink.LinkByName("eth1")
			if err != nil {
				t.Fatal(err)
			}
			// Masquerade on the device: in-cluster destinations keep
			// the pod's address, the world's get the node's.
			if err := m.NAT.SetHostDevice(maps.HostDevice{IfIndex: dev.Attrs().Index, MasqIPv4: netip.MustParseAddr("192.168.78.1")}); err != nil {
				t.Fatal(err)
			}
		}
		if mode != "world" {
			var tunnelIP netip.Addr
			if mode == "vxlan" {
				tunnelIP = peerNode
			}
			if err := m.IPCacheMap().Upsert(netip.PrefixFrom(server.Addr(), 32), maps.IPCacheEntry{Identity: idS, TunnelIP: tunnelIP}); err != nil {
				t.Fatal(err)
			}
		}
		if err := linux.InNetNS(peerNS, func() (err error) {
			srvL, err = net.Listen("tcp4", server.String())
			return err
		}); err != nil {
			t.Fatal(err)
		}
		allow := pa.IPv4
		if mode == "world" {
			allow = netip.MustParseAddr("192.168.78.1")
		}
		srv.serve(t, srvL, allow)
	}

	var mu sync.Mutex
	var flows []*flowpb.Flow
	cfg := Config{
		BPFRoot: root,
		Log:     slog.New(slog.NewTextHandler(testLog{t}, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Endpoint: func(addr netip.Addr) (Sender, bool) {
			switch addr {
			case pa.IPv4:
				return Sender{1, idA}, true
			case pb.IPv4:
				return Sender{2, idB}, true
			}
			return Sender{}, false
		},
		Rules: func(ep uint16, dst netip.AddrPort, proto uint8) *policy.L7Rules {
			if ep != 1 || dst != server || proto != unix.IPPROTO_TCP {
				return nil
			}
			return &policy.L7Rules{HTTP: []api.PortRuleHTTP{{Method: "GET", Path: "/ok.*"}}}
		},
		DNS: fqdnConfig(&mu, new([]string), new([]*flowpb.Flow)),
		HTTPFlow: func(f *flowpb.Flow) {
			mu.Lock()
			flows = append(flows, f)
			mu.Unlock()
		},
		InNodeNS: func(fn func() error) error { return linux.InNetNS(node.NS, fn) },
	}
	r, _ := startRedirect(t, cfg)

	var codes []int
	var bodies []string
	var client netip.AddrPort
	err := pa.Do(func() error {
		c, err := net.DialTimeout("tcp4", server.String(), 5*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		client = addrPort(c.LocalAddr())
		_ = c.SetDeadline(time.Now().Add(15 * time.Second))
		br := bufio.NewReader(c)
		for i, req := range []string{
			"GET /ok HTTP/1.1\r\nHost: s\r\n\r\n",
			"POST /ok HTTP/1.1\r\nHost: s\r\nContent-Length: 2\r\n\r\nhi",
			"GET /ok/again HTTP/1.1\r\nHost: s\r\n\r\n",
			"GET /ok/after-idle HTTP/1.1\r\nHost: s\r\n\r\n",
		} {
			if i == 3 {
				// The server closes the kept-alive upstream connection
				// (its idle timeout): the proxy connects again for the
				// GET, from a's tuple again.
				srv.closeConns()
				time.Sleep(100 * time.Millisecond)
			}
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
		// The flow's entry is a's, naming the HTTP proxy: the upstream
		// connection's replies are steered by it.
		e, ok, err := r.ct.Lookup(maps.CTEntry{Proto: unix.IPPROTO_TCP, Src: client.Addr(), SrcPort: client.Port(), Dst: server.Addr(), DstPort: server.Port()})
		if err != nil || !ok {
			return fmt.Errorf("no conntrack entry for a's flow (%v)", err)
		}
		if e.Proxy != maps.ProxyHttp {
			return fmt.Errorf("a's conntrack entry %+v: want the HTTP proxy", e)
		}
		return nil
	})
	srv.mu.Lock()
	defer srv.mu.Unlock()
	if err != nil {
		t.Fatalf("a's HTTP to %s through the egress proxy: %v (answers %v; the server got %v from %v, refused %v)",
			server, err, codes, srv.methods, srv.remotes, srv.refused)
	}
	want := []string{"hello from the server", "Access denied\n", "hello from the server", "hello from the server"}
	if fmt.Sprint(codes) != "[200 403 200 200]" || fmt.Sprint(bodies) != fmt.Sprint(want) {
		t.Errorf("GET, POST, GET, GET answered %v %q, want [200 403 200 200] with the server's body for the GETs", codes, bodies)
	}
	if fmt.Sprint(srv.methods) != "[GET GET GET]" {
		t.Errorf("the server got %v, want [GET GET GET] (the POST never leaves the proxy)", srv.methods)
	}
	// One kept-alive upstream connection, and the one after the server
	// closed it, both from a's own tuple (the world's: the node's
	// address after masquerade; both get the same mapping).
	wantRemote := client.String()
	if mode == "world" {
		if len(srv.remotes) == 1 {
			for rem := range srv.remotes {
				if netip.MustParseAddrPort(rem).Addr() == netip.MustParseAddr("192.168.78.1") {
					wantRemote = rem
				}
			}
		}
	}
	if len(srv.remotes) != 1 || !srv.remotes[wantRemote] {
		t.Errorf("the server saw connections from %v, want one from %s", srv.remotes, wantRemote)
	}
	if len(srv.refused) != 0 {
		t.Errorf("the server refused connections from %v", srv.refused)
	}
	if mode == "local" {
		// b's ingress admits a only through the HTTP proxy (its own HTTP
		// rules): the flow is PROXY_HTTP_BOTH, and the egress proxy,
		// which took it, applies b's ingress rules too. This test's
		// IngressRules give none, so nothing passes: 403 from the
		// proxy, b's server never asked.
		if err := m.PolicyMap().Upsert(ingress, maps.PolicyValue{Cookie: 22, Proxy: maps.ProxyHttp}); err != nil {
			t.Fatal(err)
		}
		before := len(srv.methods)
		srv.mu.Unlock()
		var code int
		err := pa.Do(func() error {
			c, err := net.DialTimeout("tcp4", server.String(), 5*time.Second)
			if err != nil {
				return err
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(15 * time.Second))
			if _, err := io.WriteString(c, "GET /ok HTTP/1.1\r\nHost: s\r\n\r\n"); err != nil {
				return err
			}
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				return err
			}
			resp.Body.Close()
			code = resp.StatusCode
			return nil
		})
		srv.mu.Lock()
		if code != http.StatusForbidden || len(srv.methods) != before {
			t.Errorf("with b's own HTTP rules for a, a's GET was answered %d (%v) and the server got %v", code, err, srv.methods[before:])
		}
	}
	mu.Lock()
	defer mu.Unlock()
	allowed := 0
	for _, f := range flows {
		if f.GetTrafficDirection() == flowpb.TrafficDirection_EGRESS && f.GetVerdict() == flowpb.Verdict_FORWARDED &&
			f.GetSource().GetIdentity() == idA {
			allowed++
		}
	}
	// Three requests a's egress rules allowed, and in local mode the
	// fourth: a's egress allowed it, b's ingress denied it (its own
	// INGRESS flow says so).
	wantAllowed := 3
	if mode == "local" {
		wantAllowed = 4
	}
	if allowed != wantAllowed {
		t.Errorf("%d forwarded egress flows from a, want %d", allowed, wantAllowed)
	}
}

// podSourcePeer makes the other node of TestPrivilegedRedirectKeepsPodSource:
// a namespace behind the node's device eth1 holding the server's address,
// routed (native, world: the host programs on eth1) or through VXLAN (the
// node's tendril_vxlan with the overlay programs; the other node's VXLAN
// device takes only VNI clientID).
func podSourcePeer(t *testing.T, node *netlab.Node, l *loader.Loader, root, mode string, server, peerNode netip.Addr, clientID uint32) netns.NsHandle {
	t.Helper()
	m := l.Maps()
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
	if mode != "vxlan" {
		run("-n", node.Name, "route", "add", "10.78.0.0/24", "via", peerNode.String(), "dev", "eth1")
		run("-n", peerName, "addr", "add", server.String()+"/32", "dev", "eth0")
		run("-n", peerName, "route", "add", "10.77.0.0/24", "via", "192.168.78.1", "dev", "eth0")
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
		return peerNS
	}
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
	run("-n", node.Name, "route", "add", "10.78.0.0/24", "dev", dev.Attrs().Name)
	// The other node's device takes only VNI clientID: the identity the
	// node's to_overlay gives the upstream connection must be a's.
	run("-n", peerName, "link", "add", "vx0", "type", "vxlan", "id", fmt.Sprint(clientID), "remote", "192.168.78.1",
		"local", peerNode.String(), "dstport", fmt.Sprint(tunnel.DefaultVXLANPort), "dev", "eth0")
	run("-n", peerName, "link", "set", "vx0", "arp", "off")
	hostFrames(t, peerNS, "vx0")
	run("-n", peerName, "addr", "add", server.String()+"/32", "dev", "vx0")
	run("-n", peerName, "link", "set", "vx0", "up")
	run("-n", peerName, "route", "add", "10.77.0.0/24", "dev", "vx0")
	if err := m.IPCacheMap().Upsert(netip.PrefixFrom(peerNode, 32), maps.IPCacheEntry{Identity: 6, Flags: maps.IPCacheFlagRemoteNode}); err != nil {
		t.Fatal(err)
	}
	return peerNS
}
