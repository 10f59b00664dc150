package loader

import (
	"bytes"
	"net"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/tendril-net/tendril/pkg/datapath/maps"
)

const actRedirect = 7

var (
	macA     = net.HardwareAddr{0x02, 0, 0, 0, 0xa, 1}
	hostMACA = net.HardwareAddr{0x02, 0, 0, 0, 0xa, 2}
	macB     = net.HardwareAddr{0x02, 0, 0, 0, 0xb, 1}
	hostMACB = net.HardwareAddr{0x02, 0, 0, 0, 0xb, 2}
)

// addDirectEndpoints attaches A and B with both MACs known, so each takes
// direct delivery from the other; B enforces ingress, A nothing.
func (n *testNode) addDirectEndpoints() {
	n.t.Helper()
	eps := []EndpointInfo{
		{ID: 1, IfIndex: n.ifidx, IfName: "tdrtest0", Addresses: []netip.Addr{podA, podA6}, Identity: idA, MAC: macA, HostMAC: hostMACA},
		{ID: 2, IfIndex: n.ifidx2, IfName: "tdrtest1", Addresses: []netip.Addr{podB, podB6}, Identity: idB, MAC: macB, HostMAC: hostMACB, EnforceIngress: true},
	}
	for _, ep := range eps {
		if err := n.l.AttachEndpoint(ep); err != nil {
			n.t.Fatal(err)
		}
	}
	for p, id := range map[string]uint32{"10.1.0.2/32": idA, "10.1.0.3/32": idB, "10.2.0.0/24": idRemote, "fd00::a/128": idA, "fd00::b/128": idB} {
		if err := n.l.Maps().IPCacheMap().Upsert(netip.MustParsePrefix(p), maps.IPCacheEntry{Identity: id}); err != nil {
			n.t.Fatal(err)
		}
	}
}

// runOut runs prog and returns its verdict and the packet as it left.
func (n *testNode) runOut(prog *ebpf.Program, ifindex int, pkt []byte) (uint32, []byte) {
	n.t.Helper()
	ctx := skbContext{}
	ctx.Fields[10] = uint32(ifindex)
	out := make([]byte, len(pkt)+256)
	opts := &ebpf.RunOptions{Data: pkt, DataOut: out, Context: ctx}
	ret, err := prog.Run(opts)
	if err != nil {
		n.t.Fatalf("test run: %v", err)
	}
	return ret, opts.DataOut
}

