package l7redirect

import (
	"bufio"
	"context"
	"fmt"
	"github.com/tendril-net/tendril/pkg/fqdn"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	flowpb "github.com/cilium/cilium/api/v1/flow"
	"github.com/miekg/dns"
	"log/slog"

	"github.com/tendril-net/tendril/pkg/datapath/linux"
	"github.com/tendril-net/tendril/pkg/datapath/loader"
	"github.com/tendril-net/tendril/pkg/datapath/maps"
	"github.com/tendril-net/tendril/pkg/fqdn/dnsfallback"
	"github.com/tendril-net/tendril/pkg/policy"
	"github.com/tendril-net/tendril/pkg/policy/api"
	"github.com/tendril-net/tendril/pkg/testutil"
	"github.com/tendril-net/tendril/pkg/testutil/netlab"
)

// Real traffic between network namespaces: pod a's egress policy sends
// port 53 (UDP and TCP) of pod b to the DNS proxy and port 80 to the HTTP
// proxy. An allowed name is answered by b's server through the proxy, a
// disallowed one REFUSED with a flow and never reaches b; GET passes,
// POST gets 403 on the same connection. With the proxies closed, DNS
// falls back to the L4 allow (answered by b directly) while a has no DNS
// fallback entries; with them, an allowed name (and a *.rest pattern's)
// is answered by b, a denied one never reaches b (REFUSED by the
// datapath over IPv4); HTTP is closed.
// Subtests IPv4 and IPv6: the pods are dual-stack, the traffic of one
// family (over IPv6 the DNS questions are AAAA, and their answers are
// learned).
func TestPrivilegedRedirectRealTraffic(t *testing.T) {
	testutil.Privileged(t)
	t.Run("IPv4", func(t *testing.T) { testRedirectRealTraffic(t, false) })
	t.Run("IPv6", func(t *testing.T) { testRedirectRealTraffic(t, true) })
}

// podAddr is p's address of the test's family.
func podAddr(p *netlab.Pod, v6 bool) netip.Addr {
	if v6 {
		return p.IPv6
	}
	return p.IPv4
}

// loopback is the node's loopback address of the test's family.
func loopback(v6 bool) string {
	if v6 {
		return "::1"
	}
	return "127.0.0.1"
}

