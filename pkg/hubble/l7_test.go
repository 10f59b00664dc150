package hubble

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	flowpb "github.com/cilium/cilium/api/v1/flow"
	observerpb "github.com/cilium/cilium/api/v1/observer"
	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tendril-net/tendril/pkg/datapath/loader"
	"github.com/tendril-net/tendril/pkg/datapath/maps"
	"github.com/tendril-net/tendril/pkg/fqdn"
	"github.com/tendril-net/tendril/pkg/hubble/flowmetrics"
	"github.com/tendril-net/tendril/pkg/hubble/hubbletest"
	"github.com/tendril-net/tendril/pkg/l7proxy"
	"github.com/tendril-net/tendril/pkg/observer"
	"github.com/tendril-net/tendril/pkg/policy/api"
)

// l7Node is a node whose DNS and HTTP proxies publish into an observer
// served by a Hubble server, with the flow metrics as its consumer; the
// proxies' traffic is real (loopback), their flows the ones they build.
type l7Node struct {
	obs  *observer.Observer
	reg  *prometheus.Registry
	sock string
}

func startL7Node(t *testing.T) *l7Node {
	t.Helper()
	reg := prometheus.NewRegistry()
	fm, err := flowmetrics.New(flowmetrics.Config{Metrics: flowmetrics.All}, reg)
	if err != nil {
		t.Fatal(err)
	}
	obs := observer.New(observer.Config{Consumers: []func(*flowpb.Flow){fm.Observe}}, hubbletest.Node{Name: "node-a"}, nil)
	sock := filepath.Join(t.TempDir(), "hubble.sock")
	srv := New(Config{SocketPath: sock, Version: "tendril-test"}, obs, nil)
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	return &l7Node{obs: obs, reg: reg, sock: "unix://" + sock}
}

// web is the proxies' sender: endpoint 1 of hubbletest.Node (shop/web).
var webSource = struct {
	id       uint16
	identity uint32
}{1, hubbletest.WebIdentity}

// lookups runs the real DNS proxy (allowing world.example) in front of
// an upstream server and asks it for world.example and denied.example.
func (n *l7Node) lookups(t *testing.T) {
	t.Helper()
	upPC, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	up := &dns.Server{PacketConn: upPC, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg).SetReply(r)
		m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: r.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 30}, A: net.ParseIP("192.0.2.10")})
		_ = w.WriteMsg(m)
	})}
	go func() { _ = up.ActivateAndServe() }()
	t.Cleanup(func() { _ = up.Shutdown() })
	upAddr := netip.MustParseAddrPort(upPC.LocalAddr().String())

	p := fqdn.NewProxy(fqdn.ProxyConfig{
		Endpoint: func(netip.Addr) (fqdn.Source, bool) {
			return fqdn.Source{EndpointID: webSource.id, Identity: webSource.identity}, true
		},
		Rules: func(uint16, netip.AddrPort) []api.PortRuleDNS {
			return []api.PortRuleDNS{{MatchName: "world.example"}}
		},
		Learned: func(context.Context, fqdn.Source, string, []netip.Addr, uint32) error { return nil },
		OrigDst: func(dns.ResponseWriter) netip.AddrPort { return upAddr },
		Flow:    n.obs.PublishL7,
	})
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &dns.Server{PacketConn: pc, Handler: p}
	go func() { _ = srv.ActivateAndServe() }()
	t.Cleanup(func() { _ = srv.Shutdown() })
	c := &dns.Client{Timeout: 10 * time.Second}
	for name, rcode := range map[string]int{"world.example.": dns.RcodeSuccess, "denied.example.": dns.RcodeRefused} {
		r, _, err := c.Exchange(new(dns.Msg).SetQuestion(name, dns.TypeA), pc.LocalAddr().String())
		if err != nil {
			t.Fatalf("query %s: %v", name, err)
		}
		if r.Rcode != rcode {
			t.Fatalf("query %s: rcode %s, want %s", name, dns.RcodeToString[r.Rcode], dns.RcodeToString[rcode])
		}
	}
}

