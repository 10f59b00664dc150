// Package tcpproxy forwards loopback TCP connections to one address and
// can cut them all and refuse new ones: a network partition between one
// client (say an agent and etcd) while every other client keeps working.
package tcpproxy

import (
	"io"
	"net"
	"strings"
	"sync"
	"testing"
)

// Proxy forwards to one target until the test ends.
type Proxy struct {
	ln     net.Listener
	target string

	mu     sync.Mutex
	paused bool
	conns  map[net.Conn]struct{}
}

// Start listens on a free loopback port and forwards to target (host:port,
// or a URL such as http://127.0.0.1:2379).
func Start(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if i := strings.Index(target, "://"); i >= 0 {
		target = target[i+3:]
	}
	p := &Proxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	go p.serve()
	t.Cleanup(func() {
		ln.Close()
		p.Pause()
	})
	return p
}

// URL is the proxy's address as http://host:port.
func (p *Proxy) URL() string { return "http://" + p.ln.Addr().String() }

func (p *Proxy) serve() {
	for {
		in, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.paused {
			p.mu.Unlock()
			in.Close()
			continue
		}
		out, err := net.Dial("tcp", p.target)
		if err != nil {
			p.mu.Unlock()
			in.Close()
			continue
		}
		p.conns[in], p.conns[out] = struct{}{}, struct{}{}
		p.mu.Unlock()
		go forward(out, in)
		go forward(in, out)
	}
}

// forward copies until either side ends, then closes both.
func forward(dst, src net.Conn) {
	_, _ = io.Copy(dst, src)
	dst.Close()
	src.Close()
}

// Pause cuts every open connection and refuses new ones until Resume.
func (p *Proxy) Pause() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.paused = true
	for c := range p.conns {
		c.Close()
	}
	clear(p.conns)
}

// Resume accepts connections again.
func (p *Proxy) Resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.paused = false
}
