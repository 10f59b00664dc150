package fqdn

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	flowpb "github.com/cilium/cilium/api/v1/flow"
	"github.com/miekg/dns"

	"github.com/tendril-net/tendril/pkg/policy/api"
)

// upstream is a real DNS server on loopback answering world.example and
// api-1.example with A records.
func upstream(t *testing.T) netip.AddrPort {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	mux := dns.NewServeMux()
	mux.HandleFunc(".", func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg).SetReply(r)
		switch strings.ToLower(r.Question[0].Name) {
		case "world.example.":
			m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: "world.example.", Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 2}, A: net.ParseIP("192.0.2.10")})
		case "api-1.example.":
			m.Answer = append(m.Answer,
				&dns.CNAME{Hdr: dns.RR_Header{Name: "api-1.example.", Rrtype: dns.TypeCNAME, Class: dns.ClassINET, Ttl: 600}, Target: "lb.example."},
				&dns.A{Hdr: dns.RR_Header{Name: "lb.example.", Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 120}, A: net.ParseIP("192.0.2.11")})
		default:
			m.Rcode = dns.RcodeNameError
		}
		_ = w.WriteMsg(m)
	})
	srv := &dns.Server{PacketConn: pc, Handler: mux}
	go func() { _ = srv.ActivateAndServe() }()
	t.Cleanup(func() { _ = srv.Shutdown() })
	return netip.MustParseAddrPort(pc.LocalAddr().String())
}

type recorder struct {
	mu    sync.Mutex
	flows []*flowpb.Flow
}

func (r *recorder) add(f *flowpb.Flow) {
	r.mu.Lock()
	r.flows = append(r.flows, f)
	r.mu.Unlock()
}

func (r *recorder) last() *flowpb.Flow {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.flows[len(r.flows)-1]
}

// The proxy forwards an allowed query to the original destination and has
// the answer's addresses learned before the pod gets the answer; a name
// no DNS rule allows is REFUSED with a dropped L7 flow; a sender that is
// no local endpoint is refused; a failed policy update answers SERVFAIL.
func TestProxyForwardsRefusesLearns(t *testing.T) {
	up := upstream(t)
	cache := NewCache(time.Second, nil)
	var rec recorder
	var learnErr error
	var mu sync.Mutex
	knownSrc := true
	p := NewProxy(ProxyConfig{
		Endpoint: func(a netip.Addr) (Source, bool) {
			mu.Lock()
			defer mu.Unlock()
			return Source{EndpointID: 7, Identity: 4242}, knownSrc && a == netip.MustParseAddr("127.0.0.1")
		},
		Rules: func(ep uint16, dst netip.AddrPort) []api.PortRuleDNS {
			if ep != 7 || dst != up {
				return nil
			}
			return []api.PortRuleDNS{{MatchName: "world.example"}, {MatchPattern: "api-*.example"}, {MatchName: "missing.example"}}
		},
		Learned: func(_ context.Context, src Source, name string, ips []netip.Addr, ttl uint32) error {
			mu.Lock()
			defer mu.Unlock()
			if learnErr != nil {
				return learnErr
			}
			cache.Add(src.EndpointID, name, ips, ttl)
			return nil
		},
		OrigDst: func(dns.ResponseWriter) netip.AddrPort { return up },
		Flow:    rec.add,
	})
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &dns.Server{PacketConn: pc, Handler: p}
	go func() { _ = srv.ActivateAndServe() }()
	t.Cleanup(func() { _ = srv.Shutdown() })

	ask := func(name string) *dns.Msg {
		t.Helper()
		c := &dns.Client{Timeout: 10 * time.Second}
		r, _, err := c.Exchange(new(dns.Msg).SetQuestion(name, dns.TypeA), pc.LocalAddr().String())
		if err != nil {
			t.Fatalf("query %s: %v", name, err)
		}
		return r
	}

	r := ask("World.Example.")
	if r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 {
		t.Fatalf("allowed name: %v", r)
	}
	// Learned ran before the answer was written: the cache has it now.
	if l := cache.Lookups(7, ""); len(l) != 1 || l[0].Name != "world.example" || l[0].IPs[0] != netip.MustParseAddr("192.0.2.10") {
		t.Fatalf("not learned before the answer: %+v", l)
	}
	if f := rec.last(); f.Verdict != flowpb.Verdict_FORWARDED || f.L7.GetDns().GetIps()[0] != "192.0.2.10" || f.Source.GetIdentity() != 4242 {
		t.Fatalf("forwarded flow: %v", f)
	}

	r = ask("api-1.example.")
	if r.Rcode != dns.RcodeSuccess {
		t.Fatalf("pattern: %v", r)
	}
	if l := cache.Lookups(7, "api-*.example"); len(l) != 1 || l[0].TTL != 120 {
		t.Fatalf("CNAME answer: %+v", l)
	}

	r = ask("evil.test.")
	if r.Rcode != dns.RcodeRefused {
		t.Fatalf("denied name: rcode %s", dns.RcodeToString[r.Rcode])
	}
	if f := rec.last(); f.Verdict != flowpb.Verdict_DROPPED || f.L7.GetDns().GetRcode() != dns.RcodeRefused || f.L7.GetDns().GetQuery() != "evil.test." {
		t.Fatalf("refused flow: %v", f)
	}
	if len(cache.Lookups(0, "evil.test")) != 0 {
		t.Fatal("denied name learned")
	}

	// NXDOMAIN passes through, nothing learned.
	if r = ask("missing.example."); r.Rcode != dns.RcodeNameError {
		t.Fatalf("nxdomain: %s", dns.RcodeToString[r.Rcode])
	}

	mu.Lock()
	learnErr = errors.New("policy map full")
	mu.Unlock()
	if r = ask("world.example."); r.Rcode != dns.RcodeServerFailure || len(r.Answer) != 0 {
		t.Fatalf("failed policy update: %v", r)
	}

	mu.Lock()
	learnErr, knownSrc = nil, false
	mu.Unlock()
	if r = ask("world.example."); r.Rcode != dns.RcodeRefused {
		t.Fatalf("unknown source: %s", dns.RcodeToString[r.Rcode])
	}
}

