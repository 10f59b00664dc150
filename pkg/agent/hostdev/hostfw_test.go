package hostdev

import (
	"encoding/binary"
	"testing"

	"github.com/tendril-net/tendril/pkg/datapath/maps"
)

// The host firewall in the host device programs (bpf/lib/hostfw.h), with
// BPF_PROG_TEST_RUN on the node port tests' throw-away node: its uplink
// holds the node address (identity host in the ipcache), npLocal is a
// node port with a local backend.

const (
	tcActShot     = 2
	hostRuleAllow = 41 // the cookie of the host policy's allow
	hostRuleAudit = 43 // the audited rule's cookie
)

// hostPolicy writes one entry of the host endpoint's policy.
func hostPolicy(t *testing.T, n *masqNode, dir uint8, id uint32, proto uint8, port uint16, v maps.PolicyValue) {
	t.Helper()
	k := maps.PolicyKey{EndpointID: maps.HostEndpointID, Direction: dir, Identity: id, Proto: proto, Port: port}
	if port != 0 {
		k.PortPrefixLen = 16
	}
	if err := n.l.Maps().PolicyMap().Upsert(k, v); err != nil {
		t.Fatal(err)
	}
}

func setHostFirewall(t *testing.T, n *masqNode, flags uint8) {
	t.Helper()
	if err := n.l.Maps().EndpointMap().SetHostFirewall(flags); err != nil {
		t.Fatal(err)
	}
}

// TestPrivilegedHostFirewallIngress: a host policy that enforces ingress
// and allows only the peer pods' identity drops the world's packet to a
// node port of the node (counted as a policy drop), before any service
// translation; once the port is allowed, the flow is translated to its
// backend as without the firewall. A connection the node opens to the
// world gets its reply in (conntrack), the same packet unsolicited does
// not. A masqueraded pod flow's reply to the node address is the pod's
// business and passes.
func TestPrivilegedHostFirewallIngress(t *testing.T) {
	n := newNodePortNode(t)
	setHostFirewall(t, n, maps.FlagEnforceIngress)
	hostPolicy(t, n, maps.DirIngress, idPeerPod, 0, 0, maps.PolicyValue{Cookie: hostRuleAllow})

	denied := n.metric(maps.ReasonPolicyDenied, maps.DirIngress)
	if ret, _ := n.ingress(frame(client, node, protoTCP, 40000, npLocal, 0)); ret != tcActShot {
		t.Fatalf("world to node port %d under a host policy not allowing it: verdict %d, want drop", npLocal, ret)
	}
	if got := n.metric(maps.ReasonPolicyDenied, maps.DirIngress); got != denied+1 {
		t.Fatalf("policy drops %d, want %d", got, denied+1)
	}
	if _, ok, _ := n.l.Maps().CTMap().Lookup(maps.CTEntry{Proto: protoTCP, Src: client, SrcPort: 40000, Dst: pod, DstPort: backendPort}); ok {
		t.Fatal("a denied packet reached the service translation (conntrack to the backend)")
	}
	// The peer pods' identity may reach any port of the node.
	if ret, _ := n.ingress(frame(peerPod, node, protoTCP, 40001, 22, 0)); ret != 0 {
		t.Fatalf("allowed identity to the node: verdict %d", ret)
	}

	// Allowed for everyone: translated to the local backend.
	hostPolicy(t, n, maps.DirIngress, 0, protoTCP, npLocal, maps.PolicyValue{Cookie: hostRuleAllow})
	ret, out := n.ingress(frame(client, node, protoTCP, 40002, npLocal, 0))
	if ret != 0 {
		t.Fatalf("world to an allowed node port: verdict %d", ret)
	}
	if src, dst := tuple(out); src != ap(client, 40002) || dst != ap(pod, backendPort) {
		t.Fatalf("allowed node port flow: %s -> %s, want %s -> %s", src, dst, ap(client, 40002), ap(pod, backendPort))
	}

	// The node's own connection to the world: its reply passes, the
	// same packet without the connection does not.
	if ret, _ := n.ingress(frame(world, node, protoTCP, 443, 50000, 0)); ret != tcActShot {
		t.Fatalf("unsolicited packet from the world: verdict %d, want drop", ret)
	}
	if ret, _ := n.egress(frame(node, world, protoTCP, 50001, 443, 0)); ret != 0 {
		t.Fatalf("the node's own packet out (egress not enforced): verdict %d", ret)
	}
	if ret, _ := n.ingress(frame(world, node, protoTCP, 443, 50001, 0)); ret != 0 {
		t.Fatalf("reply to the node's own connection: verdict %d, want pass", ret)
	}

	// A pod's masqueraded flow: the reply to the node address is
	// translated back to the pod, not checked against the host's policy.
	n.fromPod(frame(pod, world, protoTCP, 41000, 80, 0))
	ret, out = n.egress(frame(pod, world, protoTCP, 41000, 80, 0))
	if ret != 0 {
		t.Fatalf("masquerade: verdict %d", ret)
	}
	src, _ := tuple(out)
	if ret, out = n.ingress(frame(world, node, protoTCP, 80, src.Port(), 0)); ret != 0 {
		t.Fatalf("reply of a masqueraded pod flow under host policy: verdict %d, want pass", ret)
	}
	if _, dst := tuple(out); dst != ap(pod, 41000) {
		t.Fatalf("masquerade reply to %s, want %s", dst, ap(pod, 41000))
	}

	// IPv6 alike: the world to the node's IPv6 address on a port no entry
	// allows is dropped; the node's own connection's reply gets in.
	if ret, _ := n.ingress(frame6(client6, node6, protoTCP, 40003, 22, 0)); ret != tcActShot {
		t.Fatalf("IPv6: world to the node under host policy: verdict %d, want drop", ret)
	}
	if ret, _ := n.egress(frame6(node6, world6, protoTCP, 50003, 443, 0)); ret != 0 {
		t.Fatalf("IPv6: the node's own packet out: verdict %d", ret)
	}
	if ret, _ := n.ingress(frame6(world6, node6, protoTCP, 443, 50003, 0)); ret != 0 {
		t.Fatalf("IPv6: reply to the node's own connection: verdict %d, want pass", ret)
	}

	// Off: nothing is checked.
	setHostFirewall(t, n, 0)
	if ret, _ := n.ingress(frame(world, node, protoTCP, 443, 50002, 0)); ret != 0 {
		t.Fatalf("host firewall off: verdict %d", ret)
	}
}

