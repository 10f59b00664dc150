package tunnel

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/tendril-net/tendril/pkg/datapath/bpf"
	"github.com/tendril-net/tendril/pkg/datapath/maps"
)

// Direct server return through Geneve in eBPF (bpf/lib/geneve.h,
// bpf/lib/nodeport_dsr.h): the frontend in a Geneve option, IPv4 and
// IPv6, under BPF_PROG_TEST_RUN on the Geneve node of geneve_test.go.

const (
	dsrNodePort  = 30080
	dsrFEPort    = 30090 // the peer's frontend, in the options it sends
	dsrBackend   = 80
	reasonMalfmd = 13 // REASON_MALFORMED
	worldID      = 2
)

var (
	dsrClient  = netip.MustParseAddr("203.0.113.7")
	dsrClient6 = netip.MustParseAddr("2001:db8::7")
	peerFE6    = netip.MustParseAddr("fd99::2")
)

// dsrFamilies: a family's client, this node's frontend, the remote
// backend, this node's pod (a backend for the peer's requests) and the
// frontend the peer sends in its option.
var dsrFamilies = []struct {
	name                          string
	client, fe, backend, pod, pfe netip.Addr
}{
	{"IPv4", dsrClient, nodeAddr, remotePod, podA, peerNode},
	{"IPv6", dsrClient6, nodeAddr6, remote6, podA6, peerFE6},
}

// newGeneveDSRNode is newGeneveNode in dsr mode (--bpf-lb-mode=dsr: the
// host and overlay programs with LB_DSR), with NodePort frontends at the
// node's addresses (TCP and UDP dsrNodePort) whose backend is the
// remote pod of the family, and pod A's ingress policy admitting the
// world on benchPort (TCP and UDP): the peer's DSR requests.
func newGeneveDSRNode(t *testing.T) *benchNode {
	t.Helper()
	n := newGeneveNode(t)
	n.fromNetdev.Close()
	n.toNetdev.Close()
	n.loadHostLB(t, 1)
	_ = n.overlay.Close()
	var err error
	if n.overlay, err = Load(n.l.MapReplacements(), "", true); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.overlay.Close() })
	r := n.l.MapReplacements()
	if err := SetGeneveBPF(r[bpf.OverlayMapTdrTunnelV1], r[bpf.OverlayMapTdrOverlayCallsV1], n.overlay); err != nil {
		t.Fatal(err)
	}
	m := n.l.Maps()
	lb := m.LB
	id := uint32(1)
	for _, f := range dsrFamilies {
		if err := lb.BackendMap().Upsert(id, maps.Backend{Addr: f.backend, Port: dsrBackend}); err != nil {
			t.Fatal(err)
		}
		for _, proto := range []uint8{6, 17} {
			svc := uint32(len(dsrFamilies))*uint32(proto) + id
			if err := lb.ApplyService(maps.Frontend{Addr: f.fe, Port: dsrNodePort, Proto: proto},
				maps.Service{ID: svc, RevNATID: svc, Flags: maps.SvcFlagExternal}, []uint32{id}, 0); err != nil {
				t.Fatal(err)
			}
		}
		id++
	}
	for _, proto := range []uint8{6, 17} {
		k := maps.PolicyKey{EndpointID: 1, Direction: maps.DirIngress, Identity: worldID, Proto: proto, Port: benchPort, PortPrefixLen: 16}
		if err := m.PolicyMap().Upsert(k, maps.PolicyValue{Cookie: 8}); err != nil {
			t.Fatal(err)
		}
	}
	return n
}

// l4Frame is an Ethernet frame from src:sport to dst:dport: a TCP
// segment with flags, or (proto 17) a UDP datagram, 6 bytes of payload.
func l4Frame(src, dst netip.Addr, proto uint8, flags byte, sport, dport uint16) []byte {
	if proto == 6 {
		f := tcpFrame(src, dst, sport, dport)
		f[len(f)-26+13] = flags
		return f
	}
	udp := make([]byte, 8+6)
	binary.BigEndian.PutUint16(udp[0:], sport)
	binary.BigEndian.PutUint16(udp[2:], dport)
	binary.BigEndian.PutUint16(udp[4:], uint16(len(udp)))
	copy(udp[8:], "bench!")
	return append(ipHeader(src, dst, 17, benchTTL, len(udp)), udp...)
}

