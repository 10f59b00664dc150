// Package pingstream sends ICMP echo requests on a fixed schedule and
// counts the replies: the lab's "a ping every 10 ms" under upgrades and
// restarts. iputils ping paces itself by its own sleeps and, on this
// machine, sends about 56 a second when asked for 100 (-i 0.01); a stream
// that keeps to an absolute schedule catches up after a late wake-up, so
// the rate asked is the rate sent, and every gap in the replies shows.
package pingstream

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync"
	"time"

	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
)

// Config says where to ping and how often.
type Config struct {
	// Dst is the address pinged (IPv4 or IPv6).
	Dst netip.Addr
	// Interval is the time between two requests' scheduled sends.
	Interval time.Duration
	// Count stops the stream after this many requests; 0 runs until
	// the context ends.
	Count int
	// Wait is how long the replies of the last requests are waited for
	// once sending stops.
	Wait time.Duration
}

// Stats is what a stream saw.
type Stats struct {
	Dst      netip.Addr
	Sent     int
	Received int
	// Elapsed is from the first send to the last.
	Elapsed time.Duration
	// LongestGap is the longest time between two replies in a row (from
	// the first send to the first reply for the first): how long the
	// path was broken at worst.
	LongestGap time.Duration
	MaxRTT     time.Duration
	// Late counts requests sent more than one interval after their
	// scheduled time (the process was not scheduled in time).
	Late int
}

// Rate is the requests sent per second.
func (s Stats) Rate() float64 {
	if s.Elapsed <= 0 || s.Sent < 2 {
		return 0
	}
	return float64(s.Sent-1) / s.Elapsed.Seconds()
}

// Summary is a ping-like summary: the "N packets transmitted, M received"
// line scripts read from ping, then the stream's own figures.
func (s Stats) Summary() string {
	loss := 0.0
	if s.Sent > 0 {
		loss = 100 * float64(s.Sent-s.Received) / float64(s.Sent)
	}
	return fmt.Sprintf("--- %s ping stream ---\n%d packets transmitted, %d received, %.1f%% packet loss, time %dms\nrate %.1f/s, longest gap between replies %s, rtt max %s, late sends %d\n",
		s.Dst, s.Sent, s.Received, loss, s.Elapsed.Milliseconds(), s.Rate(), s.LongestGap.Round(time.Microsecond), s.MaxRTT.Round(time.Microsecond), s.Late)
}

// Listen opens a raw ICMP socket of the family of dst in the calling
// thread's network namespace (root only; the socket stays in that
// namespace whatever thread uses it later).
func Listen(dst netip.Addr) (*icmp.PacketConn, error) {
	network, laddr := "ip4:icmp", "0.0.0.0"
	if dst.Unmap().Is6() {
		network, laddr = "ip6:ipv6-icmp", "::"
	}
	c, err := icmp.ListenPacket(network, laddr)
	if err != nil {
		return nil, fmt.Errorf("open a raw ICMP socket (%s): %w", network, err)
	}
	return c, nil
}

// payload: the request's index, then the stream's token, so that a
// reply is matched to its request whatever else the raw socket sees.
const payloadLen = 8 + 16

