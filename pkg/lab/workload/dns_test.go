package workload

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/netip"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

func TestParseResolvConf(t *testing.T) {
	c, err := ParseResolvConf(strings.NewReader(`# a pod's
nameserver 10.96.0.10
domain ignored.example
search demo.svc.cluster.local svc.cluster.local cluster.local
options ndots:5 timeout:1
`))
	if err != nil {
		t.Fatal(err)
	}
	want := DNSConfig{Nameservers: []string{"10.96.0.10"}, Search: []string{"demo.svc.cluster.local", "svc.cluster.local", "cluster.local"}, Ndots: 5}
	if !reflect.DeepEqual(c, want) {
		t.Fatalf("got %+v, want %+v", c, want)
	}
	for _, bad := range []string{"search x\n", "nameserver not-an-ip\n", "nameserver 10.0.0.1\noptions ndots:x\n"} {
		if _, err := ParseResolvConf(strings.NewReader(bad)); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

func TestCandidates(t *testing.T) {
	c := DNSConfig{Nameservers: []string{"10.96.0.10"}, Search: []string{"demo.svc.cluster.local", "svc.cluster.local", "cluster.local"}, Ndots: 5}
	got := c.Candidates("backend")
	want := []string{"backend.demo.svc.cluster.local.", "backend.svc.cluster.local.", "backend.cluster.local.", "backend."}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("short name: %v, want %v", got, want)
	}
	if got := c.Candidates("kubernetes.default.svc.cluster.local."); !reflect.DeepEqual(got, []string{"kubernetes.default.svc.cluster.local."}) {
		t.Errorf("rooted name: %v", got)
	}
	c.Ndots = 1
	if got := c.Candidates("backend.demo"); got[0] != "backend.demo." {
		t.Errorf("ndots:1, one dot: tried as given first? %v", got)
	}
}

// testDNSServer answers A queries on loopback UDP and TCP from a table;
// names in truncate get an empty truncated UDP reply (the client must
// retry over TCP). It counts queries per transport.
type testDNSServer struct {
	records  map[string]string
	truncate map[string]bool
	udp, tcp atomic.Int32
}

func (s *testDNSServer) reply(q []byte, overUDP bool) []byte {
	var m dnsmessage.Message
	if err := m.Unpack(q); err != nil || len(m.Questions) != 1 {
		return nil
	}
	name := m.Questions[0].Name.String()
	resp := dnsmessage.Message{Header: dnsmessage.Header{ID: m.ID, Response: true, Authoritative: true}, Questions: m.Questions}
	switch ip, ok := s.records[name]; {
	case overUDP && s.truncate[name]:
		resp.Truncated = true
	case !ok:
		resp.RCode = dnsmessage.RCodeNameError
	default:
		resp.Answers = []dnsmessage.Resource{{
			Header: dnsmessage.ResourceHeader{Name: m.Questions[0].Name, Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET, TTL: 5},
			Body:   &dnsmessage.AResource{A: netip.MustParseAddr(ip).As4()},
		}}
	}
	b, _ := resp.Pack()
	return b
}

// start listens on one port for both transports and returns it.
func (s *testDNSServer) start(t *testing.T) int {
	var pc net.PacketConn
	var ln net.Listener
	var port int
	// A free UDP port whose TCP twin is free too: a few tries.
	for try := 0; ln == nil; try++ {
		var err error
		if pc, err = net.ListenPacket("udp", "127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
		port = pc.LocalAddr().(*net.UDPAddr).Port
		if ln, err = net.Listen("tcp", pc.LocalAddr().String()); err != nil {
			pc.Close()
			if try == 20 {
				t.Fatalf("no port free for both UDP and TCP: %v", err)
			}
		}
	}
	t.Cleanup(func() { pc.Close(); ln.Close() })
	go func() {
		buf := make([]byte, 512)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			s.udp.Add(1)
			_, _ = pc.WriteTo(s.reply(buf[:n], true), from)
		}
	}()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.tcp.Add(1)
			var size [2]byte
			if _, err := io.ReadFull(c, size[:]); err == nil {
				q := make([]byte, binary.BigEndian.Uint16(size[:]))
				if _, err := io.ReadFull(c, q); err == nil {
					r := s.reply(q, false)
					_, _ = c.Write(append(binary.BigEndian.AppendUint16(nil, uint16(len(r))), r...))
				}
			}
			c.Close()
		}
	}()
	return port
}

