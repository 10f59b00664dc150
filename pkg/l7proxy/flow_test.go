package l7proxy

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	flowpb "github.com/cilium/cilium/api/v1/flow"
	"google.golang.org/protobuf/proto"

	"github.com/tendril-net/tendril/pkg/policy/api"
)

// TestHTTPProxyFlowFields pins every field of the flows the proxy builds
// (allowed, denied, upstream unreachable) and the bytes it sends the
// upstream: the per-connection parts and the single allocation of a flow
// must give what a flow built field by field for each request gave.
func TestHTTPProxyFlowFields(t *testing.T) {
	upLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer upLn.Close()
	upAddr := netip.MustParseAddrPort(upLn.Addr().String())
	// The upstream keeps the head of each request it gets, and answers.
	heads := make(chan string, 4)
	go func() {
		c, err := upLn.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		br := bufio.NewReader(c)
		for {
			head := ""
			for {
				line, err := br.ReadString('\n')
				if err != nil {
					return
				}
				head += line
				if line == "\r\n" {
					break
				}
			}
			heads <- head
			if _, err := io.WriteString(c, "HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok"); err != nil {
				return
			}
		}
	}()

	var mu sync.Mutex
	var flows []*flowpb.Flow
	rules := []api.PortRuleHTTP{{Method: "GET", Path: "/a.*"}}
	var dials atomic.Int32
	p := NewHTTP(Config{
		Rules: func(Source, netip.AddrPort) []api.PortRuleHTTP { return rules },
		Flow:  func(f *flowpb.Flow) { mu.Lock(); flows = append(flows, f); mu.Unlock() },
		Dial: func(_, dst netip.AddrPort) (net.Conn, error) {
			if dials.Add(1) > 1 {
				return nil, errors.New("refused")
			}
			return net.Dial("tcp", dst.String())
		},
	})
	pxLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pxLn.Close()
	served := make(chan struct{}, 2)
	go func() {
		for {
			c, err := pxLn.Accept()
			if err != nil {
				return
			}
			go func() {
				p.ServeConn(c, Source{EndpointID: 7, Identity: 4242}, upAddr)
				served <- struct{}{}
			}()
		}
	}()
	before := time.Now()
	c, err := net.Dial("tcp", pxLn.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	client := netip.MustParseAddrPort(c.LocalAddr().String())
	br := bufio.NewReader(c)
	status := func(req string) string {
		t.Helper()
		if _, err := io.WriteString(c, req); err != nil {
			t.Fatal(err)
		}
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		// Skip the headers and the body (Content-Length 2 or 14).
		n := 0
		for {
			h, err := br.ReadString('\n')
			if err != nil {
				t.Fatal(err)
			}
			if h == "\r\n" {
				break
			}
			if h == "Content-Length: 2\r\n" {
				n = 2
			}
			if h == "Content-Length: 14\r\n" {
				n = 14
			}
		}
		if _, err := br.Discard(n); err != nil {
			t.Fatal(err)
		}
		return line
	}
	if got := status("GET /abc?x=1 HTTP/1.1\r\nHost: svc.ns:8080\r\nUser-Agent: t\r\nX-B: 2\r\nAccept: */*\r\n\r\n"); got != "HTTP/1.1 201 Created\r\n" {
		t.Fatalf("allowed: %q", got)
	}
	if got, want := <-heads, "GET /abc?x=1 HTTP/1.1\r\nHost: svc.ns:8080\r\nUser-Agent: t\r\nAccept: */*\r\nX-B: 2\r\n\r\n"; got != want {
		t.Errorf("upstream got %q, want %q", got, want)
	}
	if got := status("POST /b HTTP/1.1\r\nHost: svc.ns:8080\r\nContent-Length: 0\r\n\r\n"); got != "HTTP/1.1 403 Forbidden\r\n" {
		t.Fatalf("denied: %q", got)
	}
	// A second connection: its dial fails, it gets 503 and an error flow.
	c2, err := net.Dial("tcp", pxLn.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	client2 := netip.MustParseAddrPort(c2.LocalAddr().String())
	if _, err := io.WriteString(c2, "GET /a HTTP/1.1\r\nHost: svc.ns\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	if line, err := bufio.NewReader(c2).ReadString('\n'); err != nil || line != "HTTP/1.1 503 Service Unavailable\r\n" {
		t.Fatalf("unreachable: %q, %v", line, err)
	}
	<-served
	after := time.Now()

	flow := func(srcPort uint16, verdict flowpb.Verdict, code uint32, method, url, summary string) *flowpb.Flow {
		f := &flowpb.Flow{
			Type:      flowpb.FlowType_L7,
			Verdict:   verdict,
			IP:        &flowpb.IP{Source: "127.0.0.1", Destination: upAddr.Addr().String()},
			L4:        &flowpb.Layer4{Protocol: &flowpb.Layer4_TCP{TCP: &flowpb.TCP{SourcePort: uint32(srcPort), DestinationPort: uint32(upAddr.Port())}}},
			Source:    &flowpb.Endpoint{ID: 7, Identity: 4242},
			EventType: &flowpb.CiliumEventType{Type: 129},
			Summary:   summary,
			L7: &flowpb.Layer7{Type: flowpb.L7FlowType_RESPONSE,
				Record: &flowpb.Layer7_Http{Http: &flowpb.HTTP{Code: code, Method: method, Url: url, Protocol: "HTTP/1.1"}}},
			TrafficDirection: flowpb.TrafficDirection_EGRESS,
		}
		if verdict == flowpb.Verdict_DROPPED {
			f.DropReasonDesc = flowpb.DropReason_POLICY_DENIED
		}
		return f
	}
	want := []*flowpb.Flow{
		flow(client.Port(), flowpb.Verdict_FORWARDED, 201, "GET", "http://svc.ns:8080/abc?x=1",
			`HTTP allowed by http rule 0 {method: "GET", path: "/a.*", host: "", headers: []}`),
		flow(client.Port(), flowpb.Verdict_DROPPED, 403, "POST", "http://svc.ns:8080/b", "HTTP no http rule allows it"),
		flow(client2.Port(), flowpb.Verdict_ERROR, 503, "GET", "http://svc.ns/a", "HTTP upstream: refused"),
	}
	mu.Lock()
	defer mu.Unlock()
	if len(flows) != len(want) {
		t.Fatalf("%d flows, want %d", len(flows), len(want))
	}
	for i, f := range flows {
		// Time and latency vary: checked apart, then cleared.
		at := f.GetTime().AsTime()
		if at.Before(before) || at.After(after) {
			t.Errorf("flow %d: time %v not within the requests (%v, %v)", i, at, before, after)
		}
		if lat := time.Duration(f.GetL7().GetLatencyNs()); lat <= 0 || lat > after.Sub(before) {
			t.Errorf("flow %d: latency %v", i, lat)
		}
		g := proto.Clone(f).(*flowpb.Flow)
		g.Time, g.L7.LatencyNs = nil, 0
		if !proto.Equal(g, want[i]) {
			t.Errorf("flow %d:\n got %v\nwant %v", i, g, want[i])
		}
	}
}
