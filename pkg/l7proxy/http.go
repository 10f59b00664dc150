// Package l7proxy is the node's transparent HTTP proxy for ports with
// HTTP rules: it reads each request of a redirected connection, passes
// those an HTTP rule of the sender's policy allows to the connection's
// original destination (one upstream connection per client connection,
// kept alive, bodies streamed both ways), answers the others 403, and
// records an L7 flow per request naming the rule that decided.
//
// Who sent a connection is decided by the caller (the redirect's
// listener) from the endpoint table, never from the request.
package l7proxy

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"time"

	flowpb "github.com/cilium/cilium/api/v1/flow"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/tendril-net/tendril/pkg/policy/api"
)

// Source is the peer a redirected connection came from: a local endpoint
// (egress), or the peer of a local endpoint's ingress, whose identity is
// the datapath's (EndpointID then the local endpoint it came from, 0 for
// none).
type Source struct {
	EndpointID uint16
	Identity   uint32
	// Addr is the peer's address (for rules naming CIDRs); unset when
	// the rules do not need it.
	Addr netip.Addr
}

// Config is what the proxy asks of the agent.
type Config struct {
	// Rules are the HTTP rules of src's policy for dst (nil: none allow).
	Rules func(src Source, dst netip.AddrPort) []api.PortRuleHTTP
	// Dial connects to the original destination for the client
	// connection from client (its peer's address and port: the egress
	// proxy's upstream connection keeps them, see pkg/l7redirect).
	Dial func(client, dst netip.AddrPort) (net.Conn, error)
	// Flow receives one L7 flow per request (nil: none).
	Flow func(*flowpb.Flow)
	// Ingress: the proxy enforces the destination's ingress rules (its
	// flows say so); otherwise the source's egress rules.
	Ingress bool
	Log     *slog.Logger
}

// HTTPProxy serves redirected HTTP connections.
type HTTPProxy struct{ cfg Config }