func TestResolverSearchListAndTransports(t *testing.T) {
	srv := &testDNSServer{
		records: map[string]string{
			"backend.demo.svc.cluster.local.":       "10.96.5.5",
			"kubernetes.default.svc.cluster.local.": "10.96.0.1",
			"big.demo.svc.cluster.local.":           "10.96.6.6",
		},
		truncate: map[string]bool{"big.demo.svc.cluster.local.": true},
	}
	port := srv.start(t)
	conf := DNSConfig{Nameservers: []string{"127.0.0.1"}, Search: []string{"demo.svc.cluster.local", "svc.cluster.local", "cluster.local"}, Ndots: 5}
	ctx := context.Background()

	r := &Resolver{Config: conf, Port: port, Timeout: 2 * time.Second}
	addrs, fqdn, err := r.LookupIPv4(ctx, "backend")
	if err != nil || fqdn != "backend.demo.svc.cluster.local." || len(addrs) != 1 || addrs[0].String() != "10.96.5.5" {
		t.Fatalf("backend: %v %q %v", addrs, fqdn, err)
	}
	// The pod's own namespace first, then svc.cluster.local.
	addrs, fqdn, err = r.LookupIPv4(ctx, "kubernetes.default")
	if err != nil || fqdn != "kubernetes.default.svc.cluster.local." || addrs[0].String() != "10.96.0.1" {
		t.Fatalf("kubernetes.default: %v %q %v", addrs, fqdn, err)
	}
	if srv.tcp.Load() != 0 {
		t.Fatalf("UDP resolver used TCP %d times", srv.tcp.Load())
	}
	// A truncated UDP answer is asked again over TCP.
	if addrs, _, err := r.LookupIPv4(ctx, "big"); err != nil || addrs[0].String() != "10.96.6.6" || srv.tcp.Load() != 1 {
		t.Fatalf("truncated: %v %v (TCP queries %d)", addrs, err, srv.tcp.Load())
	}
	// TCP only.
	udpBefore := srv.udp.Load()
	rt := &Resolver{Config: conf, Port: port, TCP: true, Timeout: 2 * time.Second}
	if addrs, _, err := rt.LookupIPv4(ctx, "backend"); err != nil || addrs[0].String() != "10.96.5.5" {
		t.Fatalf("over TCP: %v %v", addrs, err)
	}
	if srv.udp.Load() != udpBefore {
		t.Fatalf("TCP resolver sent %d UDP queries", srv.udp.Load()-udpBefore)
	}
	// Every candidate answered NXDOMAIN: no such host, naming the tries.
	_, _, err = r.LookupIPv4(ctx, "missing")
	if !errors.Is(err, ErrNoSuchHost) || !strings.Contains(err.Error(), "missing.svc.cluster.local.") {
		t.Fatalf("missing: %v", err)
	}
}

func TestResolverNoServer(t *testing.T) {
	// A UDP port with nothing behind it: refused or no answer, never an address.
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := pc.LocalAddr().(*net.UDPAddr).Port
	pc.Close()
	r := &Resolver{Config: DNSConfig{Nameservers: []string{"127.0.0.1"}, Ndots: 1}, Port: port, Timeout: 500 * time.Millisecond}
	if addrs, _, err := r.LookupIPv4(context.Background(), "x.example."); err == nil || errors.Is(err, ErrNoSuchHost) {
		t.Fatalf("no server: %v, %v", addrs, err)
	}
}
