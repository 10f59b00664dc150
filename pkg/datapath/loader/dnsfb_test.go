package loader

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/tendril-net/tendril/pkg/datapath/maps"
	"github.com/tendril-net/tendril/pkg/fqdn/dnsfallback"
	"github.com/tendril-net/tendril/pkg/policy/api"
)

// dnsQuery is a DNS message: a query (flags as given) for name, type A.
func dnsQuery(id uint16, flags uint16, name string, extra []byte) []byte {
	m := make([]byte, 12)
	binary.BigEndian.PutUint16(m[0:], id)
	binary.BigEndian.PutUint16(m[2:], flags)
	binary.BigEndian.PutUint16(m[4:], 1)
	if len(extra) > 0 {
		binary.BigEndian.PutUint16(m[10:], 1) // ARCOUNT: an OPT record
	}
	w, err := dnsfallback.Wire(name)
	if err != nil {
		panic(err)
	}
	m = append(m, w...)
	m = append(m, 0, 1, 0, 1)
	return append(m, extra...)
}

// dnsFallbackNode is a node whose endpoint 1 (podA, enforcing egress)
// sends UDP and TCP port 53 of the remote prefix to the DNS proxy, which
// does not run (no socket in the map: the agent is down), and may send
// UDP port 54 there at L4. fallback: whether endpoint 1's fallback
// entries (its rules allowing "allowed.example" and "*.example.org") are
// in.
func dnsFallbackNode(t testing.TB, fallback bool) *testNode {
	n := newNode(t)
	if err := n.l.AttachEndpoint(EndpointInfo{ID: 1, IfIndex: n.ifidx, IfName: "tdrtest0", Addresses: []netip.Addr{podA, podA6}, Identity: idA,
		MAC: macA, HostMAC: hostMACA, EnforceEgress: true, L7Egress: true}); err != nil {
		t.Fatal(err)
	}
	m := n.l.Maps()
	for p, id := range map[string]uint32{"10.2.0.0/24": idRemote, "fd00:2::/64": idRemote} {
		if err := m.IPCacheMap().Upsert(netip.MustParsePrefix(p), maps.IPCacheEntry{Identity: id}); err != nil {
			t.Fatal(err)
		}
	}
	for _, e := range []struct {
		proto uint8
		port  uint16
		proxy uint8
	}{{17, 53, maps.ProxyDns}, {6, 53, maps.ProxyDns}, {17, 54, 0}} {
		k := maps.PolicyKey{EndpointID: 1, Direction: maps.DirEgress, Identity: idRemote, Proto: e.proto, Port: e.port, PortPrefixLen: 16}
		if err := m.PolicyMap().Upsert(k, maps.PolicyValue{Cookie: 7, Proxy: e.proxy}); err != nil {
			t.Fatal(err)
		}
	}
	if fallback {
		fb := m.DNSFallbackMap()
		names := dnsfallback.Compile([]api.PortRuleDNS{{MatchName: "allowed.example"}, {MatchPattern: "*.example.org"}}, false)
		for e := range names.Entries {
			if err := fb.Put(maps.DNSFallbackKey{EndpointID: 1, Kind: e.Kind, Hash: e.Hash}); err != nil {
				t.Fatal(err)
			}
		}
		if err := fb.Put(maps.DNSFallbackKey{EndpointID: 1, Kind: maps.DNSFallbackFilter}); err != nil {
			t.Fatal(err)
		}
	}
	return n
}