// NewHTTP returns the proxy.
func NewHTTP(cfg Config) *HTTPProxy {
	if cfg.Dial == nil {
		cfg.Dial = func(_, dst netip.AddrPort) (net.Conn, error) {
			return net.DialTimeout("tcp", dst.String(), 10*time.Second)
		}
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	return &HTTPProxy{cfg: cfg}
}

// MaxHeaderBytes bounds a request's line and headers (net/http's
// DefaultMaxHeaderBytes): a client cannot make the proxy hold more.
const MaxHeaderBytes = 1 << 20

// errHeaderTooLarge is headerLimit's error past its bound.
var errHeaderTooLarge = errors.New("request headers too large")

// headerLimit reads from r at most n bytes more, then fails.
type headerLimit struct {
	r io.Reader
	n int64
}

func (l *headerLimit) Read(p []byte) (int, error) {
	if l.n <= 0 {
		return 0, errHeaderTooLarge
	}
	if int64(len(p)) > l.n {
		p = p[:l.n]
	}
	n, err := l.r.Read(p)
	l.n -= int64(n)
	return n, err
}

// Both is what the egress proxy needs for a connection whose flow its
// local destination's ingress sends to the HTTP proxy too
// (docs/policy-l7.md, "Egress and ingress rules on one flow"): one proxy
// applies both rule sets, a request passing only when an egress rule of
// the source and an ingress rule of the destination allow it.
type Both struct {
	// IngressRules are the destination's ingress HTTP rules for the
	// source (nil: none allow).
	IngressRules []api.PortRuleHTTP
}

// ConnOptions are what one connection needs beyond the proxy's Config.
type ConnOptions struct {
	// Both, when set, makes the destination's ingress rules apply too.
	Both *Both
	// Dial, when set, replaces Config.Dial for this connection's
	// upstream (the egress proxy's marked connection from the node to a
	// local destination whose ingress HTTP rules it applies too).
	Dial func(client, dst netip.AddrPort) (net.Conn, error)
}

// compile compiles rules; one that does not compile allows nothing.
func (p *HTTPProxy) compile(rules []api.PortRuleHTTP) []*Matcher {
	matchers := make([]*Matcher, 0, len(rules))
	for i, r := range rules {
		m, err := Compile(r)
		if err != nil {
			// Validated with the policy: not expected; the rule allows nothing.
			p.cfg.Log.Warn("HTTP rule does not compile; it allows nothing", "rule", i, "error", err)
			m = nil
		}
		matchers = append(matchers, m)
	}
	return matchers
}

// firstMatch is the index of the first matcher that allows req, or -1.
func firstMatch(matchers []*Matcher, req *http.Request) int {
	for i, m := range matchers {
		if m != nil && m.Matches(req) {
			return i
		}
	}
	return -1
}

// ServeConn proxies one client connection from src, originally to dst,
// until either side closes it. It closes conn.
func (p *HTTPProxy) ServeConn(conn net.Conn, src Source, dst netip.AddrPort) {
	p.ServeConnWith(conn, src, dst, ConnOptions{})
}

// ServeConnWith is ServeConn with a connection's options.
//
// What a request costs the proxy is paid per request under kept-alive
// load (the agent's profile: flow emission and socket calls), so what is
// the same for every request of a connection is made once: the rules'
// matchers and the flows' summaries, the flows' addresses and ports, the
// upstream's read and write buffers.
func (p *HTTPProxy) ServeConnWith(conn net.Conn, src Source, dst netip.AddrPort, opts ConnOptions) {
	defer conn.Close()
	rules := p.cfg.Rules(src, dst)
	matchers := p.compile(rules)
	allowedBy := ruleReasons("HTTP allowed by http rule", rules)
	var inRules []api.PortRuleHTTP
	var inMatchers []*Matcher
	var inAllowedBy []string
	if opts.Both != nil {
		inRules = opts.Both.IngressRules
		inMatchers = p.compile(inRules)
		inAllowedBy = ruleReasons("HTTP allowed by the destination's ingress http rule", inRules)
	}
	dialUp := p.cfg.Dial
	if opts.Dial != nil {
		dialUp = opts.Dial
	}
	// The flows' directions: this proxy's own, and with Both the
	// destination's ingress as well (as Cilium shows a request its
	// egress and its ingress proxy both passed: one flow each).
	own, other := flowpb.TrafficDirection_EGRESS, flowpb.TrafficDirection_INGRESS
	if p.cfg.Ingress {
		own = flowpb.TrafficDirection_INGRESS
	}
	denied := "HTTP no http rule allows it"
	if opts.Both != nil {
		denied = "HTTP no http rule of the source's egress allows it"
	}
	client, _ := netip.ParseAddrPort(conn.RemoteAddr().String())
	client = netip.AddrPortFrom(client.Addr().Unmap(), client.Port())
	fl := p.newConnFlows(src, client, dst)
	var upstream net.Conn
	// The upstream's buffers live as long as the client connection (a
	// redial resets them): net/http's Request.Write would otherwise
	// allocate a 4 KiB writer for every request.
	var upReader *bufio.Reader
	var upWriter *bufio.Writer
	defer func() {
		if upstream != nil {
			upstream.Close()
		}
	}()
	// A request's line and headers may take MaxHeaderBytes (and what the
	// buffer read ahead), as net/http's server allows; the body is then
	// read without a bound (streamed, not held).
	lim := &headerLimit{r: conn}
	br := bufio.NewReader(lim)
	// Answers are written through a buffer, flushed once each is
	// written and whenever its body would wait on the upstream
	// (flushBeforeWait): a small answer leaves in one write rather than
	// one per header line, and a streamed one still leaves as it comes.
	cw := bufio.NewWriter(conn)
	answer := &flushBeforeWait{w: cw}
	// dial (re)connects the upstream for req; false when it cannot
	// (the client was answered 503 and the request's flow emitted).
	dial := func(req *http.Request, start time.Time) bool {
		if upstream != nil {
			upstream.Close()
		}
		var err error
		upstream, err = dialUp(client, dst)
		if err != nil {
			upstream = nil
			p.cfg.Log.Info("HTTP proxy: cannot reach the original destination", "dst", dst, "error", err)
			fl.emit(own, req, http.StatusServiceUnavailable, start, flowpb.Verdict_ERROR, "HTTP upstream: "+err.Error())
			_ = (&http.Response{StatusCode: http.StatusServiceUnavailable, ProtoMajor: 1, ProtoMinor: 1, Close: true, Request: req}).Write(conn)
			return false
		}
		if upReader == nil {
			upReader, upWriter = bufio.NewReader(upstream), bufio.NewWriter(upstream)
			answer.src = upReader
		} else {
			upReader.Reset(upstream)
			upWriter.Reset(upstream)
		}
		return true
	}
	for {
		lim.n = MaxHeaderBytes + int64(br.Size())
		req, err := http.ReadRequest(br)
		lim.n = math.MaxInt64
		if errors.Is(err, errHeaderTooLarge) {
			p.cfg.Log.Debug("HTTP proxy: request headers too large; closing", "src", conn.RemoteAddr())
			_ = (&http.Response{StatusCode: http.StatusRequestHeaderFieldsTooLarge, ProtoMajor: 1, ProtoMinor: 1, Close: true}).Write(conn)
			return
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				p.cfg.Log.Debug("HTTP proxy: bad request; closing", "src", conn.RemoteAddr(), "error", err)
			}
			return
		}
		start := time.Now()
		rule := firstMatch(matchers, req)
		inRule := -1
		if rule >= 0 && opts.Both != nil {
			inRule = firstMatch(inMatchers, req)
		}
		if rule < 0 || (opts.Both != nil && inRule < 0) {
			// The body is drained so the next request on the connection
			// can be read (keep-alive survives a denial).
			_, _ = io.Copy(io.Discard, req.Body)
			req.Body.Close()
			resp := &http.Response{StatusCode: http.StatusForbidden, ProtoMajor: 1, ProtoMinor: 1, Request: req,
				Header: http.Header{"Content-Type": {"text/plain"}}, Close: req.Close}
			body := "Access denied\n"
			resp.ContentLength = int64(len(body))
			resp.Body = io.NopCloser(strings.NewReader(body))
			if rule < 0 {
				fl.emit(own, req, http.StatusForbidden, start, flowpb.Verdict_DROPPED, denied)
			} else {
				// The source's egress let it through; the destination's
				// ingress answered 403 (Cilium: the ingress proxy's
				// denial, then the egress proxy's flow of that answer).
				fl.emit(other, req, http.StatusForbidden, start, flowpb.Verdict_DROPPED,
					"HTTP no http rule of the destination's ingress allows it")
				fl.emit(own, req, http.StatusForbidden, start, flowpb.Verdict_FORWARDED, allowedBy[rule])
			}
			if err := writeResponse(cw, resp); err != nil || req.Close {
				return
			}
			continue
		}
		reused := upstream != nil
		if !reused && !dial(req, start) {
			return
		}
		resp, err := roundTrip(upWriter, upReader, req)
		if err != nil && reused && replayable(req) {
			// The server may have closed the kept-alive connection
			// between two requests (its idle timeout): a request it
			// cannot have acted on goes again on a new connection, as
			// net/http's client does.
			p.cfg.Log.Debug("HTTP proxy: kept-alive upstream connection failed; redialing", "dst", dst, "error", err)
			if !dial(req, start) {
				return
			}
			resp, err = roundTrip(upWriter, upReader, req)
		}
		if err != nil {
			p.cfg.Log.Debug("HTTP proxy: upstream exchange", "dst", dst, "error", err)
			return
		}
		if opts.Both != nil {
			fl.emit(other, req, resp.StatusCode, start, flowpb.Verdict_FORWARDED, inAllowedBy[inRule])
		}
		fl.emit(own, req, resp.StatusCode, start, flowpb.Verdict_FORWARDED, allowedBy[rule])
		answer.ReadCloser = resp.Body
		resp.Body = answer
		err = writeResponse(cw, resp) // streams the body
		resp.Body.Close()
		answer.ReadCloser = nil
		if err != nil || req.Close || resp.Close {
			return
		}
	}
}

