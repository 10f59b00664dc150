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
)

// Real traffic between network namespaces, a flow with both egress and
// ingress HTTP rules: pod a's egress entry for b's TCP 8080 names the HTTP
// proxy, and so does b's ingress entry for a's identity (b admits nothing
// else, not the node). The egress proxy applies both rule sets on one
// kept-alive connection: a request both allow is answered 200 by b, one
// only the ingress denies and one only the egress denies get 403, and b's
// server sees only the first, over one upstream connection that its
// to_pod admitted by its mark (b's policy would drop the node). The flows
// are as Cilium shows them: the allowed request has an EGRESS and an
// INGRESS flow naming their rules, the one the ingress denies an INGRESS
// DROPPED flow and the EGRESS flow of the 403, the one the egress denies
// only an EGRESS DROPPED flow. With the proxies closed, a cannot connect.
//
// On the objects from before this change the ingress denial is not
// applied (the egress proxy knew nothing of b's ingress rules): the
// request only the ingress denies is answered 200, and the test fails.
func TestPrivilegedEgressAndIngressHTTPRules(t *testing.T) {
	testutil.Privileged(t)
	node, l, root, pods := redirectNode(t, "tdrl7b", "a", "b")
	pa, pb := pods[0], pods[1]
	m := l.Maps()
	const idA, idB = 3301, 3302
	for p, id := range map[netip.Addr]uint32{pa.IPv4: idA, pb.IPv4: idB} {
		if err := m.IPCacheMap().Upsert(netip.PrefixFrom(p, 32), maps.IPCacheEntry{Identity: id}); err != nil {
			t.Fatal(err)
		}
	}
	for _, ep := range []loader.EndpointInfo{
		{ID: 1, IfIndex: pa.HostIfIndex, IfName: pa.HostIf, Addresses: []netip.Addr{pa.IPv4}, MAC: pa.MAC, HostMAC: pa.HostMAC, Identity: idA, EnforceEgress: true},
		{ID: 2, IfIndex: pb.HostIfIndex, IfName: pb.HostIf, Addresses: []netip.Addr{pb.IPv4}, MAC: pb.MAC, HostMAC: pb.HostMAC, Identity: idB, EnforceIngress: true},
	} {
		if err := l.AttachEndpoint(ep); err != nil {
			t.Fatal(err)
		}
	}
	for k, cookie := range map[maps.PolicyKey]uint32{
		{EndpointID: 1, Direction: maps.DirEgress, Identity: idB, Proto: 6, Port: 8080, PortPrefixLen: 16}:  21,
		{EndpointID: 2, Direction: maps.DirIngress, Identity: idA, Proto: 6, Port: 8080, PortPrefixLen: 16}: 22,
	} {
		if err := m.PolicyMap().Upsert(k, maps.PolicyValue{Cookie: cookie, Proxy: maps.ProxyHttp}); err != nil {
			t.Fatal(err)
		}
	}

	var mu sync.Mutex
	var paths []string
	remotes := map[string]bool{}
	serveHTTPIn(t, pb.Do, pb.IPv4.String()+":8080", func(r *http.Request) {
		mu.Lock()
		paths = append(paths, r.URL.Path)
		remotes[r.RemoteAddr] = true
		mu.Unlock()
	})

	var flows []*flowpb.Flow
	var asked []string
	egress := []api.PortRuleHTTP{{Path: "/both"}, {Path: "/ingress-denies"}}
	ingress := []api.PortRuleHTTP{{Path: "/both"}, {Path: "/egress-denies"}}
	senders := map[netip.Addr]Sender{pa.IPv4: {1, idA}, pb.IPv4: {2, idB}}
	cfg := Config{
		BPFRoot: root,
		Log:     slog.New(slog.NewTextHandler(testLog{t}, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Endpoint: func(addr netip.Addr) (Sender, bool) {
			s, ok := senders[addr]
			return s, ok
		},
		Rules: func(ep uint16, dst netip.AddrPort, proto uint8) *policy.L7Rules {
			if ep != 1 || dst != netip.AddrPortFrom(pb.IPv4, 8080) || proto != 6 {
				return nil
			}
			return &policy.L7Rules{HTTP: egress}
		},
		IngressRules: func(ep uint16, src uint32, srcAddr netip.Addr, port uint16) *policy.L7Rules {
			mu.Lock()
			asked = append(asked, fmt.Sprintf("%d<-%d@%s:%d", ep, src, srcAddr, port))
			mu.Unlock()
			if ep != 2 || src != idA || port != 8080 {
				return nil
			}
			return &policy.L7Rules{HTTP: ingress}
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

	var codes []int
	var bodies []string
	if err := pa.Do(func() (err error) {
		codes, bodies, err = httpOnOneConn(pb.IPv4.String()+":8080", "GET /both", "GET /ingress-denies", "GET /egress-denies", "GET /both")
		return err
	}); err != nil {
		t.Fatalf("a's HTTP to b's 8080 through the proxy: %v", err)
	}
	if fmt.Sprint(codes) != "[200 403 403 200]" || bodies[0] != "hello from the server" {
		t.Errorf("GET /both, /ingress-denies, /egress-denies, /both answered %v %q, want [200 403 403 200] with b's body first", codes, bodies)
	}
	mu.Lock()
	if fmt.Sprint(paths) != "[/both /both]" {
		t.Errorf("b's server got %v, want [/both /both]: a denied request left the proxy", paths)
	}
	if len(remotes) != 1 {
		t.Errorf("b's server saw connections from %v, want one kept-alive upstream connection", remotes)
	}
	if len(asked) != 1 || asked[0] != fmt.Sprintf("2<-%d@%s:8080", idA, pa.IPv4) {
		t.Errorf("the proxy asked for ingress rules %v, want once, b's for a's identity", asked)
	}
	// Each flow as direction, verdict, code, path, side of the rule named.
	var got []string
	for _, f := range flows {
		if f.GetSource().GetIdentity() != idA || f.GetIP().GetDestination() != pb.IPv4.String() {
			t.Errorf("flow %v: want from a's identity %d to b", f, idA)
		}
		h := f.GetL7().GetHttp()
		path := strings.TrimPrefix(h.GetUrl(), "http://b")
		named := "none"
		switch {
		case strings.Contains(f.GetSummary(), "destination's ingress http rule"):
			named = "ingress-rule"
		case strings.Contains(f.GetSummary(), "allowed by http rule"):
			named = "egress-rule"
		case strings.Contains(f.GetSummary(), "no http rule of the destination's ingress"):
			named = "ingress-denies"
		case strings.Contains(f.GetSummary(), "no http rule of the source's egress"):
			named = "egress-denies"
		}
		got = append(got, fmt.Sprintf("%s %s %d %s %s", f.GetTrafficDirection(), f.GetVerdict(), h.GetCode(), path, named))
	}
	want := []string{
		"INGRESS FORWARDED 200 /both ingress-rule", "EGRESS FORWARDED 200 /both egress-rule",
		"INGRESS DROPPED 403 /ingress-denies ingress-denies", "EGRESS FORWARDED 403 /ingress-denies egress-rule",
		"EGRESS DROPPED 403 /egress-denies egress-denies",
		"INGRESS FORWARDED 200 /both ingress-rule", "EGRESS FORWARDED 200 /both egress-rule",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("flows:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	mu.Unlock()

	if err := closeProxies(); err != nil {
		t.Fatal(err)
	}
	if err := pa.Do(func() error {
		c, err := net.DialTimeout("tcp4", pb.IPv4.String()+":8080", 2*time.Second)
		if err == nil {
			c.Close()
			return fmt.Errorf("a connected to b's 8080 with no proxy running")
		}
		return nil
	}); err != nil {
		t.Error(err)
	}
}

// serveHTTPIn serves HTTP at addr, listening inside a namespace (do),
// answering "hello from the server" after calling seen.
func serveHTTPIn(t *testing.T, do func(func() error) error, addr string, seen func(*http.Request)) {
	t.Helper()
	var ln net.Listener
	if err := do(func() (err error) {
		ln, err = net.Listen("tcp4", addr)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen(r)
		_, _ = io.Copy(io.Discard, r.Body)
		fmt.Fprint(w, "hello from the server")
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
}

// httpOnOneConn sends each request ("METHOD /path"; a POST carries a
// small body) to addr on one connection (Host: b) and returns the codes
// and bodies of the answers.
func httpOnOneConn(addr string, reqs ...string) (codes []int, bodies []string, err error) {
	c, err := net.DialTimeout("tcp4", addr, 5*time.Second)
	if err != nil {
		return nil, nil, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(c)
	for _, r := range reqs {
		method, path, _ := strings.Cut(r, " ")
		raw := fmt.Sprintf("%s %s HTTP/1.1\r\nHost: b\r\n\r\n", method, path)
		if method == http.MethodPost {
			raw = fmt.Sprintf("%s %s HTTP/1.1\r\nHost: b\r\nContent-Length: 2\r\n\r\nhi", method, path)
		}
		if _, err := io.WriteString(c, raw); err != nil {
			return codes, bodies, err
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			return codes, bodies, fmt.Errorf("answer to %s: %w", r, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		codes = append(codes, resp.StatusCode)
		bodies = append(bodies, string(b))
	}
	return codes, bodies, nil
}

// Egress HTTP rules towards a local pod that enforces ingress at L4 only:
// a's egress entry for b's 8080 names the HTTP proxy, b's ingress entry for
// a's identity names none, and b admits nothing else (not the node). The
// egress proxy's upstream is marked, since the flow's conntrack entry
// names b as having admitted a's flow, so b's to_pod does not decide it
// again for the node: GET (the egress rule) is answered 200 by b, POST gets
// 403 from the proxy, and b's ingress rules are never asked for. Before
// this change the proxy's unmarked connection was dropped by b's policy.
func TestPrivilegedEgressHTTPRulesToIngressL4(t *testing.T) {
	testutil.Privileged(t)
	node, l, root, pods := redirectNode(t, "tdrl7e", "a", "b")
	pa, pb := pods[0], pods[1]
	m := l.Maps()
	const idA, idB = 3501, 3502
	for p, id := range map[netip.Addr]uint32{pa.IPv4: idA, pb.IPv4: idB} {
		if err := m.IPCacheMap().Upsert(netip.PrefixFrom(p, 32), maps.IPCacheEntry{Identity: id}); err != nil {
			t.Fatal(err)
		}
	}
	for _, ep := range []loader.EndpointInfo{
		{ID: 1, IfIndex: pa.HostIfIndex, IfName: pa.HostIf, Addresses: []netip.Addr{pa.IPv4}, MAC: pa.MAC, HostMAC: pa.HostMAC, Identity: idA, EnforceEgress: true},
		{ID: 2, IfIndex: pb.HostIfIndex, IfName: pb.HostIf, Addresses: []netip.Addr{pb.IPv4}, MAC: pb.MAC, HostMAC: pb.HostMAC, Identity: idB, EnforceIngress: true},
	} {
		if err := l.AttachEndpoint(ep); err != nil {
			t.Fatal(err)
		}
	}
	for k, v := range map[maps.PolicyKey]maps.PolicyValue{
		{EndpointID: 1, Direction: maps.DirEgress, Identity: idB, Proto: 6, Port: 8080, PortPrefixLen: 16}:  {Cookie: 41, Proxy: maps.ProxyHttp},
		{EndpointID: 2, Direction: maps.DirIngress, Identity: idA, Proto: 6, Port: 8080, PortPrefixLen: 16}: {Cookie: 42},
	} {
		if err := m.PolicyMap().Upsert(k, v); err != nil {
			t.Fatal(err)
		}
	}
	var mu sync.Mutex
	var methods, asked []string
	serveHTTPIn(t, pb.Do, pb.IPv4.String()+":8080", func(r *http.Request) {
		mu.Lock()
		methods = append(methods, r.Method)
		mu.Unlock()
	})
	startRedirect(t, Config{
		BPFRoot: root,
		Log:     slog.New(slog.NewTextHandler(testLog{t}, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Endpoint: func(addr netip.Addr) (Sender, bool) {
			s, ok := map[netip.Addr]Sender{pa.IPv4: {1, idA}, pb.IPv4: {2, idB}}[addr]
			return s, ok
		},
		Rules: func(ep uint16, dst netip.AddrPort, proto uint8) *policy.L7Rules {
			if ep != 1 || dst != netip.AddrPortFrom(pb.IPv4, 8080) || proto != 6 {
				return nil
			}
			return &policy.L7Rules{HTTP: []api.PortRuleHTTP{{Method: "GET"}}}
		},
		IngressRules: func(ep uint16, src uint32, srcAddr netip.Addr, port uint16) *policy.L7Rules {
			mu.Lock()
			asked = append(asked, fmt.Sprintf("%d<-%d", ep, src))
			mu.Unlock()
			return nil
		},
		DNS:      fqdnConfig(&mu, new([]string), new([]*flowpb.Flow)),
		InNodeNS: func(fn func() error) error { return linux.InNetNS(node.NS, fn) },
	})
	var codes []int
	if err := pa.Do(func() (err error) {
		codes, _, err = httpOnOneConn(pb.IPv4.String()+":8080", "GET /", "POST /", "GET /")
		return err
	}); err != nil {
		t.Fatalf("a's HTTP to b's 8080 through the egress proxy: %v", err)
	}
	if fmt.Sprint(codes) != "[200 403 200]" {
		t.Errorf("GET, POST, GET answered %v, want [200 403 200]", codes)
	}
	mu.Lock()
	defer mu.Unlock()
	if fmt.Sprint(methods) != "[GET GET]" || len(asked) != 0 {
		t.Errorf("b's server got %v and the proxy asked for ingress rules %v, want [GET GET] and none", methods, asked)
	}
}
