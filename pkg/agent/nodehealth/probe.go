package nodehealth

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strconv"
	"time"

	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
)

// ProbeFunc probes one address of another node until ctx ends (the
// prober gives it a deadline below the interval): the round trip, or why
// it failed.
type ProbeFunc func(ctx context.Context, ip netip.Addr) (time.Duration, error)

// ICMP protocol numbers, for parsing replies.
const (
	protoICMP   = 1
	protoICMPv6 = 58
)

// Ping sends one ICMP echo request to ip and waits for its reply. It
// uses an unprivileged ICMP ("ping") socket where the netns's
// net.ipv4.ping_group_range allows it (the kernel then matches replies
// to the socket), else a raw socket (the agent runs as root), which
// sees every ICMP packet of the namespace: a reply is ours only if it
// comes from ip and carries the request's random payload.
func Ping(ctx context.Context, ip netip.Addr) (time.Duration, error) {
	ip = ip.Unmap()
	conn, raw, err := listenICMP(ip.Is6())
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	// A cancelled context (the agent stopping) ends the wait at once.
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Now()) })
	defer stop()
	if d, ok := ctx.Deadline(); ok {
		if err := conn.SetDeadline(d); err != nil {
			return 0, fmt.Errorf("icmp socket deadline: %w", err)
		}
	}

	var token [16]byte
	_, _ = rand.Read(token[:])
	id := int(binary.BigEndian.Uint16(token[:2]))
	var typ, reply icmp.Type = ipv4.ICMPTypeEcho, ipv4.ICMPTypeEchoReply
	proto := protoICMP
	if ip.Is6() {
		typ, reply, proto = ipv6.ICMPTypeEchoRequest, ipv6.ICMPTypeEchoReply, protoICMPv6
	}
	// The kernel fills the ICMPv6 checksum (and a ping socket's ID).
	msg, err := (&icmp.Message{Type: typ, Body: &icmp.Echo{ID: id, Seq: 1, Data: token[:]}}).Marshal(nil)
	if err != nil {
		return 0, fmt.Errorf("build echo request: %w", err)
	}
	var dst net.Addr = &net.UDPAddr{IP: ip.AsSlice()}
	if raw {
		dst = &net.IPAddr{IP: ip.AsSlice()}
	}
	start := time.Now()
	if _, err := conn.WriteTo(msg, dst); err != nil {
		return 0, fmt.Errorf("send echo request: %w", err)
	}
	buf := make([]byte, 1500)
	for {
		n, from, err := conn.ReadFrom(buf)
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				return 0, fmt.Errorf("no echo reply within %s", time.Since(start).Round(time.Millisecond))
			}
			return 0, fmt.Errorf("read echo reply: %w", err)
		}
		if addrOf(from) != ip {
			continue
		}
		m, err := icmp.ParseMessage(proto, buf[:n])
		if err != nil || m.Type != reply {
			continue
		}
		if echo, ok := m.Body.(*icmp.Echo); ok && bytes.Equal(echo.Data, token[:]) {
			return time.Since(start), nil
		}
	}
}

// listenICMP opens a ping socket, else a raw ICMP socket (raw true).
func listenICMP(v6 bool) (*icmp.PacketConn, bool, error) {
	network, rawNetwork, laddr := "udp4", "ip4:icmp", "0.0.0.0"
	if v6 {
		network, rawNetwork, laddr = "udp6", "ip6:ipv6-icmp", "::"
	}
	c, err := icmp.ListenPacket(network, laddr)
	if err == nil {
		return c, false, nil
	}
	c, rawErr := icmp.ListenPacket(rawNetwork, laddr)
	if rawErr != nil {
		return nil, false, fmt.Errorf("open an ICMP socket: ping socket: %v; raw socket: %w", err, rawErr)
	}
	return c, true, nil
}

func addrOf(a net.Addr) netip.Addr {
	var ip net.IP
	switch a := a.(type) {
	case *net.UDPAddr:
		ip = a.IP
	case *net.IPAddr:
		ip = a.IP
	}
	out, _ := netip.AddrFromSlice(ip)
	return out.Unmap()
}

// HTTPProbe returns the probe of a node's health responder: GET
// http://IP:port/hello on a new connection each time (a kept-alive one
// would hide a path that no longer lets new connections through),
// answered 200. The latency is up to the response's headers. dial makes
// the connection (nil: net.Dialer's; a test dials from a namespace).
func HTTPProbe(port uint16, dial func(ctx context.Context, network, addr string) (net.Conn, error)) ProbeFunc {
	if dial == nil {
		dial = (&net.Dialer{}).DialContext
	}
	client := &http.Client{
		Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true, DialContext: dial},
		// The responder never redirects; following one would probe
		// something else.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	return func(ctx context.Context, ip netip.Addr) (time.Duration, error) {
		url := "http://" + net.JoinHostPort(ip.Unmap().String(), strconv.Itoa(int(port))) + "/hello"
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return 0, err
		}
		start := time.Now()
		resp, err := client.Do(req)
		if err != nil {
			var uerr interface{ Unwrap() error }
			if errors.As(err, &uerr) {
				// The *url.Error repeats the method and URL, which the
				// row already says.
				err = uerr.Unwrap()
			}
			if errors.Is(err, context.DeadlineExceeded) {
				return 0, fmt.Errorf("GET /hello: no answer within %s", time.Since(start).Round(time.Millisecond))
			}
			return 0, fmt.Errorf("GET /hello: %w", err)
		}
		latency := time.Since(start)
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return 0, fmt.Errorf("GET /hello: %s", resp.Status)
		}
		return latency, nil
	}
}
