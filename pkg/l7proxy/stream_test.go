package l7proxy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"testing"
	"time"

	"github.com/tendril-net/tendril/pkg/policy/api"
)

// streamProxy serves the proxy, allowing every request, in front of
// handler; it returns a client connection to the proxy.
func streamProxy(t *testing.T, handler http.HandlerFunc) net.Conn {
	t.Helper()
	up := httptest.NewServer(handler)
	t.Cleanup(up.Close)
	upAddr := netip.MustParseAddrPort(up.Listener.Addr().String())
	p := NewHTTP(Config{Rules: func(Source, netip.AddrPort) []api.PortRuleHTTP { return []api.PortRuleHTTP{{}} }})
	client, server := net.Pipe()
	go p.ServeConn(server, Source{EndpointID: 7}, upAddr)
	t.Cleanup(func() { client.Close() })
	// Fail rather than hang when a piece is held back.
	_ = client.SetDeadline(time.Now().Add(30 * time.Second))
	return client
}

// TestHTTPProxyStreamsRequestBody: each piece of a chunked upload reaches
// the upstream before the client sends the next one (the client waits for
// the upstream to have read it): the proxy holds no part of a request body
// back waiting for more.
func TestHTTPProxyStreamsRequestBody(t *testing.T) {
	got := make(chan string)
	c := streamProxy(t, func(w http.ResponseWriter, r *http.Request) {
		br := bufio.NewReader(r.Body)
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				break
			}
			got <- line
		}
		_, _ = io.WriteString(w, "done")
	})
	if _, err := io.WriteString(c, "POST /upload HTTP/1.1\r\nHost: up\r\nTransfer-Encoding: chunked\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		piece := fmt.Sprintf("piece %d\n", i)
		if _, err := fmt.Fprintf(c, "%x\r\n%s\r\n", len(piece), piece); err != nil {
			t.Fatal(err)
		}
		select {
		case line := <-got:
			if line != piece {
				t.Fatalf("upstream read %q, want %q", line, piece)
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("piece %d of the upload did not reach the upstream before the next was sent", i)
		}
	}
	if _, err := io.WriteString(c, "0\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || string(b) != "done" {
		t.Fatalf("answer %d %q", resp.StatusCode, b)
	}
}

// TestHTTPProxyStreamsResponseBody: each piece of a streamed answer
// reaches the client before the upstream writes the next one (it waits
// for the client to have read it), and a second request follows on the
// same connection.
func TestHTTPProxyStreamsResponseBody(t *testing.T) {
	next := make(chan struct{})
	c := streamProxy(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/events" {
			_, _ = io.WriteString(w, "plain")
			return
		}
		for i := 0; i < 3; i++ {
			fmt.Fprintf(w, "event %d\n", i)
			w.(http.Flusher).Flush()
			select {
			case <-next:
			case <-time.After(20 * time.Second):
				return
			}
		}
	})
	br := bufio.NewReader(c)
	if _, err := io.WriteString(c, "GET /events HTTP/1.1\r\nHost: up\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	body := bufio.NewReader(resp.Body)
	for i := 0; i < 3; i++ {
		line, err := body.ReadString('\n')
		if want := fmt.Sprintf("event %d\n", i); err != nil || line != want {
			t.Fatalf("event %d: %q %v", i, line, err)
		}
		next <- struct{}{}
	}
	if _, err := io.Copy(io.Discard, body); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if _, err := io.WriteString(c, "GET /again HTTP/1.1\r\nHost: up\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err = http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	if string(b) != "plain" {
		t.Fatalf("second request on the connection: %d %q", resp.StatusCode, b)
	}
}
