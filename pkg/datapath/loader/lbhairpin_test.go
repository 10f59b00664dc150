package loader

import (
	"bytes"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/tendril-net/tendril/pkg/datapath/maps"
)

// TestPrivilegedServiceHairpin: a pod reaching itself through a ClusterIP
// (its own address the only backend) per packet, over IPv4 and IPv6: its
// SYN comes back into it (redirect, the pod's MAC) from the hairpin
// address (169.254.42.1, 100::a9fe:2a01) to its own backend port, although
// its ingress is enforced with no rule (a pod's traffic with itself is not
// its policy's business); its SYN-ACK to the hairpin address comes back
// into it from the frontend, to its own address; checksums stay valid;
// later packets of the flow go the same way. A packet to the hairpin
// address that answers no translated flow is not rewritten. The IPv6
// service's IDs are beyond 16 bits (conntrack v2 carries them).
func TestPrivilegedServiceHairpin(t *testing.T) {
	n := newTestNode(t)
	n.addDirectEndpoints()
	from, _ := n.l.Programs()
	for _, c := range []struct {
		name         string
		pod          netip.Addr
		fe           netip.AddrPort
		hairpin      netip.Addr
		svc          maps.Service
		firstBackend uint32
	}{
		{"IPv4", podB, netip.MustParseAddrPort("10.96.0.60:80"), netip.MustParseAddr("169.254.42.1"), maps.Service{ID: 1, RevNATID: 1}, 1},
		{"IPv6", podB6, netip.MustParseAddrPort("[fd00:96::60]:80"), netip.MustParseAddr("100::a9fe:2a01"),
			maps.Service{ID: 0x12345, RevNATID: 0x23456}, 0x34567},
	} {
		// No subtests: BPF_PROG_TEST_RUN resolves interfaces in the
		// namespace of this locked goroutine.
		func() {
			fe := c.fe
			self := netip.AddrPortFrom(c.pod, 8080)
			hairpin := netip.AddrPortFrom(c.hairpin, 40000)
			n.lbService(tcpFE(fe.Addr().String(), fe.Port()), c.svc, c.firstBackend, self)

			check := func(what string, verdict uint32, out []byte, wantSrc, wantDst netip.AddrPort) {
				t.Helper()
				what = c.name + ": " + what
				if verdict != actRedirect {
					t.Fatalf("%s = %d, want redirect back into the pod", what, verdict)
				}
				if src, dst := frameTuple(out); src != wantSrc || dst != wantDst {
					t.Errorf("%s: %s -> %s, want %s -> %s", what, src, dst, wantSrc, wantDst)
				}
				if !bytes.Equal(out[0:6], macB) || !bytes.Equal(out[6:12], hostMACB) {
					t.Errorf("%s: MACs %x -> %x, want the pod's", what, out[6:12], out[0:6])
				}
				checkChecksums(t, what, out)
			}
			verdict, out := n.runOut(from, n.ifidx2, withL4Checksum(packet(c.pod, fe.Addr(), l4{proto: 6, sport: 40000, dport: 80, tcpFlags: 0x02})))
			check("SYN to its own service", verdict, out, hairpin, self)
			verdict, out = n.runOut(from, n.ifidx2, withL4Checksum(packet(c.pod, hairpin.Addr(), l4{proto: 6, sport: 8080, dport: 40000, tcpFlags: 0x12})))
			check("SYN-ACK to the hairpin address", verdict, out, fe, netip.AddrPortFrom(c.pod, 40000))
			verdict, out = n.runOut(from, n.ifidx2, withL4Checksum(packet(c.pod, fe.Addr(), l4{proto: 6, sport: 40000, dport: 80, tcpFlags: 0x10, payload: []byte("data")})))
			check("established packet", verdict, out, hairpin, self)
			verdict, out = n.runOut(from, n.ifidx2, withL4Checksum(packet(c.pod, hairpin.Addr(), l4{proto: 6, sport: 8080, dport: 40000, tcpFlags: 0x10, payload: []byte("reply")})))
			check("established reply", verdict, out, fe, netip.AddrPortFrom(c.pod, 40000))
			var flow []maps.CTEntry
			for _, e := range n.ctEntries(2) {
				if e.Src == c.hairpin && e.Dst == c.pod {
					flow = append(flow, e)
				}
			}
			if len(flow) != 1 || flow[0].RevNAT != c.svc.RevNATID || flow[0].SrcPort != 40000 || flow[0].DstPort != 8080 {
				t.Errorf("%s: conntrack of the hairpin flow: %+v, want one entry with reverse NAT %d", c.name, flow, c.svc.RevNATID)
			}

			// No flow behind it: left to the host as any packet to a
			// non-local address.
			verdict, out = n.runOut(from, n.ifidx2, withL4Checksum(packet(c.pod, hairpin.Addr(), l4{proto: 6, sport: 8080, dport: 41000, tcpFlags: 0x12})))
			if _, dst := frameTuple(out); verdict == actRedirect || dst != netip.AddrPortFrom(hairpin.Addr(), 41000) {
				t.Errorf("%s: packet to the hairpin address of no flow: verdict %d to %s, want it untouched", c.name, verdict, dst)
			}
		}()
	}
}

