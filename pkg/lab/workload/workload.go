// Package workload is what runs in a lab pod, and the probe that talks to
// it: a server on the pod's TCP and UDP ports that answers every
// connection or datagram with the pod's name (HTTP requests get an HTTP
// answer, so curl works too), and a client that connects from inside a
// pod's network namespace and reports whether an answer came back.
package workload

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// ProbeRequest is what the probe sends; the server answers any input.
const ProbeRequest = "tendril-probe\n"

// Server answers on the given ports with Name.
type Server struct {
	Name     string
	TCPPorts []int
	UDPPorts []int
	// ReportPeer adds the address and port the answer goes to ("NAME from
	// 172.30.0.11:61001"): the lab's world server says which source a
	// connection came from (a masqueraded pod's node, or the pod).
	ReportPeer bool
	// Address is the address to listen on ("": every address). A UDP
	// answer leaves from the listening address, so a server with several
	// addresses (the lab's world) binds the one it is reached at: the
	// answer must come from where the datagram went, or a NAT on the way
	// back cannot match it.
	Address string
	Log     *slog.Logger
}

// answer is what a peer gets.
func (s *Server) answer(peer net.Addr) string {
	if s.ReportPeer && peer != nil {
		return s.Name + " from " + peer.String() + "\n"
	}
	return s.Name + "\n"
}

// Serve listens on every port, calls ready once all listen, and answers
// until ctx ends.
func (s *Server) Serve(ctx context.Context, ready func()) error {
	var lns []net.Listener
	var pcs []net.PacketConn
	closeAll := func() {
		for _, l := range lns {
			l.Close()
		}
		for _, pc := range pcs {
			pc.Close()
		}
	}
	for _, p := range s.TCPPorts {
		l, err := net.Listen("tcp", net.JoinHostPort(s.Address, strconv.Itoa(p)))
		if err != nil {
			closeAll()
			return fmt.Errorf("listen on tcp/%d: %w", p, err)
		}
		lns = append(lns, l)
	}
	for _, p := range s.UDPPorts {
		pc, err := net.ListenPacket("udp", net.JoinHostPort(s.Address, strconv.Itoa(p)))
		if err != nil {
			closeAll()
			return fmt.Errorf("listen on udp/%d: %w", p, err)
		}
		pcs = append(pcs, pc)
	}
	s.Log.Info("Workload listening", "name", s.Name, "tcp", s.TCPPorts, "udp", s.UDPPorts)
	if ready != nil {
		ready()
	}
	var wg sync.WaitGroup
	for _, l := range lns {
		wg.Add(1)
		go func() { defer wg.Done(); s.acceptLoop(l) }()
	}
	for _, pc := range pcs {
		wg.Add(1)
		go func() { defer wg.Done(); s.udpLoop(pc) }()
	}
	<-ctx.Done()
	closeAll()
	wg.Wait()
	return nil
}

func (s *Server) acceptLoop(l net.Listener) {
	for {
		c, err := l.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			s.Log.Warn("Accept", "error", err)
			time.Sleep(10 * time.Millisecond)
			continue
		}
		go s.answerTCP(c)
	}
}

// answerTCP waits briefly for the client's first line: an HTTP request gets
// an HTTP answer, anything else (or silence) the bare name. An HTTP/1.1
// request that does not ask to close keeps the connection for the next
// one (idle up to tcpIdle), so a kept-alive client or proxy measures
// requests, not connections; HTTP/1.0 and "Connection: close" get one
// answer and the close, as before.
func (s *Server) answerTCP(c net.Conn) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(tcpIdle))
	_ = c.SetReadDeadline(time.Now().Add(time.Second))
	lr := bufio.NewReader(c)
	line, _ := lr.ReadString('\n')
	_ = c.SetReadDeadline(time.Time{})
	if !isHTTPMethod(line) {
		_, _ = c.Write([]byte(s.answer(c.RemoteAddr())))
		return
	}
	// The first line was read off the connection (a probe's line may be
	// all it sends): the request reader starts with it, then what lr
	// buffered beyond it.
	br := bufio.NewReader(io.MultiReader(strings.NewReader(line), lr))
	for {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		_, _ = io.Copy(io.Discard, req.Body)
		_ = req.Body.Close()
		body := s.answer(c.RemoteAddr())
		keep := req.ProtoAtLeast(1, 1) && !req.Close
		head := "HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\nConnection: close\r\n\r\n"
		if keep {
			head = "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n"
		}
		var out bytes.Buffer
		fmt.Fprintf(&out, head, len(body))
		if req.Method != http.MethodHead {
			out.WriteString(body)
		}
		if _, err := c.Write(out.Bytes()); err != nil || !keep {
			return
		}
		_ = c.SetDeadline(time.Now().Add(tcpIdle))
	}
}

