package loader

import (
	"testing"

	"github.com/tendril-net/tendril/pkg/datapath/maps"
)

// TestPrivilegedConntrackRevokedSide: an established flow passes a new
// deny rule (policy is checked once per flow); once the agent revokes the
// endpoint's side of its entry, the peer's next packet goes through the
// policy and is dropped by the rule, the endpoint's own packet of the
// flow (its egress is not enforced) still passes but does not admit the
// flow back, and the peer's packets stay dropped.
func TestPrivilegedConntrackRevokedSide(t *testing.T) {
	n := newTestNode(t)
	n.addEndpoints(true, false)
	const syn, ack = 0x02, 0x10
	n.allow(1, maps.DirIngress, idRemote, 6, 8080)
	in := func(flags uint8) []byte {
		return packet(remote, podA, l4{proto: 6, sport: 50000, dport: 8080, tcpFlags: flags})
	}
	out := packet(podA, remote, l4{proto: 6, sport: 8080, dport: 50000, tcpFlags: syn | ack})
	if got := n.toPod(n.ifidx, in(syn)); got != actOK {
		t.Fatalf("SYN under the allow = %d", got)
	}
	if got := n.fromPod(n.ifidx, out); got != actOK {
		t.Fatalf("SYN-ACK = %d", got)
	}
	// The deny replaces the allow's entry, as the agent's resolution
	// writes it (a longer allow would win the trie's lookup).
	if err := n.l.Maps().PolicyMap().Upsert(maps.PolicyKey{EndpointID: 1, Direction: maps.DirIngress, Identity: idRemote, Proto: 6, Port: 8080, PortPrefixLen: 16}, maps.PolicyValue{Deny: true}); err != nil {
		t.Fatal(err)
	}
	if got := n.toPod(n.ifidx, in(ack)); got != actOK {
		t.Fatalf("established packet after the deny, before the revocation = %d (policy is checked once per flow)", got)
	}
	entries := n.ctEntries(1)
	if len(entries) != 1 {
		t.Fatalf("entries: %+v", entries)
	}
	if ok, err := n.l.Maps().CTMap().Revoke(entries[0], 1); err != nil || !ok {
		t.Fatalf("revoke = %v %v", ok, err)
	}
	denied := n.metric(maps.ReasonPolicyDenyRule, maps.DirIngress)
	if got := n.toPod(n.ifidx, in(ack)); got != actShot {
		t.Fatalf("peer's packet after the revocation = %d, want drop", got)
	}
	if n.metric(maps.ReasonPolicyDenyRule, maps.DirIngress) != denied+1 {
		t.Error("the drop is not counted under the deny rule")
	}
	if got := n.fromPod(n.ifidx, out); got != actOK {
		t.Fatalf("the endpoint's own packet (egress not enforced) = %d", got)
	}
	e, ok, err := n.l.Maps().CTMap().Lookup(entries[0])
	if err != nil || !ok || e.DstEndpoint != 0 || !e.DstRevoked {
		t.Fatalf("entry after the endpoint's packet: %+v found=%v %v (it must stay revoked, unnamed)", e, ok, err)
	}
	if got := n.toPod(n.ifidx, in(ack)); got != actShot {
		t.Fatalf("peer's packet after the endpoint's own = %d, want drop (not admitted back)", got)
	}
}