// TestPrivilegedHostFirewallEgress: egress enforced, the node's packet to
// a port its policy does not allow is dropped, to an allowed one passes;
// the node's reply to a connection its ingress admitted passes whatever
// the egress policy says.
func TestPrivilegedHostFirewallEgress(t *testing.T) {
	n := newNodePortNode(t)
	setHostFirewall(t, n, maps.FlagEnforceEgress)
	hostPolicy(t, n, maps.DirEgress, 0, protoTCP, 53, maps.PolicyValue{Cookie: hostRuleAllow})

	if ret, _ := n.egress(frame(node, world, protoTCP, 50000, 443, 0)); ret != tcActShot {
		t.Fatalf("node to a port its egress policy does not allow: verdict %d, want drop", ret)
	}
	if got := n.metric(maps.ReasonPolicyDenied, maps.DirEgress); got != 1 {
		t.Fatalf("egress policy drops %d, want 1", got)
	}
	if ret, _ := n.egress(frame(node, world, protoTCP, 50001, 53, 0)); ret != 0 {
		t.Fatalf("node to an allowed port: verdict %d", ret)
	}
	// Ingress is not enforced, but tracked: the reply of a connection
	// to the node leaves.
	if ret, _ := n.ingress(frame(world, node, protoTCP, 40000, 22, 0)); ret != 0 {
		t.Fatalf("world to the node (ingress not enforced): verdict %d", ret)
	}
	if ret, _ := n.egress(frame(node, world, protoTCP, 22, 40000, 0)); ret != 0 {
		t.Fatalf("the node's reply to an admitted connection: verdict %d, want pass", ret)
	}
	// A pod's packet leaving is not the host's.
	n.fromPod(frame(pod, world, protoTCP, 41000, 443, 0))
	if ret, _ := n.egress(frame(pod, world, protoTCP, 41000, 443, 0)); ret != 0 {
		t.Fatalf("a pod's packet under host egress policy: verdict %d, want pass (masqueraded)", ret)
	}
}

