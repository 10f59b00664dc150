package workload

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
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
	fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	resp, _ := io.ReadAll(bufio.NewReader(c))
	c.Close()
	if !strings.HasPrefix(string(resp), "HTTP/1.0 200 OK") || !strings.HasSuffix(string(resp), "\r\n\r\nweb-1\n") {
		t.Errorf("HTTP answer %q", resp)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// Nothing listens any more: refused over TCP.
	if _, err := Probe(context.Background(), addr, false, time.Second); err == nil {
		t.Error("probe of a closed port answered")
	}
}