// roundTrip sends req on an upstream connection and reads the answer's
// head (its body is read as it is passed on).
func roundTrip(up *bufio.Writer, upReader *bufio.Reader, req *http.Request) (*http.Response, error) {
	// Given a *bufio.Writer, Request.Write uses it (and flushes after
	// each chunk of a chunked body, as with its own) but leaves the
	// last flush to the caller.
	if err := req.Write(up); err != nil {
		return nil, fmt.Errorf("write request: %w", err)
	}
	if err := up.Flush(); err != nil {
		return nil, fmt.Errorf("write request: %w", err)
	}
	resp, err := http.ReadResponse(upReader, req)
	if err != nil {
		return nil, fmt.Errorf("read response: %w", err)
	}
	return resp, nil
}

// replayable reports whether req may be sent again after a failed
// exchange: a method without side effects (RFC 9110's safe methods) and
// no body (one already sent is gone).
func replayable(req *http.Request) bool {
	switch req.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return req.ContentLength == 0 && len(req.TransferEncoding) == 0
	}
	return false
}

// writeResponse writes resp through w and flushes it.
func writeResponse(w *bufio.Writer, resp *http.Response) error {
	if err := resp.Write(w); err != nil {
		return err
	}
	return w.Flush()
}

// flushBeforeWait is an upstream answer's body that flushes what was
// written to the client before a read that would wait on the upstream
// (nothing left in src's buffer), so a streamed body is never held back
// waiting for more.
type flushBeforeWait struct {
	io.ReadCloser
	src *bufio.Reader
	w   *bufio.Writer
}