// requests runs the real HTTP proxy (allowing GET /healthz) in front of
// an upstream server: a GET /healthz passes, a POST is denied with 403.
func (n *l7Node) requests(t *testing.T) {
	t.Helper()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok") }))
	t.Cleanup(up.Close)
	upAddr := netip.MustParseAddrPort(up.Listener.Addr().String())
	p := l7proxy.NewHTTP(l7proxy.Config{
		Rules: func(l7proxy.Source, netip.AddrPort) []api.PortRuleHTTP {
			return []api.PortRuleHTTP{{Method: "GET", Path: "/healthz"}}
		},
		Flow: n.obs.PublishL7,
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go p.ServeConn(c, l7proxy.Source{EndpointID: webSource.id, Identity: webSource.identity}, upAddr)
		}
	}()
	client := &http.Client{Timeout: 10 * time.Second}
	t.Cleanup(client.CloseIdleConnections)
	for _, tc := range []struct {
		method string
		code   int
	}{{"GET", 200}, {"POST", 403}} {
		req, _ := http.NewRequest(tc.method, "http://"+ln.Addr().String()+"/healthz", nil)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.code {
			t.Fatalf("%s: %d, want %d", tc.method, resp.StatusCode, tc.code)
		}
	}
}

// waitSeen waits until the ring holds n flows: the proxies publish a
// flow before they answer, so it is there already.
func (n *l7Node) waitSeen(t *testing.T, want uint64) {
	t.Helper()
	if got := n.obs.Ring().Seen(); got != want {
		t.Fatalf("%d flows in the ring, want %d", got, want)
	}
}