// tcpIdle is how long a connection may wait for its next request.
const tcpIdle = 5 * time.Second

// isHTTPMethod reports whether a connection's first bytes start an HTTP
// request.
func isHTTPMethod(first string) bool {
	for _, m := range []string{"GET ", "HEAD ", "POST ", "PUT ", "DELETE ", "OPTIONS ", "PATCH "} {
		if strings.HasPrefix(first, m) {
			return true
		}
	}
	return false
}

func (s *Server) udpLoop(pc net.PacketConn) {
	buf := make([]byte, 2048)
	for {
		_, from, err := pc.ReadFrom(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		_, _ = pc.WriteTo([]byte(s.answer(from)), from)
	}
}

// ParsePorts reads a comma-separated port list ("" is none).
func ParsePorts(list string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(list, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		p, err := strconv.Atoi(f)
		if err != nil || p < 1 || p > 65535 {
			return nil, fmt.Errorf("port %q: must be 1-65535", f)
		}
		out = append(out, p)
	}
	return out, nil
}

// FormatPorts is the inverse of ParsePorts.
func FormatPorts(ports []int) string {
	s := make([]string, len(ports))
	for i, p := range ports {
		s[i] = strconv.Itoa(p)
	}
	return strings.Join(s, ",")
}

// Probe connects to addr (HOST:PORT) over TCP or UDP from the calling
// goroutine's network namespace as it is when Probe runs (callers switch
// a locked thread first) and waits for an answer until timeout. It
// returns the answer, or an error when nothing answered: refused, timed
// out, closed without a word.
func Probe(ctx context.Context, addr string, udp bool, timeout time.Duration) (string, error) {
	return ProbeFrom(ctx, nil, addr, udp, timeout)
}

// ProbeFrom is Probe from a given source address (nil: the kernel picks
// it), as the lab's world client connects from its own address.
func ProbeFrom(ctx context.Context, source net.IP, addr string, udp bool, timeout time.Duration) (string, error) {
	deadline := time.Now().Add(timeout)
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	network := "tcp"
	if udp {
		network = "udp"
	}
	var d net.Dialer
	if source != nil {
		if udp {
			d.LocalAddr = &net.UDPAddr{IP: source}
		} else {
			d.LocalAddr = &net.TCPAddr{IP: source}
		}
	}
	c, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(deadline)
	if !udp {
		if _, err := c.Write([]byte(ProbeRequest)); err != nil {
			return "", err
		}
		buf := make([]byte, 512)
		n, err := c.Read(buf)
		if n == 0 {
			if err == nil {
				err = errors.New("no answer")
			}
			return "", fmt.Errorf("connected, but no answer: %w", err)
		}
		return string(bytes.TrimSpace(buf[:n])), nil
	}
	// UDP: resend now and then, as a first datagram may be lost while the
	// path is being resolved; any answer counts.
	answers := make(chan string, 1)
	readErr := make(chan error, 1)
	go func() {
		buf := make([]byte, 512)
		n, err := c.Read(buf)
		if err != nil {
			readErr <- err
			return
		}
		answers <- string(bytes.TrimSpace(buf[:n]))
	}()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		if _, err := c.Write([]byte(ProbeRequest)); err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				return "", fmt.Errorf("no answer within %s", timeout)
			}
			// ECONNREFUSED from an earlier ICMP port unreachable lands here.
			return "", err
		}
		select {
		case a := <-answers:
			return a, nil
		case err := <-readErr:
			return "", err
		case <-tick.C:
		}
	}
}

// ProbeTLS connects to addr over TCP, completes a TLS handshake that
// verifies the server's certificate against roots for serverName, and
// returns the certificate's common name as the answer (for servers that
// speak only TLS, such as the API server behind the kubernetes Service).
func ProbeTLS(ctx context.Context, addr, serverName string, roots *x509.CertPool, timeout time.Duration) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	d := tls.Dialer{Config: &tls.Config{ServerName: serverName, RootCAs: roots, MinVersion: tls.VersionTLS12}}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return "", err
	}
	defer c.Close()
	certs := c.(*tls.Conn).ConnectionState().PeerCertificates
	if len(certs) == 0 {
		return "", errors.New("TLS handshake without a server certificate")
	}
	return certs[0].Subject.CommonName, nil
}
