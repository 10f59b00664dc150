package workload

import (
	"bufio"
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

// The probe's resolver: a pod resolves names through the cluster DNS named
// in its resolv.conf, with its search list and ndots. Go's own resolver
// cannot do that here: it reads the machine's /etc/resolv.conf once per
// process, and sends its queries from goroutines on other threads, which
// are outside the pod's network namespace. This one sends every query from
// the calling goroutine, so a caller on a thread switched into the pod's
// namespace queries from the pod.

// DNSConfig is the part of a resolv.conf the probe uses.
type DNSConfig struct {
	// Nameservers are IP addresses.
	Nameservers []string
	// Search is the search list, in order.
	Search []string
	// Ndots: a name with at least this many dots is tried as given before
	// the search list.
	Ndots int
}

// ParseResolvConf reads nameserver, search (or domain) and options ndots.
// A resolv.conf without a nameserver is an error: nothing could answer.
func ParseResolvConf(r io.Reader) (DNSConfig, error) {
	c := DNSConfig{Ndots: 1} // resolv.conf(5)'s default
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		if i := strings.IndexAny(line, "#;"); i >= 0 {
			line = line[:i]
		}
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		switch f[0] {
		case "nameserver":
			if _, err := netip.ParseAddr(f[1]); err != nil {
				return DNSConfig{}, fmt.Errorf("resolv.conf: nameserver %q: %w", f[1], err)
			}
			c.Nameservers = append(c.Nameservers, f[1])
		case "search", "domain":
			// The last of search and domain wins, as in glibc.
			c.Search = append([]string(nil), f[1:]...)
		case "options":
			for _, o := range f[1:] {
				if v, ok := strings.CutPrefix(o, "ndots:"); ok {
					n, err := strconv.Atoi(v)
					if err != nil || n < 0 {
						return DNSConfig{}, fmt.Errorf("resolv.conf: options %s: ndots must be a number >= 0", o)
					}
					c.Ndots = min(n, 15)
				}
			}
		}
	}
	if err := sc.Err(); err != nil {
		return DNSConfig{}, fmt.Errorf("read resolv.conf: %w", err)
	}
	if len(c.Nameservers) == 0 {
		return DNSConfig{}, errors.New("resolv.conf names no nameserver")
	}
	return c, nil
}

// Candidates are the fully qualified names a lookup of name tries, in
// order: a name ending in a dot only as given; one with at least Ndots
// dots first as given, then with each search domain; any other first
// with each search domain, then as given.
func (c DNSConfig) Candidates(name string) []string {
	if strings.HasSuffix(name, ".") {
		return []string{name}
	}
	var out []string
	for _, d := range c.Search {
		out = append(out, name+"."+strings.TrimSuffix(d, ".")+".")
	}
	if strings.Count(name, ".") >= c.Ndots {
		return append([]string{name + "."}, out...)
	}
	return append(out, name+".")
}

// Resolver looks up IPv4 addresses as a pod does.
type Resolver struct {
	Config DNSConfig
	// TCP sends queries over TCP instead of UDP.
	TCP bool
	// Timeout bounds each query to each nameserver.
	Timeout time.Duration
	// Port is the nameservers' port (0: 53).
	Port int
}

// ErrNoSuchHost says every candidate name was answered without an
// address (NXDOMAIN or no A record).
var ErrNoSuchHost = errors.New("no such host")

// LookupIPv4 returns the addresses of the first candidate name that has
// any, and that name.
func (r *Resolver) LookupIPv4(ctx context.Context, name string) ([]netip.Addr, string, error) {
	timeout := r.Timeout
	if timeout <= 0 {
		timeout = 2 * time.Second
	}
	port := strconv.Itoa(cmp.Or(r.Port, 53))
	var lastErr error
	sawNoSuchHost := false
	for _, fqdn := range r.Config.Candidates(name) {
		for _, ns := range r.Config.Nameservers {
			addrs, err := r.query(ctx, net.JoinHostPort(ns, port), fqdn, timeout)
			if err == nil {
				return addrs, fqdn, nil
			}
			lastErr = err
			if errors.Is(err, ErrNoSuchHost) {
				sawNoSuchHost = true
				break // an answer: the next candidate, not the next server
			}
		}
	}
	// A name outside the cluster's zones fails (SERVFAIL: the lab's
	// CoreDNS has no upstream) after the search list said NXDOMAIN.
	if sawNoSuchHost {
		return nil, "", fmt.Errorf("%s: %w (tried %s; last: %v)", name, ErrNoSuchHost, strings.Join(r.Config.Candidates(name), ", "), lastErr)
	}
	return nil, "", fmt.Errorf("resolve %s: %w", name, lastErr)
}