// getFlows asks the Hubble server for every flow matching the filter.
func getFlows(t *testing.T, server string, filter *flowpb.FlowFilter) []*flowpb.Flow {
	t.Helper()
	conn, err := grpc.NewClient(server, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream, err := observerpb.NewObserverClient(conn).GetFlows(ctx, &observerpb.GetFlowsRequest{Whitelist: []*flowpb.FlowFilter{filter}})
	if err != nil {
		t.Fatal(err)
	}
	var out []*flowpb.Flow
	for {
		r, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		if f := r.GetFlow(); f != nil {
			out = append(out, f)
		}
	}
}

// TestL7FlowsReachGetFlows: the proxies' flows, published into the
// observer, are served by GetFlows with `hubble observe --type l7`'s
// filter (event type 129), completed with the node, time and the
// sender's pod, and a datapath flow beside them does not match.
func TestL7FlowsReachGetFlows(t *testing.T) {
	n := startL7Node(t)
	// A datapath flow: the filter must leave it out.
	if err := n.obs.Observe(loader.Event{Type: maps.EventTrace, Direction: maps.DirEgress, EndpointID: 1, Proto: 6,
		Src: hubbletest.WebIP, Dst: hubbletest.DBIP, SrcPort: 40000, DstPort: 5432, TCPFlags: 0x02, ObsPoint: maps.ObsFromEndpoint}); err != nil {
		t.Fatal(err)
	}
	n.lookups(t)
	n.requests(t)
	n.waitSeen(t, 5)

	flows := getFlows(t, n.sock, &flowpb.FlowFilter{EventType: []*flowpb.EventTypeFilter{{Type: observer.MessageTypeAccessLog}}})
	if len(flows) != 4 {
		t.Fatalf("%d L7 flows, want 4 (2 DNS, 2 HTTP): %v", len(flows), flows)
	}
	var dnsAllowed, dnsDenied, httpAllowed, httpDenied bool
	for _, f := range flows {
		if f.GetType() != flowpb.FlowType_L7 || f.GetNodeName() != "node-a" || f.GetUuid() == "" || f.GetTime() == nil {
			t.Errorf("not completed: %v", f)
		}
		if src := f.GetSource(); src.GetNamespace() != "shop" || src.GetPodName() != "web-7d9f" || src.GetIdentity() != hubbletest.WebIdentity ||
			!strings.Contains(strings.Join(src.GetLabels(), ","), "k8s:app=web") {
			t.Errorf("source not named: %v", src)
		}
		d, h := f.GetL7().GetDns(), f.GetL7().GetHttp()
		switch {
		case d != nil && d.GetQuery() == "world.example." && f.GetVerdict() == flowpb.Verdict_FORWARDED:
			dnsAllowed = d.GetRcode() == 0 && strings.Join(d.GetIps(), ",") == "192.0.2.10"
		case d != nil && d.GetQuery() == "denied.example." && f.GetVerdict() == flowpb.Verdict_DROPPED:
			dnsDenied = d.GetRcode() == dns.RcodeRefused
		case h != nil && h.GetMethod() == "GET":
			httpAllowed = h.GetCode() == 200 && f.GetVerdict() == flowpb.Verdict_FORWARDED
		case h != nil && h.GetMethod() == "POST":
			httpDenied = h.GetCode() == 403 && f.GetVerdict() == flowpb.Verdict_DROPPED
		}
	}
	if !dnsAllowed || !dnsDenied || !httpAllowed || !httpDenied {
		t.Fatalf("flows: dns allowed %v denied %v, http allowed %v denied %v:\n%v", dnsAllowed, dnsDenied, httpAllowed, httpDenied, flows)
	}
	// The other types do not match them: a trace filter finds the
	// datapath's flow alone.
	if tr := getFlows(t, n.sock, &flowpb.FlowFilter{EventType: []*flowpb.EventTypeFilter{{Type: observer.MessageTypeTrace}}}); len(tr) != 1 || tr[0].GetL7() != nil {
		t.Fatalf("trace filter: %v", tr)
	}
}

// TestL7Metrics: the dns and http metric groups count the proxies'
// flows: one query and one response per lookup (by rcode), one request
// and one response per HTTP request (by status), and its duration.
func TestL7Metrics(t *testing.T) {
	n := startL7Node(t)
	n.lookups(t)
	n.requests(t)
	n.waitSeen(t, 4)
	want := `
# HELP tendril_hubble_dns_queries_total DNS queries the DNS proxy saw, by query type (rcode and ips_returned are empty: a query has none).
# TYPE tendril_hubble_dns_queries_total counter
tendril_hubble_dns_queries_total{ips_returned="",qtypes="A",rcode=""} 2
# HELP tendril_hubble_dns_responses_total DNS responses the DNS proxy gave, by rcode, query type and number of addresses returned.
# TYPE tendril_hubble_dns_responses_total counter
tendril_hubble_dns_responses_total{ips_returned="0",qtypes="A",rcode="REFUSED"} 1
tendril_hubble_dns_responses_total{ips_returned="1",qtypes="A",rcode="NOERROR"} 1
# HELP tendril_hubble_http_requests_total HTTP requests the HTTP proxy saw, by method, protocol and reporter (client: egress, server: ingress).
# TYPE tendril_hubble_http_requests_total counter
tendril_hubble_http_requests_total{method="GET",protocol="HTTP/1.1",reporter="client"} 1
tendril_hubble_http_requests_total{method="POST",protocol="HTTP/1.1",reporter="client"} 1
# HELP tendril_hubble_http_responses_total HTTP responses, by request method, status code and reporter (a request the proxy denied counts with status 403).
# TYPE tendril_hubble_http_responses_total counter
tendril_hubble_http_responses_total{method="GET",reporter="client",status="200"} 1
tendril_hubble_http_responses_total{method="POST",reporter="client",status="403"} 1
# HELP tendril_hubble_flows_processed_total Flows decoded, by event type, sub-type (observation point of traces) and verdict.
# TYPE tendril_hubble_flows_processed_total counter
tendril_hubble_flows_processed_total{subtype="dns",type="l7",verdict="DROPPED"} 1
tendril_hubble_flows_processed_total{subtype="dns",type="l7",verdict="FORWARDED"} 1
tendril_hubble_flows_processed_total{subtype="http",type="l7",verdict="DROPPED"} 1
tendril_hubble_flows_processed_total{subtype="http",type="l7",verdict="FORWARDED"} 1
`
	if err := testutil.GatherAndCompare(n.reg, strings.NewReader(want), "tendril_hubble_dns_queries_total", "tendril_hubble_dns_responses_total",
		"tendril_hubble_http_requests_total", "tendril_hubble_http_responses_total", "tendril_hubble_flows_processed_total"); err != nil {
		t.Fatal(err)
	}
	// Each HTTP response's duration is observed once.
	if c := testutil.CollectAndCount(n.reg, "tendril_hubble_http_request_duration_seconds"); c != 2 {
		t.Fatalf("%d duration series, want 2 (GET, POST)", c)
	}
	mfs, err := n.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "tendril_hubble_http_request_duration_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if h := m.GetHistogram(); h.GetSampleCount() != 1 || h.GetSampleSum() <= 0 {
				t.Errorf("duration %v: want one positive sample", m)
			}
		}
	}
}

