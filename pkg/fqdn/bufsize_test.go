package fqdn

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/tendril-net/tendril/pkg/policy/api"
)

// bigUpstream answers big.example with 40 A records, other names with
// one, truncated as a real server truncates: to the query's EDNS0 buffer
// size, 512 without one.
func bigUpstream(t *testing.T) netip.AddrPort {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg).SetReply(r)
		n := 1
		if r.Question[0].Name == "big.example." {
			n = 40
		}
		for i := 0; i < n; i++ {
			m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: r.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60},
				A: net.ParseIP(fmt.Sprintf("192.0.2.%d", i+1))})
		}
		size := dns.MinMsgSize
		if opt := r.IsEdns0(); opt != nil {
			size = int(opt.UDPSize())
			m.SetEdns0(opt.UDPSize(), false)
		}
		m.Truncate(size)
		_ = w.WriteMsg(m)
	})}
	go func() { _ = srv.ActivateAndServe() }()
	t.Cleanup(func() { _ = srv.Shutdown() })
	return netip.MustParseAddrPort(pc.LocalAddr().String())
}

func serveProxy(t *testing.T, up netip.AddrPort) string {
	t.Helper()
	p := NewProxy(ProxyConfig{
		Endpoint: func(netip.Addr) (Source, bool) { return Source{EndpointID: 7, Identity: 4242}, true },
		Rules:    func(uint16, netip.AddrPort) []api.PortRuleDNS { return []api.PortRuleDNS{{MatchPattern: "*.example"}} },
		Learned:  func(context.Context, Source, string, []netip.Addr, uint32) error { return nil },
		OrigDst:  func(dns.ResponseWriter) netip.AddrPort { return up },
	})
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &dns.Server{PacketConn: pc, Handler: p}
	go func() { _ = srv.ActivateAndServe() }()
	t.Cleanup(func() { _ = srv.Shutdown() })
	return pc.LocalAddr().String()
}

// TestProxyForwardBufferFollowsTheQuery: the proxy asks the upstream with
// the buffer the pod's query offered: an EDNS0 query of 4096 bytes gets
// all 40 records through the proxy, a plain one the upstream's truncated
// answer (TC: the pod retries over TCP). And a forwarded lookup does not
// allocate a 64 KiB receive buffer, as it did with the client's buffer
// fixed at dns.MaxMsgSize: the whole process (client, proxy, upstream)
// allocates less than 32 KiB a lookup.
func TestProxyForwardBufferFollowsTheQuery(t *testing.T) {
	proxy := serveProxy(t, bigUpstream(t))
	c := &dns.Client{Timeout: 10 * time.Second, UDPSize: 4096}
	edns := new(dns.Msg).SetQuestion("big.example.", dns.TypeA)
	edns.SetEdns0(4096, false)
	r, _, err := c.Exchange(edns, proxy)
	if err != nil || r.Truncated || len(r.Answer) != 40 {
		t.Fatalf("EDNS0 4096 query through the proxy: %v answers, truncated %v, %v", len(r.Answer), r != nil && r.Truncated, err)
	}
	// (miekg's client reports the truncated answer with an unpack error.)
	r, _, err = (&dns.Client{Timeout: 10 * time.Second}).Exchange(new(dns.Msg).SetQuestion("big.example.", dns.TypeA), proxy)
	if r == nil || !r.Truncated {
		t.Fatalf("plain query through the proxy: want the truncated answer, got %v %v", r, err)
	}

	const lookups = 200
	small := new(dns.Msg).SetQuestion("small.example.", dns.TypeA)
	plain := &dns.Client{Timeout: 10 * time.Second}
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for i := 0; i < lookups; i++ {
		if _, _, err := plain.Exchange(small, proxy); err != nil {
			t.Fatal(err)
		}
	}
	runtime.ReadMemStats(&after)
	per := (after.TotalAlloc - before.TotalAlloc) / lookups
	t.Logf("%d bytes allocated a forwarded lookup (client, proxy and upstream)", per)
	if per >= 32<<10 {
		t.Fatalf("%d bytes allocated a forwarded lookup, want under 32 KiB", per)
	}
}