// TestPrivilegedFromPodDNSFallback: with no DNS proxy socket, from_pod
// hashes a UDP query's name as the agent's Go code does (mixed case
// included) and passes the names of the endpoint's rules (exact, and any
// first label before a *.rest) to the host; a denied name comes back as
// the datapath's REFUSED answer to the pod (IPv4: the frame from the
// host-side veth to the pod, addresses and ports swapped, the OPT record
// trimmed, a valid IP header checksum) or is dropped (IPv6); so are TCP,
// a response, a message of another opcode and a compressed name. Without
// the filter marker everything passes (an agent that never wrote the
// map), and the "all names" marker lets every name pass. The loader's
// purge of the endpoint removes its entries.
func TestPrivilegedFromPodDNSFallback(t *testing.T) {
	n := dnsFallbackNode(t, true)
	from, _ := n.l.Programs()
	query := func(src, dst netip.Addr, sport uint16, msg []byte) []byte {
		return packet(src, dst, l4{proto: 17, sport: sport, dport: 53, payload: msg})
	}
	for i, name := range []string{"allowed.example", "ALLOWED.Example.", "x.example.org", "Some-Host.EXAMPLE.org"} {
		if got := n.fromPod(n.ifidx, query(podA, remote, uint16(30000+i), dnsQuery(1, 0x0100, name, nil))); got != actOK {
			t.Errorf("allowed %s: verdict %d, want pass to the host", name, got)
		}
	}
	deniedBefore := n.metric(maps.ReasonDnsNameDenied, maps.DirEgress)
	opt := []byte{0, 0, 41, 0x10, 0, 0, 0, 0, 0, 0, 0} // EDNS OPT, 4096
	for i, name := range []string{"denied.example", "example.org", "a.b.example.org", "allowed.example.com"} {
		in := query(podA, remote, uint16(31000+i), dnsQuery(0x1234, 0x0100, name, opt))
		ret, out := n.runOut(from, n.ifidx, in)
		if ret != actRedirect {
			t.Errorf("denied %s: verdict %d, want the REFUSED answer redirected to the pod", name, ret)
			continue
		}
		w, _ := dnsfallback.Wire(name)
		qlen := 12 + len(w) + 4
		if len(out) != 14+20+8+qlen {
			t.Errorf("denied %s: answer of %d bytes, want %d (trimmed after the question)", name, len(out), 14+20+8+qlen)
			continue
		}
		ip, udp, msg := out[14:34], out[34:42], out[42:]
		switch {
		case !bytes.Equal(out[0:6], macA) || !bytes.Equal(out[6:12], hostMACA):
			t.Errorf("denied %s: MACs %x -> %x, want from the host veth to the pod", name, out[6:12], out[0:6])
		case netip.AddrFrom4([4]byte(ip[12:16])) != remote || netip.AddrFrom4([4]byte(ip[16:20])) != podA:
			t.Errorf("denied %s: addresses not swapped: %x", name, ip[12:20])
		case ipv4Checksum(ip) != 0 || int(binary.BigEndian.Uint16(ip[2:])) != 20+8+qlen:
			t.Errorf("denied %s: IP header checksum or length wrong: %x", name, ip)
		case binary.BigEndian.Uint16(udp[0:]) != 53 || binary.BigEndian.Uint16(udp[2:]) != uint16(31000+i) || int(binary.BigEndian.Uint16(udp[4:])) != 8+qlen:
			t.Errorf("denied %s: UDP header %x", name, udp)
		case binary.BigEndian.Uint16(msg[0:]) != 0x1234 || msg[2] != 0x81 || msg[3] != 5 || !bytes.Equal(msg[4:12], []byte{0, 1, 0, 0, 0, 0, 0, 0}):
			t.Errorf("denied %s: DNS header %x, want the query's ID, QR RD, REFUSED, one question", name, msg[:12])
		case !bytes.Equal(msg[12:], in[42 : 42+len(w)+16][12:]):
			t.Errorf("denied %s: question %x, want the query's", name, msg[12:])
		}
	}
	if got := n.metric(maps.ReasonDnsNameDenied, maps.DirEgress) - deniedBefore; got != 4 {
		t.Errorf("%d packets counted as denied names, want 4", got)
	}
	compressed := dnsQuery(1, 0x0100, "allowed.example", nil)
	compressed = append(compressed[:12], 0xc0, 0x0c, 0, 1, 0, 1)
	for _, c := range []struct {
		name string
		pkt  []byte
	}{
		{"IPv6 denied name", query(podA6, rem6, 32000, dnsQuery(1, 0x0100, "denied.example", nil))},
		{"TCP", packet(podA, remote, l4{proto: 6, sport: 32001, dport: 53, tcpFlags: 0x02})},
		{"a response", query(podA, remote, 32002, dnsQuery(1, 0x8100, "allowed.example", nil))},
		{"opcode STATUS", query(podA, remote, 32003, dnsQuery(1, 2<<11, "allowed.example", nil))},
		{"a compressed name", query(podA, remote, 32004, compressed)},
	} {
		if got := n.fromPod(n.ifidx, c.pkt); got != actShot {
			t.Errorf("%s: verdict %d, want drop", c.name, got)
		}
	}
	if got := n.fromPod(n.ifidx, query(podA6, rem6, 32005, dnsQuery(1, 0x0100, "x.example.org", nil))); got != actOK {
		t.Errorf("IPv6 allowed name: verdict %d, want pass", got)
	}

	fb := n.l.Maps().DNSFallbackMap()
	all := maps.DNSFallbackKey{EndpointID: 1, Kind: maps.DNSFallbackAll}
	if err := fb.Put(all); err != nil {
		t.Fatal(err)
	}
	if got := n.fromPod(n.ifidx, query(podA, remote, 33000, dnsQuery(1, 0x0100, "denied.example", nil))); got != actOK {
		t.Errorf("all names marker: denied name verdict %d, want pass", got)
	}
	if err := fb.Delete(all); err != nil {
		t.Fatal(err)
	}
	if err := fb.Delete(maps.DNSFallbackKey{EndpointID: 1, Kind: maps.DNSFallbackFilter}); err != nil {
		t.Fatal(err)
	}
	if got := n.fromPod(n.ifidx, query(podA, remote, 33001, dnsQuery(1, 0x0100, "denied.example", nil))); got != actOK {
		t.Errorf("no filter marker: denied name verdict %d, want pass", got)
	}

	// The purge of an endpoint that was not restored takes its names
	// and leaves another endpoint's.
	other := maps.DNSFallbackKey{EndpointID: 2, Kind: maps.DNSFallbackFilter}
	if err := fb.Put(other); err != nil {
		t.Fatal(err)
	}
	if _, err := n.l.PurgeEndpoint(1); err != nil {
		t.Fatal(err)
	}
	all1, err := fb.Dump()
	if err != nil {
		t.Fatal(err)
	}
	if len(all1[1]) != 0 || len(all1[2]) != 1 {
		t.Errorf("after purging endpoint 1: %v, want only endpoint 2's marker", all1)
	}
	// Has: the point lookup the agent checks a walk's entries with.
	if ok, err := fb.Has(other); err != nil || !ok {
		t.Errorf("Has(endpoint 2's marker) = %v, %v; want true", ok, err)
	}
	if ok, err := fb.Has(maps.DNSFallbackKey{EndpointID: 1, Kind: maps.DNSFallbackFilter}); err != nil || ok {
		t.Errorf("Has(purged endpoint 1's marker) = %v, %v; want false", ok, err)
	}
}

