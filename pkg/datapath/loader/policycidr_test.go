package loader

import (
	"net/netip"
	"testing"

	"github.com/tendril-net/tendril/pkg/datapath/maps"
	"github.com/tendril-net/tendril/pkg/identity"
)

// A rule's CIDR selects every address in its block, pods' and nodes'
// included (Kubernetes' ipBlock): the datapath looks an in-cluster peer's
// address up in the policy CIDR map and lets the entries of the identity
// it finds decide beside the peer's own. Two peers of one identity on
// both sides of a block get different verdicts.
func TestPrivilegedPolicyCIDRSelectsInClusterAddresses(t *testing.T) {
	n := newTestNode(t)
	n.addEndpoints(true, true)
	m := n.l.Maps()
	const syn = 0x02
	tcp := func(sport, dport uint16) l4 { return l4{proto: 6, sport: sport, dport: dport, tcpFlags: syn} }
	inBlock := netip.MustParseAddr("10.2.0.9")      // idRemote, inside 10.2.0.0/26
	outBlock := netip.MustParseAddr("10.2.0.77")    // idRemote, outside it
	excepted := netip.MustParseAddr("10.2.0.42")    // idRemote, inside the except
	world := netip.MustParseAddr("203.0.113.5")     // not in the ipcache: world
	inBlock6 := netip.MustParseAddr("fd00:2::9")    // idRemote, inside fd00:2::/120
	outBlock6 := netip.MustParseAddr("fd00:2::1:9") // idRemote, outside it
	block := uint32(identity.LocalScope | identity.InClusterCIDR | 1)
	except := uint32(identity.LocalScope | identity.InClusterCIDR | 2)
	block6 := uint32(identity.LocalScope | identity.InClusterCIDR | 3)
	worldBlock := uint32(identity.LocalScope | identity.InClusterCIDR | 4)

	// A's egress allows the block's in-cluster identity on TCP 80 (and
	// the IPv6 block's, and a world block's, which must not matter).
	n.allow(1, maps.DirEgress, block, 6, 80)
	n.allow(1, maps.DirEgress, block6, 6, 80)
	n.allow(1, maps.DirEgress, worldBlock, 6, 80)

	// Without the map entries the peer's own identity decides: denied.
	if got := n.fromPod(n.ifidx, packet(podA, inBlock, tcp(40000, 80))); got != actShot {
		t.Fatalf("in-block pod without the policy CIDR entry = %d, want drop", got)
	}
	pc := m.PolicyCIDRMap()
	for p, id := range map[string]uint32{"10.2.0.0/26": block, "10.2.0.40/30": except, "fd00:2::/120": block6, "203.0.113.0/24": worldBlock} {
		if err := pc.Upsert(netip.MustParsePrefix(p), id); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		name string
		dst  netip.Addr
		port uint16
		want uint32
	}{
		{"pod inside the block", inBlock, 80, actOK},
		{"pod inside the block, other port", inBlock, 81, actShot},
		{"pod of the same identity outside the block", outBlock, 80, actShot},
		{"pod inside the block's except", excepted, 80, actShot},
		{"IPv6 pod inside the block", inBlock6, 80, actOK},
		{"IPv6 pod of the same identity outside it", outBlock6, 80, actShot},
		// A world address takes its CIDR identity from the ipcache (the
		// agent writes the prefix's world CIDR identity there); the policy
		// CIDR map is for in-cluster peers only.
		{"world address (ipcache says world)", world, 80, actShot},
	} {
		src := podA
		if c.dst.Is6() {
			src = podA6
		}
		if got := n.fromPod(n.ifidx, packet(src, c.dst, tcp(41000, c.port))); got != c.want {
			t.Errorf("%s (%s:%d) = %d, want %d", c.name, c.dst, c.port, got, c.want)
		}
	}

	// A deny naming a block wins over an allow of the peer's identity:
	// B's ingress allows A's identity, denies the block holding A's
	// address.
	n.allow(2, maps.DirIngress, idA, 6, 8080)
	if got := n.toPod(n.ifidx2, packet(podA, podB, tcp(42000, 8080))); got != actOK {
		t.Fatalf("A to B allowed by identity = %d", got)
	}
	denyBlock := uint32(identity.LocalScope | identity.InClusterCIDR | 5)
	if err := pc.Upsert(netip.MustParsePrefix("10.1.0.2/32"), denyBlock); err != nil {
		t.Fatal(err)
	}
	if err := m.PolicyMap().Upsert(maps.PolicyKey{EndpointID: 2, Direction: maps.DirIngress, Identity: denyBlock}, maps.PolicyValue{Deny: true, Cookie: 9}); err != nil {
		t.Fatal(err)
	}
	before := n.metric(maps.ReasonPolicyDenyRule, maps.DirIngress)
	if got := n.toPod(n.ifidx2, packet(podA, podB, tcp(42001, 8080))); got != actShot {
		t.Fatalf("A to B with a deny on A's address = %d, want drop", got)
	}
	if n.metric(maps.ReasonPolicyDenyRule, maps.DirIngress) != before+1 {
		t.Fatal("the block's deny not counted as a deny rule")
	}
	// Removing the entry lifts the deny.
	if err := pc.Delete(netip.MustParsePrefix("10.1.0.2/32")); err != nil {
		t.Fatal(err)
	}
	if got := n.toPod(n.ifidx2, packet(podA, podB, tcp(42002, 8080))); got != actOK {
		t.Fatalf("A to B after the block's entry went = %d", got)
	}
}