// dsrOption is the Geneve DSR option carrying fe: class 0x014b, type 0x81
// (critical), the address, the port, two bytes of padding.
func dsrOption(fe netip.AddrPort) []byte {
	a := fe.Addr().AsSlice()
	o := []byte{0x01, 0x4b, 0x81, byte((len(a) + 4) / 4)}
	o = append(o, a...)
	return binary.BigEndian.AppendUint16(o, fe.Port())
}

// padded is the option with its two bytes of padding.
func padded(o []byte) []byte { return append(o, 0, 0) }

// l3Len is an inner frame's IP header length (no options: 20 or 40).
func l3Len(a netip.Addr) int {
	if a.Is4() {
		return 20
	}
	return 40
}

// innerTuple reads the tuple of an Ethernet frame without IP options.
func innerTuple(f []byte) (netip.AddrPort, netip.AddrPort) {
	ip := f[14:]
	var src, dst netip.Addr
	l4 := 20
	if ip[0]>>4 == 4 {
		src, dst = netip.AddrFrom4([4]byte(ip[12:16])), netip.AddrFrom4([4]byte(ip[16:20]))
	} else {
		src, dst, l4 = netip.AddrFrom16([16]byte(ip[8:24])), netip.AddrFrom16([16]byte(ip[24:40])), 40
	}
	return netip.AddrPortFrom(src, binary.BigEndian.Uint16(ip[l4:])), netip.AddrPortFrom(dst, binary.BigEndian.Uint16(ip[l4+2:]))
}