// BenchmarkPrivilegedFromPodDNSFallback: from_pod's time for an
// established UDP flow, BPF_PROG_TEST_RUN with the kernel's run-time
// statistics, in the same run: plain (port 54, L4 only), a query in the
// DNS fallback for an allowed name, and for a denied one (the REFUSED
// rewrite). One program run per test run (repeat 1) for all three: a
// repeated test run hands the same socket buffer to every run, and the
// denied query's first run turns it into the answer.
func BenchmarkPrivilegedFromPodDNSFallback(b *testing.B) {
	n := dnsFallbackNode(b, true)
	name := "api.example.org" // a *.rest name: the longer lookup path
	for _, c := range []struct {
		name string
		pkt  []byte
		want uint32
	}{
		{"plain-udp", packet(podA, remote, l4{proto: 17, sport: 40000, dport: 54, payload: dnsQuery(1, 0x0100, name, nil)}), actOK},
		{"fallback-allowed", packet(podA, remote, l4{proto: 17, sport: 40001, dport: 53, payload: dnsQuery(1, 0x0100, name, nil)}), actOK},
		{"fallback-denied", packet(podA, remote, l4{proto: 17, sport: 40002, dport: 53, payload: dnsQuery(1, 0x0100, "denied.example.org.test", nil)}), actRedirect},
	} {
		b.Run(c.name, func(b *testing.B) {
			if got := n.fromPod(n.ifidx, c.pkt); got != c.want {
				b.Fatalf("first run: %d, want %d", got, c.want)
			}
			benchFromPod(b, n, n.ifidx, func(int) []byte { return c.pkt }, 1)
		})
	}
}