func (f *flushBeforeWait) Read(p []byte) (int, error) {
	if f.src.Buffered() == 0 && f.w.Buffered() > 0 {
		if err := f.w.Flush(); err != nil {
			return 0, err
		}
	}
	return f.ReadCloser.Read(p)
}

// ruleReasons are the flows' summaries naming each of rules ("PREFIX i
// {method: ...}"), made once a connection: formatting them for every
// request showed in the agent's profile under kept-alive load.
func ruleReasons(prefix string, rules []api.PortRuleHTTP) []string {
	r := make([]string, len(rules))
	for i, rule := range rules {
		r[i] = fmt.Sprintf("%s %d %s", prefix, i, describe(rule))
	}
	return r
}

func describe(r api.PortRuleHTTP) string {
	return fmt.Sprintf("{method: %q, path: %q, host: %q, headers: %q}", r.Method, r.Path, r.Host, r.Headers)
}

// connFlows builds the L7 flows of one client connection: what is the
// same for each of its requests (addresses, ports, the source) is made
// once, so a request's flow costs one allocation and its URL.
type connFlows struct {
	sink             func(*flowpb.Flow)
	srcIP, dstIP     string
	srcPort, dstPort uint32
	epID, identity   uint32
}

func (p *HTTPProxy) newConnFlows(src Source, client, dst netip.AddrPort) *connFlows {
	return &connFlows{sink: p.cfg.Flow, srcIP: client.Addr().String(), dstIP: dst.Addr().String(),
		srcPort: uint32(client.Port()), dstPort: uint32(dst.Port()), epID: uint32(src.EndpointID), identity: src.Identity}
}

// flowParts are a flow and the messages it points to, allocated
// together: one allocation a flow rather than eleven. The sink owns the
// flow, and with it all of them.
type flowParts struct {
	flow   flowpb.Flow
	time   timestamppb.Timestamp
	ip     flowpb.IP
	l4     flowpb.Layer4
	l4TCP  flowpb.Layer4_TCP
	tcp    flowpb.TCP
	source flowpb.Endpoint
	event  flowpb.CiliumEventType
	l7     flowpb.Layer7
	l7HTTP flowpb.Layer7_Http
	http   flowpb.HTTP
}

// emit records the request's flow in direction dir: its latency from
// start, summary "HTTP <reason>".
func (c *connFlows) emit(dir flowpb.TrafficDirection, req *http.Request, code int, start time.Time, verdict flowpb.Verdict, summary string) {
	if c.sink == nil {
		return
	}
	now := time.Now()
	u := *req.URL
	u.Scheme, u.Host = "http", req.Host
	x := &flowParts{}
	f := &x.flow
	x.time.Seconds, x.time.Nanos = now.Unix(), int32(now.Nanosecond())
	f.Time = &x.time
	f.Type = flowpb.FlowType_L7
	f.Verdict = verdict
	x.ip.Source, x.ip.Destination = c.srcIP, c.dstIP
	f.IP = &x.ip
	x.tcp.SourcePort, x.tcp.DestinationPort = c.srcPort, c.dstPort
	x.l4TCP.TCP = &x.tcp
	x.l4.Protocol = &x.l4TCP
	f.L4 = &x.l4
	x.source.ID, x.source.Identity = c.epID, c.identity
	f.Source = &x.source
	x.event.Type = 129 // MessageTypeAccessLog
	f.EventType = &x.event
	f.Summary = summary
	x.http.Code, x.http.Method, x.http.Url, x.http.Protocol = uint32(code), req.Method, u.String(), req.Proto
	x.l7HTTP.Http = &x.http
	x.l7.Type, x.l7.LatencyNs, x.l7.Record = flowpb.L7FlowType_RESPONSE, uint64(now.Sub(start)), &x.l7HTTP
	f.L7 = &x.l7
	if verdict == flowpb.Verdict_DROPPED {
		f.DropReasonDesc = flowpb.DropReason_POLICY_DENIED
	}
	f.TrafficDirection = dir
	c.sink(f)
}
