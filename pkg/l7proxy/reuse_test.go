package l7proxy

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tendril-net/tendril/pkg/policy/api"
)

// oneShotUpstream answers one request per connection and then closes it
// without saying so (no "Connection: close"), as a server does whose idle
// timeout ends a kept-alive connection between two requests. It counts
// the requests it read.
func oneShotUpstream(t *testing.T) (netip.AddrPort, *atomic.Int32) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	var reqs atomic.Int32
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				req, err := http.ReadRequest(bufio.NewReader(c))
				if err != nil {
					return
				}
				reqs.Add(1)
				_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: "+strconv.Itoa(len(req.Method))+"\r\n\r\n"+req.Method)
			}()
		}
	}()
	return netip.MustParseAddrPort(ln.Addr().String()), &reqs
}

// TestHTTPProxyRedialsAClosedUpstream: when the kept-alive upstream
// connection was closed by the server between two requests, the next
// GET goes out on a new connection and the client's connection stays
// up; a POST, which the upstream may have acted on, is not sent twice:
// the client's connection is closed instead.
func TestHTTPProxyRedialsAClosedUpstream(t *testing.T) {
	up, reqs := oneShotUpstream(t)
	p := NewHTTP(Config{Rules: func(Source, netip.AddrPort) []api.PortRuleHTTP { return []api.PortRuleHTTP{{}} }})
	client, server := net.Pipe()
	go p.ServeConn(server, Source{EndpointID: 7}, up)
	defer client.Close()
	_ = client.SetDeadline(time.Now().Add(30 * time.Second))
	br := bufio.NewReader(client)
	get := func(method string) (*http.Response, error) {
		if _, err := io.WriteString(client, method+" / HTTP/1.1\r\nHost: up\r\n\r\n"); err != nil {
			return nil, err
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			return nil, err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp, nil
	}
	for i := 0; i < 3; i++ {
		resp, err := get("GET")
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("GET %d on one client connection, the upstream closing after each: %v %v", i, resp, err)
		}
	}
	if n := reqs.Load(); n != 3 {
		t.Fatalf("the upstream read %d requests, want 3", n)
	}
	// The POST goes out on the connection the upstream closed already:
	// it fails, and is not repeated.
	if resp, err := get("POST"); err == nil {
		t.Fatalf("POST on a closed upstream connection answered %v", resp)
	}
	if n := reqs.Load(); n != 3 {
		t.Fatalf("the upstream read %d requests after the POST, want 3 (not resent)", n)
	}
}