func testRedirectRealTraffic(t *testing.T, v6 bool) {
	node, l, root, pods := redirectNode(t, "tdrl7", "a", "b")
	pa, pb := pods[0], pods[1]
	addrA, addrB := podAddr(pa, v6), podAddr(pb, v6)
	m := l.Maps()
	const idA, idB = 3101, 3102
	for p, id := range map[netip.Addr]uint32{addrA: idA, addrB: idB} {
		if err := m.IPCacheMap().Upsert(netip.PrefixFrom(p, p.BitLen()), maps.IPCacheEntry{Identity: id}); err != nil {
			t.Fatal(err)
		}
	}
	for _, ep := range []loader.EndpointInfo{
		{ID: 1, IfIndex: pa.HostIfIndex, IfName: pa.HostIf, Addresses: []netip.Addr{pa.IPv4, pa.IPv6}, MAC: pa.MAC, HostMAC: pa.HostMAC, Identity: idA, EnforceEgress: true},
		{ID: 2, IfIndex: pb.HostIfIndex, IfName: pb.HostIf, Addresses: []netip.Addr{pb.IPv4, pb.IPv6}, MAC: pb.MAC, HostMAC: pb.HostMAC, Identity: idB},
	} {
		if err := l.AttachEndpoint(ep); err != nil {
			t.Fatal(err)
		}
	}
	for _, e := range []struct {
		proto uint8
		port  uint16
		proxy uint8
	}{{17, 53, maps.ProxyDns}, {6, 53, maps.ProxyDns}, {6, 80, maps.ProxyHttp}} {
		k := maps.PolicyKey{EndpointID: 1, Direction: maps.DirEgress, Identity: idB, Proto: e.proto, Port: e.port, PortPrefixLen: 16}
		if err := m.PolicyMap().Upsert(k, maps.PolicyValue{Cookie: 9, Proxy: e.proxy}); err != nil {
			t.Fatal(err)
		}
	}

	// b: a DNS server answering every A question with 192.0.2.7 (AAAA:
	// 2001:db8::7), and an HTTP server; each counts what reached it.
	qtype, answerAddr := dns.TypeA, "192.0.2.7"
	if v6 {
		qtype, answerAddr = dns.TypeAAAA, "2001:db8::7"
	}
	var mu sync.Mutex
	var serverNames []string
	var httpMethods []string
	answer := dns.HandlerFunc(func(w dns.ResponseWriter, req *dns.Msg) {
		mu.Lock()
		serverNames = append(serverNames, req.Question[0].Name)
		mu.Unlock()
		resp := new(dns.Msg).SetReply(req)
		rr, _ := dns.NewRR(req.Question[0].Name + " 30 IN " + dns.TypeToString[qtype] + " " + answerAddr)
		resp.Answer = append(resp.Answer, rr)
		_ = w.WriteMsg(resp)
	})
	var udpConn net.PacketConn
	var tcpL, httpL net.Listener
	if err := pb.Do(func() (err error) {
		if udpConn, err = net.ListenPacket("udp", net.JoinHostPort(addrB.String(), "53")); err != nil {
			return err
		}
		if tcpL, err = net.Listen("tcp", net.JoinHostPort(addrB.String(), "53")); err != nil {
			return err
		}
		httpL, err = net.Listen("tcp", net.JoinHostPort(addrB.String(), "80"))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	udpSrv := &dns.Server{PacketConn: udpConn, Handler: answer}
	tcpSrv := &dns.Server{Listener: tcpL, Handler: answer}
	go func() { _ = udpSrv.ActivateAndServe() }()
	go func() { _ = tcpSrv.ActivateAndServe() }()
	t.Cleanup(func() { _ = udpSrv.Shutdown(); _ = tcpSrv.Shutdown() })
	httpSrv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		httpMethods = append(httpMethods, r.Method)
		mu.Unlock()
		_, _ = io.Copy(io.Discard, r.Body)
		fmt.Fprint(w, "hello from b")
	})}
	go func() { _ = httpSrv.Serve(httpL) }()
	t.Cleanup(func() { _ = httpSrv.Close() })

	var flows []*flowpb.Flow
	var learned []string
	cfg := Config{
		BPFRoot: root,
		Log:     slog.New(slog.NewTextHandler(testLog{t}, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Endpoint: func(addr netip.Addr) (Sender, bool) {
			if addr == pa.IPv4 || addr == pa.IPv6 {
				return Sender{EndpointID: 1, Identity: idA}, true
			}
			return Sender{}, false
		},
		Rules: func(ep uint16, dst netip.AddrPort, proto uint8) *policy.L7Rules {
			if ep != 1 || dst.Addr() != addrB {
				return nil
			}
			switch dst.Port() {
			case 53:
				return &policy.L7Rules{DNS: []api.PortRuleDNS{{MatchName: "allowed.example"}}}
			case 80:
				return &policy.L7Rules{HTTP: []api.PortRuleHTTP{{Method: "GET"}}}
			}
			return nil
		},
		DNS: fqdnConfig(&mu, &learned, &flows),
		HTTPFlow: func(f *flowpb.Flow) {
			mu.Lock()
			flows = append(flows, f)
			mu.Unlock()
		},
		// The proxies' own sockets are made in the node's namespace, as
		// the agent's are (it runs there).
		InNodeNS: func(fn func() error) error { return linux.InNetNS(node.NS, fn) },
	}
	r, closeProxies := startRedirect(t, cfg)

	query := func(network, name string) (*dns.Msg, error) {
		var resp *dns.Msg
		err := pa.Do(func() (err error) {
			c := &dns.Client{Net: network, Timeout: 5 * time.Second}
			resp, _, err = c.Exchange(new(dns.Msg).SetQuestion(name, qtype), net.JoinHostPort(addrB.String(), "53"))
			return err
		})
		return resp, err
	}
	for _, network := range []string{"udp", "tcp"} {
		resp, err := query(network, "allowed.example.")
		if err != nil {
			mu.Lock()
			t.Logf("server saw %v, learned %v, %d flows", serverNames, learned, len(flows))
			mu.Unlock()
			t.Fatalf("%s query for an allowed name: %v", network, err)
		}
		if resp.Rcode != dns.RcodeSuccess || len(resp.Answer) != 1 || !strings.Contains(resp.Answer[0].String(), answerAddr) {
			t.Fatalf("%s query for an allowed name: answer %v", network, resp)
		}
		resp, err = query(network, "denied.example.")
		if err != nil {
			t.Fatalf("%s query for a disallowed name: %v", network, err)
		}
		if resp.Rcode != dns.RcodeRefused {
			t.Fatalf("%s query for a disallowed name: rcode %s, want REFUSED", network, dns.RcodeToString[resp.Rcode])
		}
	}
	mu.Lock()
	if len(serverNames) != 2 || serverNames[0] != "allowed.example." || serverNames[1] != "allowed.example." {
		t.Errorf("b's DNS server got %v, want the allowed name twice (UDP, TCP) and never the disallowed one", serverNames)
	}
	if want := "allowed.example.=[" + answerAddr + "]"; len(learned) != 2 || learned[0] != want || learned[1] != want {
		t.Errorf("the proxy learned %v, want %s twice", learned, want)
	}
	refused := 0
	for _, f := range flows {
		if f.GetL7().GetDns().GetQuery() == "denied.example." && f.GetVerdict() == flowpb.Verdict_DROPPED {
			refused++
		}
	}
	mu.Unlock()
	if refused != 2 {
		t.Errorf("%d DROPPED flows for the disallowed name, want 2", refused)
	}

	// A query or connection sent to the listeners directly, from no
	// local endpoint (here the node itself), gets nothing. (The proxies
	// also refuse a flow addressed to their own port whatever its source,
	// Redirect.direct; this step does not isolate that check.)
	dnsPort, httpPort := r.Ports()
	for _, network := range []string{"udp", "tcp"} {
		c := &dns.Client{Net: network, Timeout: time.Second}
		if resp, _, err := c.Exchange(new(dns.Msg).SetQuestion("allowed.example.", qtype), net.JoinHostPort(loopback(v6), fmt.Sprint(dnsPort))); err == nil {
			t.Errorf("%s query sent to the DNS proxy directly was answered: %v", network, resp)
		}
	}
	if c, err := net.Dial("tcp", net.JoinHostPort(loopback(v6), fmt.Sprint(httpPort))); err == nil {
		_, _ = io.WriteString(c, "GET / HTTP/1.1\r\nHost: b\r\n\r\n")
		_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
		if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err == nil {
			t.Errorf("a request sent to the HTTP proxy directly was answered %d", resp.StatusCode)
		}
		c.Close()
	}

	// HTTP: GET then POST on one connection.
	var codes []int
	if err := pa.Do(func() error {
		c, err := net.DialTimeout("tcp", net.JoinHostPort(addrB.String(), "80"), 5*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		br := bufio.NewReader(c)
		for _, req := range []string{
			"GET /x HTTP/1.1\r\nHost: b\r\n\r\n",
			"POST /x HTTP/1.1\r\nHost: b\r\nContent-Length: 2\r\n\r\nhi",
			"GET /y HTTP/1.1\r\nHost: b\r\n\r\n",
		} {
			if _, err := io.WriteString(c, req); err != nil {
				return err
			}
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				return err
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			codes = append(codes, resp.StatusCode)
		}
		return nil
	}); err != nil {
		t.Fatalf("HTTP through the proxy: %v", err)
	}
	if fmt.Sprint(codes) != "[200 403 200]" {
		t.Errorf("GET, POST, GET answered %v, want [200 403 200]", codes)
	}
	mu.Lock()
	if fmt.Sprint(httpMethods) != "[GET GET]" {
		t.Errorf("b's HTTP server got %v, want [GET GET] (the POST never leaves the proxy)", httpMethods)
	}
	mu.Unlock()

	// b's ingress policy still decides for a: with b admitting only the
	// host (whose address the proxy's own connection has), a's query is
	// dropped before the proxy sees it, not let through as the host's.
	bEP := loader.EndpointInfo{ID: 2, IfIndex: pb.HostIfIndex, IfName: pb.HostIf, Addresses: []netip.Addr{pb.IPv4, pb.IPv6}, MAC: pb.MAC, HostMAC: pb.HostMAC, Identity: idB}
	bEP.EnforceIngress = true
	if err := l.AttachEndpoint(bEP); err != nil {
		t.Fatal(err)
	}
	// The node's address the proxy connects from is the host's.
	router := netlab.Router4
	if v6 {
		router = netlab.Router6
	}
	if err := m.IPCacheMap().Upsert(netip.PrefixFrom(router, router.BitLen()), maps.IPCacheEntry{Identity: 1}); err != nil {
		t.Fatal(err)
	}
	hostKey := maps.PolicyKey{EndpointID: 2, Direction: maps.DirIngress, Identity: 1, Proto: 17, Port: 53, PortPrefixLen: 16}
	if err := m.PolicyMap().Upsert(hostKey, maps.PolicyValue{Cookie: 10}); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	before := len(serverNames)
	mu.Unlock()
	if resp, err := query("udp", "allowed.example."); err == nil {
		t.Errorf("a reached b, whose ingress admits only the host, through the proxy: %v", resp)
	}
	mu.Lock()
	if len(serverNames) != before {
		t.Errorf("b's server got %v after b denied a", serverNames[before:])
	}
	mu.Unlock()
	bEP.EnforceIngress = false
	if err := l.AttachEndpoint(bEP); err != nil {
		t.Fatal(err)
	}

	// The proxies stop (the agent is down): their sockets leave the
	// datapath's map. With no fallback entries for a (an agent that never
	// wrote them), DNS passes as its L4 allow says, straight to b, names
	// unfiltered.
	if err := closeProxies(); err != nil {
		t.Fatal(err)
	}
	resp, err := query("udp", "denied.example.")
	if err != nil || resp.Rcode != dns.RcodeSuccess {
		t.Fatalf("with no proxy and no fallback entries, a query goes to b directly: %v, %v", resp, err)
	}
	mu.Lock()
	if n := len(serverNames); serverNames[n-1] != "denied.example." {
		t.Errorf("b did not answer the query itself: %v", serverNames)
	}
	mu.Unlock()

	// a's DNS fallback entries, as the agent writes them from its rules
	// (the Go hash; the datapath computes its own over the query: mixed
	// case names below check that the two agree): an allowed name and a
	// *.rest pattern pass to b, a denied name never reaches b and is
	// answered REFUSED by the datapath (IPv4) or not at all (IPv6), TCP
	// is dropped while a's names are filtered.
	names := dnsfallback.Compile([]api.PortRuleDNS{{MatchName: "Allowed.Example."}, {MatchPattern: "*.example.ORG"}}, false)
	fb := m.DNSFallbackMap()
	for e := range names.Entries {
		if err := fb.Put(maps.DNSFallbackKey{EndpointID: 1, Kind: e.Kind, Hash: e.Hash}); err != nil {
			t.Fatal(err)
		}
	}
	if err := fb.Put(maps.DNSFallbackKey{EndpointID: 1, Kind: maps.DNSFallbackFilter}); err != nil {
		t.Fatal(err)
	}
	deniedBefore, err := m.MetricsMap().Lookup(maps.ReasonDnsNameDenied, maps.DirEgress)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"ALLOWED.example.", "Any.Example.org."} {
		resp, err := query("udp", name)
		if err != nil || resp.Rcode != dns.RcodeSuccess || len(resp.Answer) != 1 {
			t.Fatalf("fallback: an allowed name %s is not answered by b: %v, %v", name, resp, err)
		}
		mu.Lock()
		if n := len(serverNames); serverNames[n-1] != name {
			t.Errorf("fallback: b did not answer %s itself: %v", name, serverNames)
		}
		mu.Unlock()
	}
	mu.Lock()
	before = len(serverNames)
	mu.Unlock()
	for _, name := range []string{"denied.example.", "a.b.example.org.", "example.org."} {
		resp, err := queryTimeout(pa, "udp", name, qtype, addrB, 2*time.Second)
		switch {
		case !v6 && (err != nil || resp.Rcode != dns.RcodeRefused || resp.Question[0].Name != name || len(resp.Answer) != 0):
			t.Errorf("fallback: a denied name %s over IPv4: %v, %v; want the datapath's REFUSED", name, resp, err)
		case v6 && err == nil:
			t.Errorf("fallback: a denied name %s over IPv6 was answered: %v", name, resp)
		}
	}
	if _, err := queryTimeout(pa, "tcp", "allowed.example.", qtype, addrB, 2*time.Second); err == nil {
		t.Error("fallback: a TCP query passed while a's names are filtered")
	}
	mu.Lock()
	if len(serverNames) != before {
		t.Errorf("fallback: b's server got %v, denied names or TCP", serverNames[before:])
	}
	mu.Unlock()
	deniedAfter, err := m.MetricsMap().Lookup(maps.ReasonDnsNameDenied, maps.DirEgress)
	if err != nil {
		t.Fatal(err)
	}
	// Three denied names and at least the TCP query's SYN.
	if got := deniedAfter.Packets - deniedBefore.Packets; got < 4 {
		t.Errorf("fallback: %d packets counted as %s, want 4 or more", got, maps.ReasonName(maps.ReasonDnsNameDenied))
	}

	// The HTTP port is closed.
	if err := pa.Do(func() error {
		c, err := net.DialTimeout("tcp", net.JoinHostPort(addrB.String(), "80"), 2*time.Second)
		if err == nil {
			c.Close()
			return fmt.Errorf("connected to b's HTTP port with no proxy to enforce its rules")
		}
		return nil
	}); err != nil {
		t.Error(err)
	}
}

// queryTimeout asks the DNS server at addr:53 from pod p for name.
func queryTimeout(p *netlab.Pod, network, name string, qtype uint16, addr netip.Addr, timeout time.Duration) (*dns.Msg, error) {
	var resp *dns.Msg
	err := p.Do(func() (err error) {
		c := &dns.Client{Net: network, Timeout: timeout}
		resp, _, err = c.Exchange(new(dns.Msg).SetQuestion(name, qtype), net.JoinHostPort(addr.String(), "53"))
		return err
	})
	return resp, err
}

func fqdnConfig(mu *sync.Mutex, learned *[]string, flows *[]*flowpb.Flow) fqdn.ProxyConfig {
	return fqdn.ProxyConfig{
		Learned: func(_ context.Context, _ fqdn.Source, name string, ips []netip.Addr, _ uint32) error {
			mu.Lock()
			*learned = append(*learned, name+"="+fmt.Sprint(ips))
			mu.Unlock()
			return nil
		},
		Flow: func(f *flowpb.Flow) {
			mu.Lock()
			*flows = append(*flows, f)
			mu.Unlock()
		},
	}
}

// testLog puts the proxies' log lines into the test's log.
type testLog struct{ t *testing.T }

func (w testLog) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}
