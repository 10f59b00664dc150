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
func (p *HTTPProxy) ServeConnWith(conn net.Conn, src Source, dst netip.AddrPort, opts ConnOptions) {
	defer conn.Close()
	rules := p.cfg.Rules(src, dst)
	matchers := p.compile(rules)
	allowedBy := ruleReasons("allowed by http rule", rules)
	var inRules []api.PortRuleHTTP
	var inMatchers []*Matcher
	var inAllowedBy []string
	if opts.Both != nil {
		inRules = opts.Both.IngressRules
		inMatchers = p.compile(inRules)
		inAllowedBy = ruleReasons("allowed by the destination's ingress http rule", inRules)
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
	denied := "no http rule allows it"
	if opts.Both != nil {
		denied = "no http rule of the source's egress allows it"
	}
	client, _ := netip.ParseAddrPort(conn.RemoteAddr().String())
	client = netip.AddrPortFrom(client.Addr().Unmap(), client.Port())
	var upstream net.Conn
	var upReader *bufio.Reader
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
				p.emit(own, src, conn, dst, req, http.StatusForbidden, time.Since(start), flowpb.Verdict_DROPPED, denied)
			} else {
				// The source's egress let it through; the destination's
				// ingress answered 403 (Cilium: the ingress proxy's
				// denial, then the egress proxy's flow of that answer).
				p.emit(other, src, conn, dst, req, http.StatusForbidden, time.Since(start), flowpb.Verdict_DROPPED,
					"no http rule of the destination's ingress allows it")
				p.emit(own, src, conn, dst, req, http.StatusForbidden, time.Since(start), flowpb.Verdict_FORWARDED,
					allowedBy[rule])
			}
			if err := writeResponse(cw, resp); err != nil || req.Close {
				return
			}
			continue
		}
		dial := func() bool {
			if upstream != nil {
				upstream.Close()
			}
			upstream, err = dialUp(client, dst)
			if err != nil {
				upstream = nil
				p.cfg.Log.Info("HTTP proxy: cannot reach the original destination", "dst", dst, "error", err)
				p.emit(own, src, conn, dst, req, http.StatusServiceUnavailable, time.Since(start), flowpb.Verdict_ERROR, "upstream: "+err.Error())
				_ = (&http.Response{StatusCode: http.StatusServiceUnavailable, ProtoMajor: 1, ProtoMinor: 1, Close: true, Request: req}).Write(conn)
				return false
			}
			upReader = bufio.NewReader(upstream)
			return true
		}
		reused := upstream != nil
		if !reused && !dial() {
			return
		}
		resp, err := roundTrip(upstream, upReader, req)
		if err != nil && reused && replayable(req) {
			// The server may have closed the kept-alive connection
			// between two requests (its idle timeout): a request it
			// cannot have acted on goes again on a new connection, as
			// net/http's client does.
			p.cfg.Log.Debug("HTTP proxy: kept-alive upstream connection failed; redialing", "dst", dst, "error", err)
			if !dial() {
				return
			}
			resp, err = roundTrip(upstream, upReader, req)
		}
		if err != nil {
			p.cfg.Log.Debug("HTTP proxy: upstream exchange", "dst", dst, "error", err)
			return
		}
		if opts.Both != nil {
			p.emit(other, src, conn, dst, req, resp.StatusCode, time.Since(start), flowpb.Verdict_FORWARDED,
				inAllowedBy[inRule])
		}
		p.emit(own, src, conn, dst, req, resp.StatusCode, time.Since(start), flowpb.Verdict_FORWARDED, allowedBy[rule])
		resp.Body = &flushBeforeWait{ReadCloser: resp.Body, src: upReader, w: cw}
		err = writeResponse(cw, resp) // streams the body
		resp.Body.Close()
		if err != nil || req.Close || resp.Close {
			return
		}
	}
}

// roundTrip sends req on an upstream connection and reads the answer's
// head (its body is read as it is passed on).
func roundTrip(up net.Conn, upReader *bufio.Reader, req *http.Request) (*http.Response, error) {
	if err := req.Write(up); err != nil {
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

// emit records the request's flow in direction dir.
func (p *HTTPProxy) emit(dir flowpb.TrafficDirection, src Source, conn net.Conn, dst netip.AddrPort, req *http.Request, code int, latency time.Duration, verdict flowpb.Verdict, reason string) {
	if p.cfg.Flow == nil {
		return
	}
	s, _ := netip.ParseAddrPort(conn.RemoteAddr().String())
	u := *req.URL
	u.Scheme, u.Host = "http", req.Host
	f := &flowpb.Flow{
		Time:      timestamppb.Now(),
		Type:      flowpb.FlowType_L7,
		Verdict:   verdict,
		IP:        &flowpb.IP{Source: s.Addr().Unmap().String(), Destination: dst.Addr().String()},
		L4:        &flowpb.Layer4{Protocol: &flowpb.Layer4_TCP{TCP: &flowpb.TCP{SourcePort: uint32(s.Port()), DestinationPort: uint32(dst.Port())}}},
		Source:    &flowpb.Endpoint{ID: uint32(src.EndpointID), Identity: src.Identity},
		EventType: &flowpb.CiliumEventType{Type: 129}, // MessageTypeAccessLog
		Summary:   "HTTP " + reason,
		L7: &flowpb.Layer7{Type: flowpb.L7FlowType_RESPONSE, LatencyNs: uint64(latency),
			Record: &flowpb.Layer7_Http{Http: &flowpb.HTTP{Code: uint32(code), Method: req.Method, Url: u.String(), Protocol: req.Proto}}},
	}
	if verdict == flowpb.Verdict_DROPPED {
		f.DropReasonDesc = flowpb.DropReason_POLICY_DENIED
	}
	f.TrafficDirection = dir
	p.cfg.Flow(f)
}