// Over TCP the proxy forwards over TCP too, and AAAA answers are learned.
func TestProxyTCPAndAAAA(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var upNet string
	var mu sync.Mutex
	up := &dns.Server{Listener: l, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		mu.Lock()
		upNet = w.RemoteAddr().Network()
		mu.Unlock()
		m := new(dns.Msg).SetReply(r)
		m.Answer = append(m.Answer, &dns.AAAA{Hdr: dns.RR_Header{Name: r.Question[0].Name, Rrtype: dns.TypeAAAA, Class: dns.ClassINET, Ttl: 30}, AAAA: net.ParseIP("2001:db8::10")})
		_ = w.WriteMsg(m)
	})}
	go func() { _ = up.ActivateAndServe() }()
	t.Cleanup(func() { _ = up.Shutdown() })
	upAddr := netip.MustParseAddrPort(l.Addr().String())
	var learned []netip.Addr
	p := NewProxy(ProxyConfig{
		Endpoint: func(netip.Addr) (Source, bool) { return Source{EndpointID: 3}, true },
		Rules:    func(uint16, netip.AddrPort) []api.PortRuleDNS { return []api.PortRuleDNS{{MatchPattern: "*"}} },
		Learned: func(_ context.Context, _ Source, _ string, ips []netip.Addr, _ uint32) error {
			mu.Lock()
			learned = ips
			mu.Unlock()
			return nil
		},
		OrigDst: func(dns.ResponseWriter) netip.AddrPort { return upAddr },
	})
	pl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &dns.Server{Listener: pl, Handler: p}
	go func() { _ = srv.ActivateAndServe() }()
	t.Cleanup(func() { _ = srv.Shutdown() })
	c := &dns.Client{Net: "tcp", Timeout: 10 * time.Second}
	r, _, err := c.Exchange(new(dns.Msg).SetQuestion("v6.example.", dns.TypeAAAA), pl.Addr().String())
	if err != nil || r.Rcode != dns.RcodeSuccess {
		t.Fatalf("query over TCP: %v %v", r, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if upNet != "tcp" || len(learned) != 1 || learned[0] != netip.MustParseAddr("2001:db8::10") {
		t.Fatalf("upstream transport %q, learned %v", upNet, learned)
	}
}
