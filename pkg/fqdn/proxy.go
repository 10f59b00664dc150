package fqdn

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"time"

	flowpb "github.com/cilium/cilium/api/v1/flow"
	"github.com/miekg/dns"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/tendril-net/tendril/pkg/policy/api"
)

// Source is the endpoint a redirected query came from.
type Source struct {
	EndpointID uint16
	Identity   uint32
}

// ProxyConfig is what the DNS proxy asks of the rest of the agent.
type ProxyConfig struct {
	// Endpoint names the local endpoint sending from addr, from the
	// endpoint table. The address is enough because the datapath drops a
	// pod's packets whose source is not its own address (anti-spoofing,
	// bpf_lxc.c) before they can be redirected here.
	Endpoint func(addr netip.Addr) (Source, bool)
	// Rules are the endpoint's DNS rules for queries to dst; none allows
	// no name.
	Rules func(ep uint16, dst netip.AddrPort) []api.PortRuleDNS
	// Learned is called with each allowed answer's addresses before the
	// answer is released to the pod: it puts them in the pod's policy. An
	// error answers SERVFAIL (the pod retries; it never holds an address
	// its policy does not allow yet).
	Learned func(ctx context.Context, src Source, name string, ips []netip.Addr, ttl uint32) error
	// OrigDst is the query's original destination: where it is forwarded.
	OrigDst func(w dns.ResponseWriter) netip.AddrPort
	// Dial opens the connection a query is forwarded on (nil: the
	// default dialer): the redirect's owner dials from the node's
	// network namespace.
	Dial func(network, addr string) (net.Conn, error)
	// Flow receives the proxy's L7 flows (nil: none).
	Flow func(*flowpb.Flow)
	// Timeout bounds one forwarded exchange.
	Timeout time.Duration
	Log     *slog.Logger
}

// Proxy is the DNS proxy's handler: it answers each redirected query by
// forwarding it when the sender's DNS rules allow the name, REFUSED
// otherwise.
type Proxy struct {
	cfg ProxyConfig
}

// NewProxy returns a proxy handler.
func NewProxy(cfg ProxyConfig) *Proxy {
	if cfg.Timeout == 0 {
		cfg.Timeout = 5 * time.Second
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	return &Proxy{cfg: cfg}
}

// Allowed reports whether rules allow looking up name, and the rule that
// does.
func Allowed(rules []api.PortRuleDNS, name string) (api.PortRuleDNS, bool) {
	for _, r := range rules {
		if api.FQDNSelector(r).Matches(name) {
			return r, true
		}
	}
	return api.PortRuleDNS{}, false
}

// ServeDNS implements dns.Handler.
func (p *Proxy) ServeDNS(w dns.ResponseWriter, req *dns.Msg) {
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), p.cfg.Timeout)
	defer cancel()
	srcAP := addrPort(w.RemoteAddr())
	dst := p.cfg.OrigDst(w)
	fl := flowFor(srcAP, dst, w.RemoteAddr().Network())
	// The flow is recorded before the answer is written, so whoever saw
	// the answer finds its flow.
	reply := func(m *dns.Msg, verdict flowpb.Verdict, reason string) {
		p.emit(fl, req, m, verdict, reason, time.Since(start))
		if err := w.WriteMsg(m); err != nil {
			p.cfg.Log.Debug("Cannot answer a DNS query", "src", srcAP, "error", err)
		}
	}
	if len(req.Question) != 1 || req.Opcode != dns.OpcodeQuery {
		reply(new(dns.Msg).SetRcode(req, dns.RcodeFormatError), flowpb.Verdict_DROPPED, "one question of opcode QUERY expected")
		return
	}
	src, ok := p.cfg.Endpoint(srcAP.Addr())
	if !ok {
		reply(new(dns.Msg).SetRcode(req, dns.RcodeRefused), flowpb.Verdict_DROPPED, "source is no local endpoint")
		return
	}
	fl.Source = &flowpb.Endpoint{ID: uint32(src.EndpointID), Identity: src.Identity}
	name := req.Question[0].Name
	rule, ok := Allowed(p.cfg.Rules(src.EndpointID, dst), name)
	if !ok {
		reply(new(dns.Msg).SetRcode(req, dns.RcodeRefused), flowpb.Verdict_DROPPED, "no DNS rule allows "+api.NormalizeName(name))
		return
	}
	resp, err := p.forward(ctx, req, dst, w.RemoteAddr().Network())
	if err != nil {
		p.cfg.Log.Info("DNS query forward failed", "endpoint", src.EndpointID, "name", name, "server", dst, "error", err)
		reply(new(dns.Msg).SetRcode(req, dns.RcodeServerFailure), flowpb.Verdict_DROPPED, "forward: "+err.Error())
		return
	}
	if resp.Rcode == dns.RcodeSuccess {
		ips, ttl := answerIPs(resp)
		if len(ips) > 0 {
			if err := p.cfg.Learned(ctx, src, name, ips, ttl); err != nil {
				p.cfg.Log.Warn("Cannot put a DNS answer in policy", "endpoint", src.EndpointID, "name", name, "error", err)
				reply(new(dns.Msg).SetRcode(req, dns.RcodeServerFailure), flowpb.Verdict_DROPPED, "policy update: "+err.Error())
				return
			}
		}
	}
	reply(resp, flowpb.Verdict_FORWARDED, "allowed by dns rule "+api.FQDNSelector(rule).String())
}