// TestPrivilegedGeneveDSR: DSR through Geneve in eBPF, IPv4 and IPv6.
//   - Sending (from_netdev, the node a client's NodePort request reaches,
//     the backend on the peer): a TCP SYN and a UDP datagram leave in
//     Geneve to the peer with the DSR option (class 0x014b, type 0x81,
//     the C bit in the header, the frontend's address and port), the
//     world's identity in the VNI, the inner packet DNATed to the backend
//     with the client's source and no IPv4 option; a later TCP segment
//     leaves in Geneve without the option.
//   - Receiving (from_netdev on the peer's Geneve packet to pod A with the
//     option): delivered into the pod; the flow's frontend recorded in
//     the map the reply path reads (tdr_dsr4_v1, tdr_dsr6_v1); pod A's
//     reply leaving the uplink (to_netdev) gets that frontend as source.
func TestPrivilegedGeneveDSR(t *testing.T) {
	n := newGeneveDSRNode(t)
	for _, f := range dsrFamilies {
		fe := netip.AddrPortFrom(f.fe, dsrNodePort)
		wantOpt := padded(dsrOption(fe))
		for _, tc := range []struct {
			name   string
			proto  uint8
			flags  byte
			sport  uint16
			option bool
		}{
			{"TCP SYN", 6, 0x02, 40000, true},
			{"TCP ACK", 6, 0x10, 40000, false},
			{"UDP", 17, 0, 40001, true},
		} {
			what := f.name + " " + tc.name
			in := l4Frame(f.client, f.fe, tc.proto, tc.flags, tc.sport, dsrNodePort)
			v, out := runOut(t, n.fromNetdev, n.uplink, in)
			if v != tcActRedirect {
				t.Fatalf("%s: from_netdev verdict %d, want redirect (%d)", what, v, tcActRedirect)
			}
			olen := 0
			if tc.option {
				olen = len(wantOpt)
			}
			if len(out) != len(in)+geneveEncap+olen {
				t.Fatalf("%s: %d bytes out of %d, want %d (Geneve, %d bytes of options)", what, len(out), len(in), len(in)+geneveEncap+olen, olen)
			}
			ip := out[14:34]
			if dst, _ := netip.AddrFromSlice(ip[16:20]); ip[9] != 17 || dst != peerNode || int(binary.BigEndian.Uint16(ip[2:])) != len(out)-14 || ipv4Checksum(ip) != 0 {
				t.Errorf("%s: outer IPv4 header % x: want UDP to %s, length %d, a valid checksum", what, ip, peerNode, len(out)-14)
			}
			if binary.BigEndian.Uint16(out[36:]) != genevePort || int(binary.BigEndian.Uint16(out[38:])) != len(out)-34 {
				t.Errorf("%s: outer UDP header % x", what, out[34:42])
			}
			g := out[42:50]
			wantFlags := byte(0)
			if tc.option {
				wantFlags = 0x40
			}
			if int(g[0]) != olen/4 || g[1] != wantFlags || binary.BigEndian.Uint32(g[4:])>>8 != worldID {
				t.Errorf("%s: Geneve header % x: want %d words of options, flags %#x, the world's identity %d", what, g, olen/4, wantFlags, worldID)
			}
			if tc.option && !bytes.Equal(out[50:50+olen], wantOpt) {
				t.Errorf("%s: option % x, want % x", what, out[50:50+olen], wantOpt)
			}
			inner := out[50+olen:]
			if len(inner) != len(in) {
				t.Fatalf("%s: inner frame %d bytes, want %d (no IPv4 option)", what, len(inner), len(in))
			}
			if f.client.Is4() && inner[14] != 0x45 {
				t.Errorf("%s: inner IPv4 header length byte %#x, want 0x45: no IP option", what, inner[14])
			}
			src, dst := innerTuple(inner)
			if src != netip.AddrPortFrom(f.client, tc.sport) || dst != netip.AddrPortFrom(f.backend, dsrBackend) {
				t.Errorf("%s: inner %s -> %s, want %s -> %s", what, src, dst, netip.AddrPortFrom(f.client, tc.sport), netip.AddrPortFrom(f.backend, dsrBackend))
			}
		}
	}
	if list, _ := n.l.Maps().NAT.NATMap().List(); len(list) != 0 {
		t.Errorf("NAT mappings %+v, want none: DSR keeps the client's source", list)
	}

	for _, f := range dsrFamilies {
		pfe := netip.AddrPortFrom(f.pfe, dsrFEPort)
		for _, proto := range []uint8{6, 17} {
			what := f.name + map[uint8]string{6: " TCP", 17: " UDP"}[proto]
			client := netip.AddrPortFrom(f.client, 41000+uint16(proto))
			inner := l4Frame(f.client, f.pod, proto, 0x02, client.Port(), benchPort)
			pkt := geneveFrame(peerNode, nodeAddr, worldID, padded(dsrOption(pfe)), inner)
			pkt[14+20+8+1] |= 0x40
			v, out := runOut(t, n.fromNetdev, n.uplink, pkt)
			if v != tcActRedirect {
				t.Fatalf("%s: from_netdev on the peer's Geneve DSR request: verdict %d, want redirect into the pod", what, v)
			}
			if _, dst := innerTuple(out); dst != netip.AddrPortFrom(f.pod, benchPort) {
				t.Fatalf("%s: delivered to %s", what, dst)
			}
			got, ok := dsrRecord(t, n, proto, client, netip.AddrPortFrom(f.pod, benchPort))
			if !ok || got != pfe {
				t.Fatalf("%s: recorded frontend %s (found %v), want %s", what, got, ok, pfe)
			}
			// Pod A's reply to the client leaves the uplink with the
			// recorded frontend as its source.
			reply := l4Frame(f.pod, f.client, proto, 0x12, benchPort, client.Port())
			v, out = runOut(t, n.toNetdev, n.uplink, reply)
			if v != 0 {
				t.Fatalf("%s: to_netdev on the reply: verdict %d, want pass", what, v)
			}
			if src, dst := innerTuple(out); src != pfe || dst != client {
				t.Errorf("%s: reply %s -> %s, want %s -> %s", what, src, dst, pfe, client)
			}
		}
	}
}