// TestStockHubbleObserveL7: the stock `hubble observe --type l7` shows
// the proxies' flows, and only those.
func TestStockHubbleObserveL7(t *testing.T) {
	bin := hubbletest.HubbleCLI(t)
	n := startL7Node(t)
	if err := n.obs.Observe(loader.Event{Type: maps.EventDrop, Reason: maps.ReasonPolicyDenied, Direction: maps.DirEgress, EndpointID: 1, Proto: 6,
		Src: hubbletest.WebIP, Dst: hubbletest.DBIP, SrcPort: 40001, DstPort: 3306, TCPFlags: 0x02}); err != nil {
		t.Fatal(err)
	}
	n.lookups(t)
	n.requests(t)
	n.waitSeen(t, 5)
	flows := jsonFlows(t, hubble(t, bin, n.sock, "observe", "--type", "l7", "--last", "100", "-o", "json"))
	if len(flows) != 4 {
		t.Fatalf("hubble observe --type l7: %d flows, want 4: %v", len(flows), flows)
	}
	for _, f := range flows {
		if f.GetL7() == nil {
			t.Fatalf("not an L7 flow: %v", f)
		}
	}
	compact := hubble(t, bin, n.sock, "observe", "--type", "l7", "--last", "100")
	for _, want := range []string{"world.example", "denied.example", "/healthz", "shop/web-7d9f"} {
		if !strings.Contains(compact, want) {
			t.Errorf("compact output lacks %q:\n%s", want, compact)
		}
	}
	t.Log(compact)
	// The stock CLI's L7 filter flags, each keeping exactly its flows
	// (hubble v1.18.8 has no flag for dns_query).
	for _, c := range []struct {
		args []string
		want []string // what each flow's record names
	}{
		{[]string{"--http-status", "403"}, []string{"POST"}},
		{[]string{"--http-status", "2+"}, []string{"GET"}},
		{[]string{"--http-method", "get"}, []string{"GET"}},
		{[]string{"--http-path", "^/health"}, []string{"GET", "POST"}},
		{[]string{"--protocol", "dns"}, []string{"world.example.", "denied.example."}},
		{[]string{"--not", "--http-status", "403", "--type", "l7"}, []string{"world.example.", "denied.example.", "GET"}},
	} {
		flows := jsonFlows(t, hubble(t, bin, n.sock, append([]string{"observe", "--last", "100", "-o", "json"}, c.args...)...))
		var got []string
		for _, f := range flows {
			if h := f.GetL7().GetHttp(); h != nil {
				got = append(got, h.GetMethod())
			} else {
				got = append(got, f.GetL7().GetDns().GetQuery())
			}
		}
		// The two lookups run concurrently: their order is not fixed.
		slices.Sort(got)
		slices.Sort(c.want)
		if !slices.Equal(got, c.want) {
			t.Errorf("hubble observe %v: %v, want %v", c.args, got, c.want)
		}
	}
}