// TestPrivilegedHostFirewallAudit: in audit mode the world's packet to a
// node port the audit view denies passes and is translated, and the
// audited rule's counter counts the connection (once: its next packet is
// a known flow).
func TestPrivilegedHostFirewallAudit(t *testing.T) {
	n := newNodePortNode(t)
	setHostFirewall(t, n, maps.FlagAuditIngress)
	// What the agent writes for a host policy in audit mode: the audit
	// view allows the peer pods; nothing is enforced; the audit cookie
	// names the rule for flows no entry allows.
	hostPolicy(t, n, maps.DirIngress, idPeerPod, 0, 0, maps.PolicyValue{Cookie: hostRuleAudit, Flags: maps.PolicyFlagENone})
	hostPolicy(t, n, maps.DirIngress, 0, maps.PolicyAuditCookieProto, 0, maps.PolicyValue{Cookie: hostRuleAudit, Flags: maps.PolicyFlagENone | maps.PolicyFlagANone})

	for i := range 2 {
		ret, out := n.ingress(frame(client, node, protoTCP, 40000, npLocal, 0))
		if ret != 0 {
			t.Fatalf("packet %d: audit mode dropped the world's packet to a node port (verdict %d)", i, ret)
		}
		if src, dst := tuple(out); dst != ap(pod, backendPort) {
			t.Fatalf("packet %d: %s -> %s, want translated to %s", i, src, dst, ap(pod, backendPort))
		}
	}
	counts, err := n.l.Maps().AuditMap().Dump()
	if err != nil {
		t.Fatal(err)
	}
	if counts[hostRuleAudit] != 1 {
		t.Fatalf("audit counts %v, want 1 connection under rule %d", counts, hostRuleAudit)
	}
	if got := n.metric(maps.ReasonPolicyDenied, maps.DirIngress); got != 0 {
		t.Fatalf("audit mode counted %d policy drops", got)
	}
}

// TestPrivilegedHostFirewallRevokedFlow: a flow the host policy admitted
// keeps passing as a known flow after its allow turned into a deny, until
// the agent revokes the node's side of its conntrack entry
// (agentpolicy's revokeHostFlows, under maps.HostFirewallCTID); from then
// on each packet meets the policy as new and is dropped. The same flow's
// entry for a pod's side would not be touched by it.
func TestPrivilegedHostFirewallRevokedFlow(t *testing.T) {
	n := newNodePortNode(t)
	setHostFirewall(t, n, maps.FlagEnforceIngress)
	hostPolicy(t, n, maps.DirIngress, 0, protoTCP, 22, maps.PolicyValue{Cookie: hostRuleAllow})
	if ret, _ := n.ingress(frame(world, node, protoTCP, 40000, 22, 0)); ret != 0 {
		t.Fatalf("world to an allowed port of the node: verdict %d", ret)
	}
	// The policy changes: the port is denied. The established flow still
	// passes (policy is checked once per flow).
	hostPolicy(t, n, maps.DirIngress, 0, protoTCP, 22, maps.PolicyValue{Cookie: hostRuleAllow, Deny: true})
	if ret, _ := n.ingress(frame(world, node, protoTCP, 40000, 22, 0)); ret != 0 {
		t.Fatalf("established flow before revocation: verdict %d, want pass", ret)
	}
	ct := n.l.Maps().CTMap()
	flow := maps.CTEntry{Proto: protoTCP, Src: world, SrcPort: 40000, Dst: node, DstPort: 22}
	if ok, err := ct.Revoke(flow, 7); err != nil || ok {
		t.Fatalf("revoking a pod's side on the node's flow: %v, %v, want nothing revoked", ok, err)
	}
	if ok, err := ct.Revoke(flow, maps.HostFirewallCTID); err != nil || !ok {
		t.Fatalf("revoking the node's side: %v, %v", ok, err)
	}
	drops := n.metric(maps.ReasonPolicyDenyRule, maps.DirIngress)
	for i := range 2 {
		if ret, _ := n.ingress(frame(world, node, protoTCP, 40000, 22, 0)); ret != tcActShot {
			t.Fatalf("packet %d of the revoked flow: verdict %d, want drop", i, ret)
		}
	}
	if got := n.metric(maps.ReasonPolicyDenyRule, maps.DirIngress); got != drops+2 {
		t.Fatalf("deny-rule drops %d, want %d", got, drops+2)
	}
	// Allowed again: the flow passes, checked as new each packet (its
	// admission stays revoked) yet let through by the allow.
	hostPolicy(t, n, maps.DirIngress, 0, protoTCP, 22, maps.PolicyValue{Cookie: hostRuleAllow})
	if ret, _ := n.ingress(frame(world, node, protoTCP, 40000, 22, 0)); ret != 0 {
		t.Fatalf("revoked flow once allowed again: verdict %d", ret)
	}
}

