package l7redirect

import (
	"bufio"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	flowpb "github.com/cilium/cilium/api/v1/flow"

	"github.com/tendril-net/tendril/pkg/datapath/linux"
	"github.com/tendril-net/tendril/pkg/datapath/loader"
	"github.com/tendril-net/tendril/pkg/datapath/maps"
	"github.com/tendril-net/tendril/pkg/policy"
	"github.com/tendril-net/tendril/pkg/policy/api"
	"github.com/tendril-net/tendril/pkg/testutil"
	"github.com/tendril-net/tendril/pkg/testutil/netlab"
)

// Real traffic between network namespaces, ingress: pod b's ingress entry
// for pod a's identity on TCP 8080 names the HTTP proxy (GET only), pod c
// has no entry. a's requests go through the ingress listener (its from_pod
// assigns them): GET, POST, GET on one kept-alive connection are answered
// 200, 403, 200, b's server sees the two GETs over one connection from the
// proxy (marked, so b's ingress policy, which admits nothing else, does
// not drop it), and the flows name a's identity, the direction and the
// rule. c cannot connect. A connection to the ingress listener that the
// datapath did not redirect is closed unanswered. With the proxies
// closed, a cannot connect either (fail closed). Subtests IPv4 and IPv6:
// dual-stack pods, the traffic of one family.
func TestPrivilegedIngressRedirectRealTraffic(t *testing.T) {
	testutil.Privileged(t)
	t.Run("IPv4", func(t *testing.T) { testIngressRedirectRealTraffic(t, false) })
	t.Run("IPv6", func(t *testing.T) { testIngressRedirectRealTraffic(t, true) })
}

func testIngressRedirectRealTraffic(t *testing.T, v6 bool) {
	node, l, root, pods := redirectNode(t, "tdrl7i", "a", "b", "c")
	pa, pb, pc := pods[0], pods[1], pods[2]
	addrA, addrB, addrC := podAddr(pa, v6), podAddr(pb, v6), podAddr(pc, v6)
	m := l.Maps()
	const idA, idB, idC = 3201, 3202, 3203
	for p, id := range map[netip.Addr]uint32{addrA: idA, addrB: idB, addrC: idC} {
		if err := m.IPCacheMap().Upsert(netip.PrefixFrom(p, p.BitLen()), maps.IPCacheEntry{Identity: id}); err != nil {
			t.Fatal(err)
		}
	}
	for _, ep := range []loader.EndpointInfo{
		{ID: 1, IfIndex: pa.HostIfIndex, IfName: pa.HostIf, Addresses: []netip.Addr{pa.IPv4, pa.IPv6}, MAC: pa.MAC, HostMAC: pa.HostMAC, Identity: idA},
		{ID: 2, IfIndex: pb.HostIfIndex, IfName: pb.HostIf, Addresses: []netip.Addr{pb.IPv4, pb.IPv6}, MAC: pb.MAC, HostMAC: pb.HostMAC, Identity: idB, EnforceIngress: true},
		{ID: 3, IfIndex: pc.HostIfIndex, IfName: pc.HostIf, Addresses: []netip.Addr{pc.IPv4, pc.IPv6}, MAC: pc.MAC, HostMAC: pc.HostMAC, Identity: idC},
	} {
		if err := l.AttachEndpoint(ep); err != nil {
			t.Fatal(err)
		}
	}
	// b admits a on 8080 through the HTTP proxy, and nothing else (not
	// the node: the proxy's own connection passes by its mark).
	k := maps.PolicyKey{EndpointID: 2, Direction: maps.DirIngress, Identity: idA, Proto: 6, Port: 8080, PortPrefixLen: 16}
	if err := m.PolicyMap().Upsert(k, maps.PolicyValue{Cookie: 11, Proxy: maps.ProxyHttp}); err != nil {
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
	senders := map[netip.Addr]Sender{pa.IPv4: {1, idA}, pb.IPv4: {2, idB}, pc.IPv4: {3, idC}, pa.IPv6: {1, idA}, pb.IPv6: {2, idB}, pc.IPv6: {3, idC}}
	rule := api.PortRuleHTTP{Method: "GET", Path: "/ok.*"}
	cfg := Config{
		BPFRoot: root,
		Log:     slog.New(slog.NewTextHandler(testLog{t}, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Endpoint: func(addr netip.Addr) (Sender, bool) {
			s, ok := senders[addr]
			return s, ok
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

	// a: GET, POST, GET on one connection.
	var codes []int
	var bodies []string
	if err := pa.Do(func() error {
		c, err := net.DialTimeout("tcp", net.JoinHostPort(addrB.String(), "8080"), 5*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
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
		return nil
	}); err != nil {
		mu.Lock()
		t.Logf("rules asked for %v, %d flows", asked, len(flows))
		mu.Unlock()
		t.Fatalf("a's HTTP to b's 8080 through the ingress proxy: %v", err)
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
	if len(asked) != 1 || asked[0] != fmt.Sprintf("2<-%d@%s:8080", idA, addrA) {
		t.Errorf("the proxy asked for rules %v, want once, b's ingress for a's identity from the datapath", asked)
	}
	var allowed, denied int
	for _, f := range flows {
		if f.GetTrafficDirection() != flowpb.TrafficDirection_INGRESS || f.GetSource().GetIdentity() != idA || f.GetIP().GetDestination() != addrB.String() {
			t.Errorf("flow %v: want ingress, from a's identity %d, to b", f, idA)
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

	// c has no entry at b's ingress: dropped before any proxy.
	refusedFrom := func(p *netlab.Pod, why string) {
		t.Helper()
		if err := p.Do(func() error {
			c, err := net.DialTimeout("tcp", net.JoinHostPort(addrB.String(), "8080"), 2*time.Second)
			if err == nil {
				c.Close()
				return fmt.Errorf("%s connected to b's 8080 (%s)", p.Name, why)
			}
			return nil
		}); err != nil {
			t.Error(err)
		}
	}
	refusedFrom(pc, "no entry admits its identity")
	mu.Lock()
	if len(asked) != 1 {
		t.Errorf("the proxy was asked about %v: c's connection reached it", asked[1:])
	}
	mu.Unlock()

	// The ingress listener, reached directly (from the node, no redirect
	// recorded in conntrack), serves nothing.
	var port uint32
	if err := r.ports.Lookup(uint32(maps.ProxyHttpIngress), &port); err != nil || port == 0 ||
		port != uint32(r.httpIn.Addr().(*net.TCPAddr).Port) {
		t.Fatalf("the ingress listener's port in the datapath's map: %d, %v", port, err)
	}
	if c, err := net.Dial("tcp", net.JoinHostPort(loopback(v6), fmt.Sprint(port))); err == nil {
		_, _ = io.WriteString(c, "GET /ok HTTP/1.1\r\nHost: b\r\n\r\n")
		_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
		if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err == nil {
			t.Errorf("a request sent to the ingress listener directly was answered %d", resp.StatusCode)
		}
		c.Close()
	}

	// No proxy (the agent is down): the port is closed to a too.
	if err := closeProxies(); err != nil {
		t.Fatal(err)
	}
	refusedFrom(pa, "no proxy enforces its rules")
	mu.Lock()
	if fmt.Sprint(methods) != "[GET GET]" {
		t.Errorf("b's server got %v after the proxies closed", methods)
	}
	mu.Unlock()
}