// TestPrivilegedDirectDeliveryPaths: between two local endpoints that take
// direct delivery, the sender's from_pod enforces the receiver's ingress
// policy, creates the flow's one conntrack entry naming both endpoints,
// rewrites the frame as the host would route it and redirects it into the
// receiver's namespace; replies come back the same way through the same
// entry.
func TestPrivilegedDirectDeliveryPaths(t *testing.T) {
	n := newTestNode(t)
	n.addDirectEndpoints()
	from, _ := n.l.Programs()
	const syn, ack = 0x02, 0x10
	synAB := packet(podA, podB, l4{proto: 6, sport: 40000, dport: 8080, tcpFlags: syn})

	// B's ingress allows nothing yet: A's program drops, counted and
	// reported as B's ingress drop, and creates no conntrack entry.
	er, err := n.l.NewEventReader()
	if err != nil {
		t.Fatal(err)
	}
	defer er.Close()
	if got := n.fromPod(n.ifidx, synAB); got != actShot {
		t.Fatalf("A to B without B's ingress rule = %d, want drop", got)
	}
	if n.metric(maps.ReasonPolicyDenied, maps.DirIngress) != 1 {
		t.Fatal("B's ingress drop not counted")
	}
	if ev, err := er.Read(); err != nil || ev.Type != EventDrop || ev.EndpointID != 2 || ev.Direction != maps.DirIngress ||
		ev.SrcIdentity != idA || ev.DstIdentity != idB || ev.Reason != maps.ReasonPolicyDenied {
		t.Fatalf("drop event: %+v, %v", ev, err)
	}
	if len(n.ctEntries(0)) != 0 {
		t.Fatal("a dropped flow left a conntrack entry")
	}

	// Allowed: redirected, with the frame rewritten.
	n.allow(2, maps.DirIngress, idA, 6, 8080)
	ret, out := n.runOut(from, n.ifidx, synAB)
	if ret != actRedirect {
		t.Fatalf("A to B allowed = %d, want redirect (%d)", ret, actRedirect)
	}
	if !bytes.Equal(out[0:6], macB) || !bytes.Equal(out[6:12], hostMACB) {
		t.Errorf("MACs after rewrite: dst %x src %x, want %s %s", out[0:6], out[6:12], macB, hostMACB)
	}
	if out[14+8] != 63 {
		t.Errorf("TTL after rewrite %d, want 63", out[14+8])
	}
	if c := ipv4Checksum(out[14:34]); c != 0 {
		t.Errorf("IPv4 header checksum wrong after the TTL rewrite (sum %#x)", c)
	}
	if n.metric(maps.ReasonDeliveredDirect, maps.DirIngress) != 1 {
		t.Error("direct delivery not counted")
	}
	all := n.ctEntries(0)
	if len(all) != 1 || all[0].SrcEndpoint != 1 || all[0].DstEndpoint != 2 || all[0].Src != podA || all[0].Dst != podB || all[0].DstPort != 8080 {
		t.Fatalf("conntrack after the first packet: %+v", all)
	}

	// B's answer: through both endpoints' conntrack (B's egress is not
	// enforced, A's ingress neither; B's entry makes it a reply), into A.
	ret, out = n.runOut(from, n.ifidx2, packet(podB, podA, l4{proto: 6, sport: 8080, dport: 40000, tcpFlags: syn | ack}))
	if ret != actRedirect || !bytes.Equal(out[0:6], macA) || !bytes.Equal(out[6:12], hostMACA) {
		t.Fatalf("B's reply = %d, MACs %x %x", ret, out[0:6], out[6:12])
	}
	if n.metric(maps.ReasonCTReply, maps.DirEgress) != 1 || n.metric(maps.ReasonCTReply, maps.DirIngress) != 1 {
		t.Error("reply not counted as such on both endpoints")
	}
	if got := n.ctEntries(0); len(got) != 1 || !got[0].SeenReply() {
		t.Fatalf("after the reply: %+v, want the one entry, answered", got)
	}
	// Established: one lookup per endpoint, no policy.
	if got := n.fromPod(n.ifidx, packet(podA, podB, l4{proto: 6, sport: 40000, dport: 8080, tcpFlags: ack})); got != actRedirect {
		t.Fatalf("established = %d", got)
	}

	// Another port of B: still B's policy that decides.
	if got := n.fromPod(n.ifidx, packet(podA, podB, l4{proto: 6, sport: 40001, dport: 22, tcpFlags: syn})); got != actShot {
		t.Fatalf("A to B port 22 = %d, want drop", got)
	}
	// B to A (A enforces nothing): delivered.
	if got := n.fromPod(n.ifidx2, packet(podB, podA, l4{proto: 17, sport: 5000, dport: 53})); got != actRedirect {
		t.Fatalf("B to A = %d", got)
	}

	// A TTL that expires on the way is the host's to answer: passed up.
	expiring := packet(podA, podB, l4{proto: 6, sport: 40002, dport: 8080, tcpFlags: syn})
	expiring[14+8] = 1
	if got := n.fromPod(n.ifidx, expiring); got != actOK {
		t.Fatalf("TTL 1 = %d, want pass to the host", got)
	}

	// IPv6: hop limit down by one, redirected.
	n.allow(2, maps.DirIngress, idA, 17, 53)
	ret, out = n.runOut(from, n.ifidx, packet(podA6, podB6, l4{proto: 17, sport: 5000, dport: 53}))
	if ret != actRedirect || out[14+7] != 63 || !bytes.Equal(out[0:6], macB) {
		t.Fatalf("IPv6 A to B = %d, hop limit %d, dst MAC %x", ret, out[14+7], out[0:6])
	}
	if got := n.fromPod(n.ifidx, packet(podA6, podB6, l4{proto: 17, sport: 5000, dport: 54})); got != actShot {
		t.Fatalf("IPv6 A to B port 54 = %d, want drop", got)
	}

	// ICMP error from B about A's flow: related on both sides, delivered.
	icmpErr := icmpError(podB, podA, packet(podA, podB, l4{proto: 6, sport: 40000, dport: 8080, tcpFlags: ack}))
	if got := n.fromPod(n.ifidx2, icmpErr); got != actRedirect {
		t.Fatalf("related ICMP error B to A = %d", got)
	}
	if n.metric(maps.ReasonCTRelated, maps.DirEgress) != 1 || n.metric(maps.ReasonCTRelated, maps.DirIngress) != 1 {
		t.Error("ICMP error not related on both endpoints")
	}
}