const protoGRE = 47

// laterFragment turns an IPv4 frame into a later fragment of its datagram
// (fragment offset 8 bytes), the header checksum fixed.
func laterFragment(f []byte) []byte {
	f = append([]byte(nil), f...)
	binary.BigEndian.PutUint16(f[20:], 1)
	binary.BigEndian.PutUint16(f[24:], 0)
	binary.BigEndian.PutUint16(f[24:], ^sum16(0, f[14:34]))
	return f
}

// TestPrivilegedHostFirewallEveryProtocol: a host policy that enforces a
// direction leaves no IP protocol open: GRE and an ICMP type other than
// echo meet the policy (an L3 allow of the peer's identity admits them, a
// TCP port allow does not), each way; a GRE flow the node started gets
// its reply in. What must pass for the network to work passes unchecked:
// IPv6 neighbour discovery, later fragments.
func TestPrivilegedHostFirewallEveryProtocol(t *testing.T) {
	n := newNodePortNode(t)
	setHostFirewall(t, n, maps.FlagEnforceIngress|maps.FlagEnforceEgress)
	hostPolicy(t, n, maps.DirIngress, 0, protoTCP, 22, maps.PolicyValue{Cookie: hostRuleAllow})
	hostPolicy(t, n, maps.DirIngress, idPeerPod, 0, 0, maps.PolicyValue{Cookie: hostRuleAllow})
	hostPolicy(t, n, maps.DirEgress, idPeerPod, 0, 0, maps.PolicyValue{Cookie: hostRuleAllow})

	for _, tc := range []struct {
		what string
		ret  uint32
		f    []byte
	}{
		{"GRE from the world (only TCP 22 allowed)", tcActShot, frame(world, node, protoGRE, 0, 0, 0)},
		{"ICMP timestamp request from the world", tcActShot, frame(world, node, protoICMP, 7, 0, 13)},
		{"GRE from a peer pod (L3 allow)", 0, frame(peerPod, node, protoGRE, 0, 0, 0)},
		{"ICMP timestamp request from a peer pod (L3 allow)", 0, frame(peerPod, node, protoICMP, 7, 0, 13)},
		{"a later fragment from the world", 0, laterFragment(frame(world, node, protoUDP, 40000, 9999, 0))},
		{"ICMPv6 neighbour solicitation from the world", 0, frame6(client6, node6, protoICMPv6, 0, 0, 135)},
		{"ICMPv6 type 200 from the world", tcActShot, frame6(client6, node6, protoICMPv6, 0, 0, 200)},
	} {
		if ret, _ := n.ingress(tc.f); ret != tc.ret {
			t.Errorf("%s: verdict %d, want %d", tc.what, ret, tc.ret)
		}
	}
	if ret, _ := n.egress(frame(node, world, protoGRE, 0, 0, 0)); ret != tcActShot {
		t.Errorf("GRE from the node to the world (egress allows only peer pods): verdict %d, want drop", ret)
	}
	// The node's GRE flow to a peer it may reach: the reply gets in,
	// though ingress allows GRE only from the peer pods' identity, as
	// here, or by conntrack.
	hostPolicy(t, n, maps.DirEgress, 0, protoGRE, 0, maps.PolicyValue{Cookie: hostRuleAllow})
	if ret, _ := n.egress(frame(node, world, protoGRE, 0, 0, 0)); ret != 0 {
		t.Fatalf("GRE from the node once allowed: verdict %d", ret)
	}
	if ret, _ := n.ingress(frame(world, node, protoGRE, 0, 0, 0)); ret != 0 {
		t.Errorf("GRE reply from the world to the node's flow: verdict %d, want pass (conntrack)", ret)
	}
}

