package l7proxy

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	flowpb "github.com/cilium/cilium/api/v1/flow"

	"github.com/tendril-net/tendril/pkg/policy/api"
)

// A real upstream and the proxy on loopback: GET allowed, POST denied
// with 403 and a dropped flow, every request of the client on one kept-
// alive connection (to the proxy and from it to the upstream), a large
// chunked body streamed through.
func TestHTTPProxyAllowsDeniesKeepsAlive(t *testing.T) {
	var upConns atomic.Int32
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/stream" {
			chunk := strings.Repeat("x", 64<<10)
			for i := 0; i < 16; i++ {
				_, _ = io.WriteString(w, chunk)
				w.(http.Flusher).Flush()
			}
			return
		}
		_, _ = io.WriteString(w, "ok "+r.Method+" "+r.URL.Path)
	}))
	up.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			upConns.Add(1)
		}
	}
	up.Start()
	defer up.Close()
	upAddr := netip.MustParseAddrPort(up.Listener.Addr().String())

	var mu sync.Mutex
	var flows []*flowpb.Flow
	p := NewHTTP(Config{
		Rules: func(src Source, dst netip.AddrPort) []api.PortRuleHTTP {
			if src.EndpointID != 7 || dst != upAddr {
				return nil
			}
			return []api.PortRuleHTTP{{Method: "GET", Path: "/healthz|/stream"}}
		},
		Flow: func(f *flowpb.Flow) { mu.Lock(); flows = append(flows, f); mu.Unlock() },
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var clientConns atomic.Int32
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			clientConns.Add(1)
			// In the node, the listener names the source from the
			// endpoint table and the original destination from the socket.
			go p.ServeConn(c, Source{EndpointID: 7, Identity: 4242}, upAddr)
		}
	}()
	client := &http.Client{Transport: &http.Transport{MaxConnsPerHost: 1, MaxIdleConnsPerHost: 1}}
	base := "http://" + ln.Addr().String()
	do := func(method, path string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, base+path, strings.NewReader("body"))
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := do("GET", "/healthz"); code != 200 || body != "ok GET /healthz" {
		t.Fatalf("GET: %d %q", code, body)
	}
	if code, _ := do("POST", "/healthz"); code != 403 {
		t.Fatalf("POST: %d, want 403", code)
	}
	if code, _ := do("GET", "/admin"); code != 403 {
		t.Fatalf("GET /admin: %d, want 403", code)
	}
	if code, body := do("GET", "/stream"); code != 200 || len(body) != 16*64<<10 {
		t.Fatalf("stream: %d, %d bytes", code, len(body))
	}
	if code, _ := do("GET", "/healthz"); code != 200 {
		t.Fatalf("GET after the denials: %d", code)
	}
	if n := clientConns.Load(); n != 1 {
		t.Errorf("client connections to the proxy: %d, want 1 (keep-alive)", n)
	}
	if n := upConns.Load(); n != 1 {
		t.Errorf("proxy connections to the upstream: %d, want 1", n)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(flows) != 5 {
		t.Fatalf("flows: %d, want 5", len(flows))
	}
	deny := flows[1]
	if deny.Verdict != flowpb.Verdict_DROPPED || deny.L7.GetHttp().GetCode() != 403 || deny.L7.GetHttp().GetMethod() != "POST" || deny.Source.GetIdentity() != 4242 || !strings.Contains(deny.Summary, "no http rule") {
		t.Errorf("deny flow: %v", deny)
	}
	if f := flows[0]; f.Verdict != flowpb.Verdict_FORWARDED || f.L7.GetHttp().GetCode() != 200 || !strings.Contains(f.Summary, `rule 0 {method: "GET"`) || !strings.HasSuffix(f.L7.GetHttp().GetUrl(), "/healthz") {
		t.Errorf("allow flow: %v", f)
	}
}

// TestHTTPProxyBoundsRequestHeaders: a client that sends a header line
// longer than MaxHeaderBytes gets 431 and its connection closed, without
// the proxy reading (and holding) all of it; a request within the bound
// is still served on a fresh connection.
func TestHTTPProxyBoundsRequestHeaders(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "ok")
	}))
	defer up.Close()
	upAddr := netip.MustParseAddrPort(up.Listener.Addr().String())
	p := NewHTTP(Config{Rules: func(Source, netip.AddrPort) []api.PortRuleHTTP {
		return []api.PortRuleHTTP{{Method: "GET"}}
	}})
	serve := func() net.Conn {
		client, server := net.Pipe()
		go p.ServeConn(server, Source{EndpointID: 7}, upAddr)
		return client
	}
	c := serve()
	defer c.Close()
	// Before the bound, the proxy read the whole line and then waited for
	// the end of the headers: fail rather than hang.
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	// Written in the background: the proxy must answer and close before
	// the whole (8 MiB) line is read.
	written := make(chan int64, 1)
	go func() {
		n, _ := io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\nX-Big: ")
		m, _ := io.Copy(c, io.LimitReader(repeatReader('a'), 8<<20))
		written <- int64(n) + m
	}()
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("no answer to an oversized header: %v", err)
	}
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("status %d, want 431", resp.StatusCode)
	}
	c.Close()
	if n := <-written; n >= 8<<20 {
		t.Errorf("the proxy read the whole %d-byte header", n)
	}

	ok := serve()
	defer ok.Close()
	if _, err := io.WriteString(ok, "GET / HTTP/1.1\r\nHost: x\r\nX-Fine: "+strings.Repeat("b", 4096)+"\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err = http.ReadResponse(bufio.NewReader(ok), nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("a request within the bound: %v %v", resp, err)
	}
}

// repeatReader reads b forever.
type repeatReader byte

func (r repeatReader) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = byte(r)
	}
	return len(p), nil
}