// forward sends req to the original destination over the transport it
// came on (a truncated UDP answer is passed on: the pod retries on TCP).
func (p *Proxy) forward(ctx context.Context, req *dns.Msg, dst netip.AddrPort, network string) (*dns.Msg, error) {
	if !dst.IsValid() {
		return nil, errors.New("no original destination")
	}
	// No UDPSize: the client reads with the buffer the pod's query offers
	// (its EDNS0 size, or 512 bytes), as large as any answer the upstream
	// may send it; a fixed dns.MaxMsgSize cost a 64 KiB buffer a query.
	c := &dns.Client{Net: "udp", Timeout: p.cfg.Timeout}
	if network == "tcp" {
		c.Net = "tcp"
	}
	var resp *dns.Msg
	var err error
	if p.cfg.Dial != nil {
		var conn net.Conn
		conn, err = p.cfg.Dial(c.Net, dst.String())
		if err != nil {
			return nil, fmt.Errorf("dial %s: %w", dst, err)
		}
		co := &dns.Conn{Conn: conn, UDPSize: c.UDPSize}
		defer co.Close()
		resp, _, err = c.ExchangeWithConnContext(ctx, req, co)
	} else {
		resp, _, err = c.ExchangeContext(ctx, req, dst.String())
	}
	if err != nil {
		return nil, fmt.Errorf("exchange with %s: %w", dst, err)
	}
	return resp, nil
}

// answerIPs collects the A and AAAA records of an answer (every owner:
// the chain of CNAMEs from the question ends in them) and their smallest
// TTL.
func answerIPs(m *dns.Msg) ([]netip.Addr, uint32) {
	var ips []netip.Addr
	ttl := uint32(0)
	first := true
	for _, rr := range m.Answer {
		var a netip.Addr
		switch r := rr.(type) {
		case *dns.A:
			a, _ = netip.AddrFromSlice(r.A.To4())
		case *dns.AAAA:
			a, _ = netip.AddrFromSlice(r.AAAA)
		default:
			continue
		}
		if !a.IsValid() {
			continue
		}
		ips = append(ips, a.Unmap())
		if first || rr.Header().Ttl < ttl {
			ttl, first = rr.Header().Ttl, false
		}
	}
	return ips, ttl
}

func addrPort(a net.Addr) netip.AddrPort {
	switch v := a.(type) {
	case *net.UDPAddr:
		ap := v.AddrPort()
		return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	case *net.TCPAddr:
		ap := v.AddrPort()
		return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	}
	ap, _ := netip.ParseAddrPort(a.String())
	return ap
}

func flowFor(src, dst netip.AddrPort, network string) *flowpb.Flow {
	f := &flowpb.Flow{
		Type: flowpb.FlowType_L7,
		IP:   &flowpb.IP{Source: src.Addr().String(), Destination: dst.Addr().String()},
		// A pod's lookup is what it sends: the reporter of the dns
		// metrics is the client.
		TrafficDirection: flowpb.TrafficDirection_EGRESS,
		EventType:        &flowpb.CiliumEventType{Type: 129}, // MessageTypeAccessLog
	}
	if network == "tcp" {
		f.L4 = &flowpb.Layer4{Protocol: &flowpb.Layer4_TCP{TCP: &flowpb.TCP{SourcePort: uint32(src.Port()), DestinationPort: uint32(dst.Port())}}}
	} else {
		f.L4 = &flowpb.Layer4{Protocol: &flowpb.Layer4_UDP{UDP: &flowpb.UDP{SourcePort: uint32(src.Port()), DestinationPort: uint32(dst.Port())}}}
	}
	if src.Addr().Is4() {
		f.IP.IpVersion = flowpb.IPVersion_IPv4
	} else {
		f.IP.IpVersion = flowpb.IPVersion_IPv6
	}
	return f
}

// emit sends the query's L7 flow: its answer (names, addresses, TTL,
// rcode) and the verdict with the reason (the rule, or why not).
func (p *Proxy) emit(f *flowpb.Flow, req, resp *dns.Msg, verdict flowpb.Verdict, reason string, latency time.Duration) {
	if p.cfg.Flow == nil {
		return
	}
	rec := &flowpb.DNS{Rcode: uint32(resp.Rcode), ObservationSource: "proxy"}
	if len(req.Question) > 0 {
		rec.Query = req.Question[0].Name
		rec.Qtypes = []string{dns.TypeToString[req.Question[0].Qtype]}
	}
	for _, rr := range resp.Answer {
		rec.Rrtypes = append(rec.Rrtypes, dns.TypeToString[rr.Header().Rrtype])
		if c, ok := rr.(*dns.CNAME); ok {
			rec.Cnames = append(rec.Cnames, c.Target)
		}
	}
	ips, ttl := answerIPs(resp)
	for _, ip := range ips {
		rec.Ips = append(rec.Ips, ip.String())
	}
	rec.Ttl = ttl
	f.Time = timestamppb.Now()
	f.Verdict = verdict
	f.Summary = "DNS " + reason
	f.L7 = &flowpb.Layer7{Type: flowpb.L7FlowType_RESPONSE, LatencyNs: uint64(latency), Record: &flowpb.Layer7_Dns{Dns: rec}}
	if verdict == flowpb.Verdict_DROPPED {
		f.DropReasonDesc = flowpb.DropReason_POLICY_DENIED
	}
	p.cfg.Flow(f)
}
