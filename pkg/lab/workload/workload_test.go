package workload

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

func TestParsePorts(t *testing.T) {
	got, err := ParsePorts(" 80,81 ,,53")
	if err != nil || FormatPorts(got) != "80,81,53" {
		t.Fatalf("ParsePorts = %v, %v", got, err)
	}
	for _, bad := range []string{"0", "65536", "x", "80,-1"} {
		if _, err := ParsePorts(bad); err == nil {
			t.Errorf("ParsePorts(%q) accepted", bad)
		}
	}
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// TestServerAndProbe runs the workload on loopback (no namespaces needed)
// and probes it over TCP, UDP and HTTP.
func TestServerAndProbe(t *testing.T) {
	port := freePort(t)
	s := &Server{Name: "web-1", TCPPorts: []int{port}, UDPPorts: []int{port}, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, func() { close(ready) }) }()
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("serve: %v", err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	for _, udp := range []bool{false, true} {
		got, err := Probe(context.Background(), addr, udp, 2*time.Second)
		if err != nil || got != "web-1" {
			t.Errorf("probe udp=%v: %q, %v", udp, got, err)
		}
	}
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(c, "GET / HTTP/1.0\r\nHost: x\r\n\r\n")
	resp, _ := io.ReadAll(bufio.NewReader(c))
	c.Close()
	if !strings.HasPrefix(string(resp), "HTTP/1.0 200 OK") || !strings.HasSuffix(string(resp), "\r\n\r\nweb-1\n") {
		t.Errorf("HTTP/1.0 answer %q", resp)
	}
	// HTTP/1.1 keeps the connection: three requests (one with a body, one
	// HEAD) on one, then "Connection: close" ends it.
	c, err = net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\nPOST /p HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhiHEAD / HTTP/1.1\r\nHost: x\r\n\r\n")
	br := bufio.NewReader(c)
	for i, method := range []string{"GET", "POST", "HEAD"} {
		r, err := http.ReadResponse(br, &http.Request{Method: method})
		if err != nil {
			t.Fatalf("kept-alive answer %d: %v", i, err)
		}
		b, _ := io.ReadAll(r.Body)
		r.Body.Close()
		want := "web-1\n"
		if method == "HEAD" {
			want = ""
		}
		if r.StatusCode != 200 || r.ProtoMinor != 1 || r.Close || string(b) != want {
			t.Errorf("kept-alive %s: %s %s close=%v body %q", method, r.Proto, r.Status, r.Close, b)
		}
	}
	fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
	if rest, _ := io.ReadAll(br); !strings.HasSuffix(string(rest), "Connection: close\r\n\r\nweb-1\n") {
		t.Errorf("answer to Connection: close %q, want the answer then the close", rest)
	}
	c.Close()
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// Nothing listens any more: refused over TCP.
	if _, err := Probe(context.Background(), addr, false, time.Second); err == nil {
		t.Error("probe of a closed port answered")
	}
}