// query asks server for fqdn's A records over UDP (then TCP if the answer
// was truncated) or TCP.
func (r *Resolver) query(ctx context.Context, server, fqdn string, timeout time.Duration) ([]netip.Addr, error) {
	qname, err := dnsmessage.NewName(fqdn)
	if err != nil {
		return nil, fmt.Errorf("name %q: %w", fqdn, err)
	}
	id := uint16(rand.Uint32())
	msg := dnsmessage.Message{
		Header:    dnsmessage.Header{ID: id, RecursionDesired: true},
		Questions: []dnsmessage.Question{{Name: qname, Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET}},
	}
	packed, err := msg.Pack()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var answer []byte
	transport := "UDP"
	if !r.TCP {
		answer, err = exchangeUDP(ctx, server, packed, id)
	}
	if r.TCP || (err == nil && truncated(answer)) {
		transport = "TCP"
		answer, err = exchangeTCP(ctx, server, packed)
	}
	if err != nil {
		return nil, fmt.Errorf("%s over %s: %w", server, transport, err)
	}
	return parseAnswer(answer, id, qname)
}

func truncated(b []byte) bool {
	var p dnsmessage.Parser
	h, err := p.Start(b)
	return err == nil && h.Truncated
}

// exchangeUDP sends the query and resends it now and then (a first
// datagram may be lost while the path is resolved) until a reply with
// the query's ID comes back.
func exchangeUDP(ctx context.Context, server string, query []byte, id uint16) ([]byte, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "udp", server)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	deadline, _ := ctx.Deadline()
	start := time.Now()
	buf := make([]byte, 4096)
	for {
		if _, err := c.Write(query); err != nil {
			return nil, err
		}
		next := time.Now().Add(300 * time.Millisecond)
		if deadline.Before(next) {
			next = deadline
		}
		_ = c.SetReadDeadline(next)
		for {
			n, err := c.Read(buf)
			if err != nil {
				if errors.Is(err, net.ErrClosed) || !isTimeout(err) {
					return nil, err
				}
				break
			}
			if n >= 2 && binary.BigEndian.Uint16(buf) == id {
				return append([]byte(nil), buf[:n]...), nil
			}
		}
		if !time.Now().Before(deadline) {
			// "no answer within": the connectivity test reads a
			// resolution that timed out as dropped (a deny holds).
			return nil, fmt.Errorf("no answer within %s", time.Since(start).Round(time.Millisecond))
		}
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// exchangeTCP sends the query with its two-byte length prefix (RFC 1035
// 4.2.2) and reads the reply the same way.
func exchangeTCP(ctx context.Context, server string, query []byte) ([]byte, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", server)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	if deadline, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(deadline)
	}
	framed := binary.BigEndian.AppendUint16(nil, uint16(len(query)))
	if _, err := c.Write(append(framed, query...)); err != nil {
		return nil, err
	}
	var size [2]byte
	if _, err := io.ReadFull(c, size[:]); err != nil {
		return nil, fmt.Errorf("read the reply's length: %w", err)
	}
	reply := make([]byte, binary.BigEndian.Uint16(size[:]))
	if _, err := io.ReadFull(c, reply); err != nil {
		return nil, fmt.Errorf("read the reply: %w", err)
	}
	return reply, nil
}

// parseAnswer returns the A records of a reply to the query (id, qname):
// ErrNoSuchHost for NXDOMAIN or an answer without any, an error for any
// other failure code.
func parseAnswer(b []byte, id uint16, qname dnsmessage.Name) ([]netip.Addr, error) {
	var m dnsmessage.Message
	if err := m.Unpack(b); err != nil {
		return nil, fmt.Errorf("malformed reply: %w", err)
	}
	if m.ID != id || !m.Response {
		return nil, errors.New("reply does not match the query")
	}
	switch m.RCode {
	case dnsmessage.RCodeSuccess:
	case dnsmessage.RCodeNameError:
		return nil, fmt.Errorf("%s: NXDOMAIN: %w", qname, ErrNoSuchHost)
	default:
		return nil, fmt.Errorf("%s: server answered %s", qname, m.RCode)
	}
	var addrs []netip.Addr
	for _, a := range m.Answers {
		if rr, ok := a.Body.(*dnsmessage.AResource); ok {
			addrs = append(addrs, netip.AddrFrom4(rr.A))
		}
	}
	if len(addrs) == 0 {
		return nil, fmt.Errorf("%s: no A record: %w", qname, ErrNoSuchHost)
	}
	return addrs, nil
}