// Run sends cfg.Dst an echo request every cfg.Interval on conn (from
// Listen) until cfg.Count are sent or ctx ends, then waits up to cfg.Wait
// for the outstanding replies. It closes conn.
func Run(ctx context.Context, conn *icmp.PacketConn, cfg Config) (Stats, error) {
	defer conn.Close()
	if cfg.Interval <= 0 {
		return Stats{}, fmt.Errorf("interval %s: must be positive", cfg.Interval)
	}
	dst := cfg.Dst.Unmap()
	if !dst.IsValid() {
		return Stats{}, errors.New("no destination")
	}
	var token [16]byte
	_, _ = rand.Read(token[:])
	id := int(binary.BigEndian.Uint16(token[:2]))
	typ, replyType, proto := icmp.Type(ipv4.ICMPTypeEcho), icmp.Type(ipv4.ICMPTypeEchoReply), 1
	if dst.Is6() {
		typ, replyType, proto = ipv6.ICMPTypeEchoRequest, ipv6.ICMPTypeEchoReply, 58
	}
	st := Stats{Dst: dst}
	var mu sync.Mutex
	var sentAt []time.Time
	received := map[int]bool{}
	var first, lastSend, lastReply time.Time
	want := -1 // the number sent, once sending stopped

	recvDone := make(chan error, 1)
	go func() {
		buf := make([]byte, 1500)
		for {
			n, from, err := conn.ReadFrom(buf)
			if err != nil {
				if errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, net.ErrClosed) {
					err = nil
				}
				recvDone <- err
				return
			}
			now := time.Now()
			a, ok := from.(*net.IPAddr)
			if !ok {
				continue
			}
			if ip, _ := netip.AddrFromSlice(a.IP); ip.Unmap() != dst {
				continue
			}
			m, err := icmp.ParseMessage(proto, buf[:n])
			if err != nil || m.Type != replyType {
				continue
			}
			echo, ok := m.Body.(*icmp.Echo)
			if !ok || echo.ID != id || len(echo.Data) != payloadLen || [16]byte(echo.Data[8:]) != token {
				continue
			}
			i := int(binary.BigEndian.Uint64(echo.Data[:8]))
			mu.Lock()
			if i < len(sentAt) && !received[i] {
				received[i] = true
				st.Received++
				st.MaxRTT = max(st.MaxRTT, now.Sub(sentAt[i]))
				prev := lastReply
				if prev.IsZero() {
					prev = first
				}
				st.LongestGap = max(st.LongestGap, now.Sub(prev))
				lastReply = now
			}
			done := st.Received == want
			mu.Unlock()
			if done {
				recvDone <- nil
				return
			}
		}
	}()

	dstAddr := &net.IPAddr{IP: dst.AsSlice()}
	timer := time.NewTimer(0)
	defer timer.Stop()
	var sendErr error
	start := time.Now()
send:
	for i := 0; cfg.Count == 0 || i < cfg.Count; i++ {
		due := start.Add(time.Duration(i) * cfg.Interval)
		if wait := time.Until(due); wait > 0 {
			timer.Reset(wait)
			select {
			case <-ctx.Done():
				break send
			case <-timer.C:
			}
		} else if ctx.Err() != nil {
			break
		}
		payload := make([]byte, payloadLen)
		binary.BigEndian.PutUint64(payload, uint64(i))
		copy(payload[8:], token[:])
		msg, err := (&icmp.Message{Type: typ, Body: &icmp.Echo{ID: id, Seq: i & 0xffff, Data: payload}}).Marshal(nil)
		if err != nil {
			sendErr = fmt.Errorf("build echo request: %w", err)
			break
		}
		now := time.Now()
		mu.Lock()
		if i == 0 {
			first = now
		}
		if now.Sub(due) > cfg.Interval {
			st.Late++
		}
		sentAt = append(sentAt, now)
		st.Sent++
		st.Elapsed = now.Sub(first)
		lastSend = now
		mu.Unlock()
		// A send refused by the kernel (no route while a path is being
		// rebuilt) is a lost request, not the end of the stream.
		_, _ = conn.WriteTo(msg, dstAddr)
	}
	mu.Lock()
	want = st.Sent
	all := st.Received == st.Sent
	mu.Unlock()
	if all {
		_ = conn.SetReadDeadline(time.Now())
	} else {
		_ = conn.SetReadDeadline(time.Now().Add(cfg.Wait))
	}
	recvErr := <-recvDone
	mu.Lock()
	defer mu.Unlock()
	if st.Received < st.Sent {
		// Replies that stopped before the end: the outage runs at least
		// to the last send.
		prev := lastReply
		if prev.IsZero() {
			prev = first
		}
		st.LongestGap = max(st.LongestGap, lastSend.Sub(prev))
	}
	return st, errors.Join(sendErr, recvErr)
}