// TestPrivilegedServiceHairpinRealTraffic: a real pod's TCP connections
// to ClusterIPs whose only backend it is, over IPv4 and IPv6, per packet
// (no socket LB): each connects, echoes, and its server sees the hairpin
// address as the peer while the client's socket names the frontend.
func TestPrivilegedServiceHairpinRealTraffic(t *testing.T) {
	lab := newPodLab(t)
	pod := lab.addPod("a", 0)
	l := lab.loader()
	if err := l.AttachEndpoint(pod.endpoint(1, 5001, true)); err != nil {
		t.Fatal(err)
	}
	var ln net.Listener
	if err := pod.Do(func() (err error) {
		ln, err = net.Listen("tcp", "[::]:8080")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	peers := make(chan netip.Addr, 1)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			peers <- c.RemoteAddr().(*net.TCPAddr).AddrPort().Addr().Unmap()
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	lb := l.Maps().LB
	for i, c := range []struct {
		fe, backend netip.AddrPort
		hairpin     netip.Addr
	}{
		{netip.MustParseAddrPort("10.96.0.61:80"), netip.AddrPortFrom(pod.IPv4, 8080), netip.MustParseAddr("169.254.42.1")},
		{netip.MustParseAddrPort("[fd00:96::61]:80"), netip.AddrPortFrom(pod.IPv6, 8080), netip.MustParseAddr("100::a9fe:2a01")},
	} {
		id := uint32(70000 + i)
		if err := lb.BackendMap().Upsert(id, maps.Backend{Addr: c.backend.Addr(), Port: c.backend.Port()}); err != nil {
			t.Fatal(err)
		}
		if err := lb.ApplyService(tcpFE(c.fe.Addr().String(), c.fe.Port()), maps.Service{ID: id, RevNATID: id}, []uint32{id}, 0); err != nil {
			t.Fatal(err)
		}
		var conn net.Conn
		if err := pod.Do(func() (err error) {
			conn, err = net.DialTimeout("tcp", c.fe.String(), 2*time.Second)
			return err
		}); err != nil {
			t.Fatalf("connect to its own service %s: %v", c.fe, err)
		}
		if got := <-peers; got != c.hairpin {
			t.Errorf("%s: server saw %s, want the hairpin address %s", c.fe, got, c.hairpin)
		}
		if got := conn.RemoteAddr().(*net.TCPAddr).AddrPort(); got != c.fe {
			t.Errorf("client's peer %s, want the frontend %s", got, c.fe)
		}
		_ = conn.SetDeadline(time.Now().Add(2 * time.Second))
		msg := []byte("hairpin " + c.fe.String())
		back := make([]byte, len(msg))
		if _, err := conn.Write(msg); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(conn, back); err != nil || !bytes.Equal(back, msg) {
			t.Errorf("%s: echo %q, %v", c.fe, back, err)
		}
		conn.Close()
	}
}