// TestPrivilegedDirectDeliveryNeedsMACs: a destination without known MACs
// (or with direct delivery off) is reached through the host: A's program
// passes the packet up, and B's ingress is left to B's to_pod.
func TestPrivilegedDirectDeliveryNeedsMACs(t *testing.T) {
	for _, tc := range []struct {
		name   string
		direct bool
		macs   bool
	}{{"no MACs", true, false}, {"direct delivery off", false, true}} {
		t.Run(tc.name, func(t *testing.T) {
			n := newTestNode(t)
			n.l.cfg.DirectDelivery = tc.direct
			b := EndpointInfo{ID: 2, IfIndex: n.ifidx2, Addresses: []netip.Addr{podB}, Identity: idB, EnforceIngress: true}
			if tc.macs {
				b.MAC, b.HostMAC = macB, hostMACB
			}
			for _, ep := range []EndpointInfo{{ID: 1, IfIndex: n.ifidx, Addresses: []netip.Addr{podA}, Identity: idA}, b} {
				if err := n.l.AttachEndpoint(ep); err != nil {
					t.Fatal(err)
				}
				if err := n.l.Maps().IPCacheMap().Upsert(netip.PrefixFrom(ep.Addresses[0], 32), maps.IPCacheEntry{Identity: ep.Identity}); err != nil {
					t.Fatal(err)
				}
			}
			e, ok, err := n.l.Maps().EndpointMap().LookupAddr(podB)
			if err != nil || !ok || e.Flags&maps.FlagDeliverDirect != 0 {
				t.Fatalf("B's entry: %+v %v %v", e, ok, err)
			}
			syn := packet(podA, podB, l4{proto: 6, sport: 40000, dport: 8080, tcpFlags: 0x02})
			if got := n.fromPod(n.ifidx, syn); got != actOK {
				t.Fatalf("A to B = %d, want pass to the host", got)
			}
			if got := n.toPod(n.ifidx2, syn); got != actShot {
				t.Fatalf("B's to_pod = %d, want drop (no ingress rule)", got)
			}
			if len(n.ctEntries(2)) != 0 {
				t.Fatal("A's program admitted the flow for B")
			}
			// Once B's policy allows it, B's to_pod names B in the entry
			// A's program made: still one entry, and the reply is one
			// for both.
			n.allow(2, maps.DirIngress, idA, 6, 8080)
			if got := n.toPod(n.ifidx2, syn); got != actOK {
				t.Fatalf("B's to_pod with a rule = %d", got)
			}
			if all := n.ctEntries(0); len(all) != 1 || all[0].SrcEndpoint != 1 || all[0].DstEndpoint != 2 {
				t.Fatalf("entries after B admitted the flow: %+v", all)
			}
			synAck := packet(podB, podA, l4{proto: 6, sport: 8080, dport: 40000, tcpFlags: 0x12})
			if got := n.fromPod(n.ifidx2, synAck); got != actOK {
				t.Fatalf("B's answer = %d", got)
			}
			if got := n.toPod(n.ifidx, synAck); got != actOK {
				t.Fatalf("B's answer into A = %d", got)
			}
			if n.metric(maps.ReasonCTReply, maps.DirEgress) != 1 || n.metric(maps.ReasonCTReply, maps.DirIngress) != 1 {
				t.Error("the answer was not a reply for both endpoints")
			}
		})
	}
}

// TestPrivilegedEndpointEntries: the endpoints map holds an interface entry
// and an entry per address; a changed address or interface replaces the
// old entries; detaching removes them all.
func TestPrivilegedEndpointEntries(t *testing.T) {
	n := newTestNode(t)
	em := n.l.Maps().EndpointMap()
	ep := EndpointInfo{ID: 5, IfIndex: n.ifidx, Addresses: []netip.Addr{podA, podA6}, Identity: idA, MAC: macA, HostMAC: hostMACA, EnforceEgress: true}
	if err := n.l.AttachEndpoint(ep); err != nil {
		t.Fatal(err)
	}
	if c, _ := em.Count(); c != 3 {
		t.Fatalf("%d entries, want 3 (interface, IPv4, IPv6)", c)
	}
	e, ok, err := em.Lookup(uint32(n.ifidx))
	if err != nil || !ok || e.ID != 5 || e.IPv4 != podA || e.IPv6 != podA6 || !e.EnforceEgress() || e.EnforceIngress() ||
		e.Flags&maps.FlagDeliverDirect == 0 || !bytes.Equal(e.MAC, macA) {
		t.Fatalf("interface entry: %+v %v %v", e, ok, err)
	}
	// The pod's veth is recreated (new ifindex) with a new IPv4 address and
	// no IPv6.
	ep.IfIndex, ep.Addresses = n.ifidx2, []netip.Addr{podB}
	if err := n.l.WriteEndpoint(ep); err != nil {
		t.Fatal(err)
	}
	if c, _ := em.Count(); c != 2 {
		list, _ := em.List()
		t.Fatalf("%d entries after the change, want 2: %+v", c, list)
	}
	for _, ip := range []netip.Addr{podA, podA6} {
		if _, ok, _ := em.LookupAddr(ip); ok {
			t.Errorf("old address %s still mapped", ip)
		}
	}
	if _, ok, _ := em.Lookup(uint32(n.ifidx)); ok {
		t.Error("old interface still mapped")
	}
	// Two addresses of one family are refused.
	bad := ep
	bad.Addresses = []netip.Addr{podA, podB}
	if err := n.l.WriteEndpoint(bad); err == nil {
		t.Error("two IPv4 addresses accepted")
	}
	if err := n.l.DetachEndpoint(5, []netip.Addr{podB}); err != nil {
		t.Fatal(err)
	}
	if c, _ := em.Count(); c != 0 {
		t.Fatalf("%d entries after detach", c)
	}
	if err := n.l.DetachEndpoint(5, nil); err != nil {
		t.Fatalf("second detach: %v", err)
	}
}