// withExtHeaders returns the IPv6 frame f (Ethernet first) with n
// destination-options headers (8 bytes each, PadN) between its IPv6
// header and its L4 header.
func withExtHeaders(f []byte, n int) []byte {
	const ip6 = 14
	next := f[ip6+6]
	out := append([]byte{}, f[:ip6+40]...)
	out[ip6+6] = 60 // destination options
	for i := 0; i < n; i++ {
		nh := byte(60)
		if i == n-1 {
			nh = next
		}
		out = append(out, nh, 0, 1, 4, 0, 0, 0, 0)
	}
	out = append(out, f[ip6+40:]...)
	plen := binary.BigEndian.Uint16(f[ip6+4:]) + uint16(8*n)
	binary.BigEndian.PutUint16(out[ip6+4:], plen)
	return out
}

// TestPrivilegedHostFirewallUnparsed: a packet the parser cannot read
// cannot be judged by the host policy, so while ingress is enforced it is
// dropped and counted with the parser's reason, at the uplink and at the
// WireGuard device: an IPv6 packet whose TCP header sits behind five
// extension headers (the parser walks four) to a port the policy does not
// allow, and an IPv4 first fragment too short to hold its TCP header.
// Before, both passed unchecked to the stack, which delivers them. With
// the host firewall off they pass, as does a frame of no IP family.
func TestPrivilegedHostFirewallUnparsed(t *testing.T) {
	n := newNodePortNode(t)
	setHostFirewall(t, n, maps.FlagEnforceIngress)
	hostPolicy(t, n, maps.DirIngress, idPeerPod, 0, 0, maps.PolicyValue{Cookie: hostRuleAllow})

	deep := withExtHeaders(frame6(client6, node6, protoTCP, 40010, 22, 0), 5)
	malformed := n.metric(maps.ReasonMalformed, maps.DirIngress)
	if ret, _ := n.ingress(deep); ret != tcActShot {
		t.Fatalf("IPv6 to the node's TCP 22 behind 5 extension headers: verdict %d, want drop", ret)
	}
	if got := n.metric(maps.ReasonMalformed, maps.DirIngress); got != malformed+1 {
		t.Fatalf("malformed drops %d, want %d", got, malformed+1)
	}
	if ret := n.fromWireGuard(l3(deep)); ret != tcActShot {
		t.Fatalf("the same through the WireGuard device: verdict %d, want drop", ret)
	}
	if got := n.metric(maps.ReasonMalformed, maps.DirIngress); got != malformed+2 {
		t.Fatalf("malformed drops %d, want %d", got, malformed+2)
	}
	// Four extension headers are parsed: the policy decides (TCP 22 is
	// not allowed for the world).
	denied := n.metric(maps.ReasonPolicyDenied, maps.DirIngress)
	if ret, _ := n.ingress(withExtHeaders(frame6(client6, node6, protoTCP, 40011, 22, 0), 4)); ret != tcActShot {
		t.Fatalf("IPv6 behind 4 extension headers: verdict %d, want drop", ret)
	}
	if got := n.metric(maps.ReasonPolicyDenied, maps.DirIngress); got != denied+1 {
		t.Fatalf("IPv6 behind 4 extension headers: policy drops %d, want %d", got, denied+1)
	}

	// An IPv4 first fragment (more fragments) cut 8 bytes into its TCP
	// header.
	tiny := append([]byte{}, frame(client, node, protoTCP, 40012, 22, 0)[:14+20+8]...)
	binary.BigEndian.PutUint16(tiny[14+2:], 28)
	tiny[14+6] |= 0x20 // more fragments; offset 0 (the IP checksum is not checked here)
	truncated := n.metric(maps.ReasonTruncated, maps.DirIngress)
	if ret, _ := n.ingress(tiny); ret != tcActShot {
		t.Fatalf("IPv4 first fragment without its TCP header: verdict %d, want drop", ret)
	}
	if got := n.metric(maps.ReasonTruncated, maps.DirIngress); got != truncated+1 {
		t.Fatalf("truncated drops %d, want %d", got, truncated+1)
	}

	// Not an IP packet: the host's business.
	lldp := append([]byte{}, frame(client, node, protoTCP, 40013, 22, 0)...)
	binary.BigEndian.PutUint16(lldp[12:], 0x88cc)
	if ret, _ := n.ingress(lldp); ret != 0 {
		t.Fatalf("an LLDP frame: verdict %d, want pass", ret)
	}

	setHostFirewall(t, n, 0)
	if ret, _ := n.ingress(deep); ret != 0 {
		t.Fatalf("host firewall off: IPv6 behind 5 extension headers: verdict %d, want pass", ret)
	}
}