// dsrRecord finds the record of a DSR flow (either family).
func dsrRecord(t *testing.T, n *benchNode, proto uint8, client, backend netip.AddrPort) (netip.AddrPort, bool) {
	t.Helper()
	list, err := n.l.Maps().NAT.DSRMap().List()
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range list {
		if r.Proto == proto && netip.AddrPortFrom(r.Client, r.ClientPort) == client && netip.AddrPortFrom(r.Backend, r.BackendPort) == backend {
			return netip.AddrPortFrom(r.Frontend, r.FrontendPort), true
		}
	}
	return netip.AddrPort{}, false
}

// TestPrivilegedGeneveOptions: geneve_decap's walk of the options. Dropped
// and counted as malformed (REASON_MALFORMED): an option whose length
// runs past the options' end, options past the packet's end (the header
// claims 252 bytes, 12 follow), a DSR option of neither length, an
// unknown critical option, and more options than the walk reads under
// the critical bit; no flow is recorded for any. The same nine options
// without the critical bit are skipped and the packet delivered, and so
// is a DSR option whose family is not the inner packet's (not recorded).
func TestPrivilegedGeneveOptions(t *testing.T) {
	n := newGeneveDSRNode(t)
	malformed := n.counter(reasonMalfmd, maps.DirIngress)
	inner := l4Frame(dsrClient, podA, 6, 0x02, 42000, benchPort)
	opt4 := padded(dsrOption(netip.AddrPortFrom(peerNode, dsrFEPort)))
	nine := bytes.Repeat([]byte{0xff, 0xf0, 0x01, 0x00}, 9)
	crit := func(p []byte) []byte { p[14+20+8+1] |= 0x40; return p }
	truncated := crit(geneveFrame(peerNode, nodeAddr, worldID, opt4, nil))
	truncated[14+20+8] = 63
	for _, tc := range []struct {
		name string
		pkt  []byte
	}{
		{"option past the options' end", crit(geneveFrame(peerNode, nodeAddr, worldID, append([]byte{0x01, 0x4b, 0x81, 5}, make([]byte, 8)...), inner))},
		{"options past the packet's end", truncated},
		{"DSR option of 16 bytes", crit(geneveFrame(peerNode, nodeAddr, worldID, append([]byte{0x01, 0x4b, 0x81, 3}, make([]byte, 12)...), inner))},
		{"unknown critical option", crit(geneveFrame(peerNode, nodeAddr, worldID, []byte{0x01, 0x02, 0x80, 1, 1, 2, 3, 4}, inner))},
		{"nine options under the critical bit", crit(geneveFrame(peerNode, nodeAddr, worldID, nine, inner))},
	} {
		before := malformed()
		if v, _ := runOut(t, n.fromNetdev, n.uplink, tc.pkt); v != tcActShot {
			t.Errorf("%s: verdict %d, want drop", tc.name, v)
		}
		if got := malformed() - before; got != 1 {
			t.Errorf("%s: counted as malformed %d times, want 1", tc.name, got)
		}
	}
	if list, _ := n.l.Maps().NAT.DSRMap().List(); len(list) != 0 {
		t.Errorf("records %+v after malformed options, want none", list)
	}
	if v, _ := runOut(t, n.fromNetdev, n.uplink, geneveFrame(peerNode, nodeAddr, worldID, nine, inner)); v != tcActRedirect {
		t.Errorf("nine options without the critical bit: verdict %d, want delivery", v)
	}
	inner6 := l4Frame(dsrClient6, podA6, 6, 0x02, 42001, benchPort)
	if v, _ := runOut(t, n.fromNetdev, n.uplink, crit(geneveFrame(peerNode, nodeAddr, worldID, opt4, inner6))); v != tcActRedirect {
		t.Errorf("an IPv4 DSR option on an IPv6 packet: verdict %d, want delivery", v)
	}
	if list, _ := n.l.Maps().NAT.DSRMap().List(); len(list) != 0 {
		t.Errorf("records %+v, want none (the option's family is not the packet's)", list)
	}
}