// TestPrivilegedEstablishedDestinationFromConntrack: an established packet
// finds its local destination through the endpoint its flow's entry names
// (an array slot, no address lookup), checked against the packet's
// address; a flow whose peer was not local when it began keeps going
// through the host, where a pod that took the address since checks it as
// new.
func TestPrivilegedEstablishedDestinationFromConntrack(t *testing.T) {
	n := newTestNode(t)
	n.addDirectEndpoints()
	n.allow(2, maps.DirIngress, idA, 6, 8080)
	const syn, ack = 0x02, 0x10

	// A to the remote address: through the host, the entry says the
	// peer is not local.
	if got := n.fromPod(n.ifidx, packet(podA, remote, l4{proto: 6, sport: 41000, dport: 8080, tcpFlags: syn})); got != actOK {
		t.Fatalf("A to the remote = %d, want pass to the host", got)
	}
	ct := n.ctEntries(1)
	if len(ct) != 1 || ct[0].Flags&maps.CTFlagDstNotLocal == 0 || ct[0].Flags&maps.CTFlagSrcNotLocal != 0 || ct[0].Dst != remote {
		t.Fatalf("entry of the flow to the remote: %+v", ct)
	}
	// B takes the remote address (its IPv4) and admits A.
	b := EndpointInfo{ID: 2, IfIndex: n.ifidx2, IfName: "tdrtest1", Addresses: []netip.Addr{remote, podB6}, Identity: idB, MAC: macB, HostMAC: hostMACB, EnforceIngress: true}
	if err := n.l.AttachEndpoint(b); err != nil {
		t.Fatal(err)
	}
	if err := n.l.Maps().IPCacheMap().Upsert(netip.PrefixFrom(remote, 32), maps.IPCacheEntry{Identity: idB}); err != nil {
		t.Fatal(err)
	}
	// The flow that began before still goes to the host (B's to_pod
	// checks it there); a new one is delivered directly.
	if got := n.fromPod(n.ifidx, packet(podA, remote, l4{proto: 6, sport: 41000, dport: 8080, tcpFlags: ack})); got != actOK {
		t.Errorf("established flow to the address B took = %d, want pass to the host", got)
	}
	if got := n.fromPod(n.ifidx, packet(podA, remote, l4{proto: 6, sport: 41001, dport: 8080, tcpFlags: syn})); got != actRedirect {
		t.Fatalf("new flow to B at its new address = %d, want redirect", got)
	}
	if got := n.fromPod(n.ifidx, packet(podA, remote, l4{proto: 6, sport: 41001, dport: 8080, tcpFlags: ack})); got != actRedirect {
		t.Fatalf("established flow to B = %d, want redirect", got)
	}
	// B's ID slot goes to another endpoint at another address (B was
	// deleted, its ID reused): the entry still names 2, but 2 no longer
	// holds the address, so the packet is not delivered to it.
	if err := n.l.DetachEndpoint(2, nil); err != nil {
		t.Fatal(err)
	}
	c := EndpointInfo{ID: 2, IfIndex: n.ifidx2, IfName: "tdrtest1", Addresses: []netip.Addr{podB}, Identity: idB, MAC: macB, HostMAC: hostMACB}
	if err := n.l.AttachEndpoint(c); err != nil {
		t.Fatal(err)
	}
	if got := n.fromPod(n.ifidx, packet(podA, remote, l4{proto: 6, sport: 41001, dport: 8080, tcpFlags: ack})); got != actOK {
		t.Errorf("established flow to an address endpoint 2 no longer holds = %d, want pass to the host", got)
	}
}
