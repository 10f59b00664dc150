package l7redirect

import (
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	flowpb "github.com/cilium/cilium/api/v1/flow"
	"github.com/vishvananda/netlink"

	"github.com/tendril-net/tendril/pkg/datapath/linux"
	"github.com/tendril-net/tendril/pkg/datapath/loader"
	"github.com/tendril-net/tendril/pkg/datapath/maps"
	"github.com/tendril-net/tendril/pkg/identity"
	"github.com/tendril-net/tendril/pkg/policy"
	"github.com/tendril-net/tendril/pkg/policy/api"
	"github.com/tendril-net/tendril/pkg/testutil"
)

// Real traffic, the node itself as the source of a flow to a pod's port
// with ingress HTTP rules: pod b's ingress entry for the host identity on
// TCP 8080 names the HTTP proxy. A connection from the node's namespace
// goes from b's to_pod (tcx egress, no socket assignment there) through
// the hairpin device tendril_host (l7_hairpin at its tcx ingress) to the
// ingress proxy: GET, POST, GET on one connection are answered 200, 403,
// 200; b's server sees the two GETs over one upstream connection; the
// proxy asks once for b's rules for the host identity, which it read from
// the flow's conntrack entry; the flows are INGRESS from the host
// identity and name the rule or the 403. Without the hairpin device (its
// program detached, the map cleared) and with the proxies closed, the node
// cannot connect: the port stays closed.
//
// On the objects from before this change b's to_pod drops the node's SYN:
// the first connection times out and the test fails.
func TestPrivilegedIngressHTTPFromTheNode(t *testing.T) {
	testutil.Privileged(t)
	node, l, root, pods := redirectNode(t, "tdrl7h", "b")
	pb := pods[0]
	m := l.Maps()
	const idB = 3402
	host := uint32(identity.Host)
	// The node's source address towards b (the route's choice).
	probe, err := net.Dial("udp4", pb.IPv4.String()+":8080")
	if err != nil {
		t.Fatal(err)
	}
	nodeAddr := probe.LocalAddr().(*net.UDPAddr).AddrPort().Addr().Unmap()
	probe.Close()
	for p, id := range map[netip.Addr]uint32{pb.IPv4: idB, nodeAddr: host} {
		if err := m.IPCacheMap().Upsert(netip.PrefixFrom(p, 32), maps.IPCacheEntry{Identity: id}); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.AttachEndpoint(loader.EndpointInfo{ID: 2, IfIndex: pb.HostIfIndex, IfName: pb.HostIf, Addresses: []netip.Addr{pb.IPv4},
		MAC: pb.MAC, HostMAC: pb.HostMAC, Identity: idB, EnforceIngress: true}); err != nil {
		t.Fatal(err)
	}
	k := maps.PolicyKey{EndpointID: 2, Direction: maps.DirIngress, Identity: host, Proto: 6, Port: 8080, PortPrefixLen: 16}
	if err := m.PolicyMap().Upsert(k, maps.PolicyValue{Cookie: 31, Proxy: maps.ProxyHttp}); err != nil {
		t.Fatal(err)
	}

	var mu sync.Mutex
	var methods []string
	remotes := map[string]bool{}
	serveHTTPIn(t, pb.Do, pb.IPv4.String()+":8080", func(r *http.Request) {
		mu.Lock()
		methods = append(methods, r.Method)
		remotes[r.RemoteAddr] = true
		mu.Unlock()
	})
	var flows []*flowpb.Flow
	var asked []string
	cfg := Config{
		BPFRoot: root,
		Log:     slog.New(slog.NewTextHandler(testLog{t}, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Endpoint: func(addr netip.Addr) (Sender, bool) {
			if addr == pb.IPv4 {
				return Sender{2, idB}, true
			}
			return Sender{}, false
		},
		Rules: func(uint16, netip.AddrPort, uint8) *policy.L7Rules { return nil },
		IngressRules: func(ep uint16, src uint32, srcAddr netip.Addr, port uint16) *policy.L7Rules {
			mu.Lock()
			asked = append(asked, fmt.Sprintf("%d<-%d@%s:%d", ep, src, srcAddr, port))
			mu.Unlock()
			if ep != 2 || src != host || port != 8080 {
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
	_, closeProxies := startRedirect(t, cfg)
	dev, err := netlink.LinkByName(linux.HostDeviceName)
	if err != nil {
		t.Fatal(err)
	}
	// The proxy answers the node from b's address to a local one: through
	// lo, which a node has up (the test's node namespace starts with it
	// down).
	lo, err := netlink.LinkByName("lo")
	if err == nil {
		err = netlink.LinkSetUp(lo)
	}
	if err != nil {
		t.Fatal(err)
	}
	detach, err := l.AttachL7Hairpin(dev.Attrs().Index)
	if err != nil {
		t.Fatal(err)
	}
	detached := false
	t.Cleanup(func() {
		if !detached {
			_ = detach()
		}
	})

	codes, bodies, err := httpOnOneConn(pb.IPv4.String()+":8080", "GET /ok", "POST /ok", "GET /ok/again")
	if err != nil {
		t.Fatalf("the node's HTTP to b's 8080 through the hairpin and the ingress proxy: %v", err)
	}
	if fmt.Sprint(codes) != "[200 403 200]" || bodies[0] != "hello from the server" || bodies[2] != "hello from the server" {
		t.Errorf("GET, POST, GET answered %v %q, want [200 403 200] with b's body for the GETs", codes, bodies)
	}
	mu.Lock()
	if fmt.Sprint(methods) != "[GET GET]" {
		t.Errorf("b's server got %v, want [GET GET]", methods)
	}
	if len(remotes) != 1 {
		t.Errorf("b's server saw connections from %v, want one upstream connection", remotes)
	}
	if len(asked) != 1 || asked[0] != fmt.Sprintf("2<-%d@%s:8080", host, nodeAddr) {
		t.Errorf("the proxy asked for rules %v, want once, b's ingress for the host identity at %s", asked, nodeAddr)
	}
	var allowed, denied int
	for _, f := range flows {
		if f.GetTrafficDirection() != flowpb.TrafficDirection_INGRESS || f.GetSource().GetIdentity() != host ||
			f.GetIP().GetSource() != nodeAddr.String() || f.GetIP().GetDestination() != pb.IPv4.String() {
			t.Errorf("flow %v: want ingress from the node (%s, identity %d) to b", f, nodeAddr, host)
			continue
		}
		switch {
		case f.GetVerdict() == flowpb.Verdict_FORWARDED && strings.Contains(f.GetSummary(), `"/ok.*"`):
			allowed++
		case f.GetVerdict() == flowpb.Verdict_DROPPED && f.GetL7().GetHttp().GetMethod() == "POST" && f.GetL7().GetHttp().GetCode() == 403:
			denied++
		}
	}
	if allowed != 2 || denied != 1 {
		t.Errorf("%d forwarded flows naming the rule and %d dropped POST flows, want 2 and 1", allowed, denied)
	}
	mu.Unlock()

	refused := func(why string) {
		t.Helper()
		c, err := net.DialTimeout("tcp4", pb.IPv4.String()+":8080", 2*time.Second)
		if err == nil {
			c.Close()
			t.Errorf("the node connected to b's 8080 (%s)", why)
		}
	}
	// No hairpin device: to_pod drops the node's flow, as before.
	detached = true
	if err := detach(); err != nil {
		t.Fatal(err)
	}
	refused("no hairpin device")
	// The hairpin back, the proxies down (the agent is down): closed.
	if detach, err = l.AttachL7Hairpin(dev.Attrs().Index); err != nil {
		t.Fatal(err)
	}
	detached = false
	if err := closeProxies(); err != nil {
		t.Fatal(err)
	}
	refused("no proxy enforces its rules")
	mu.Lock()
	if fmt.Sprint(methods) != "[GET GET]" {
		t.Errorf("b's server got %v after the hairpin or the proxies went", methods)
	}
	mu.Unlock()
}
