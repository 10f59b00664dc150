package agentpolicy

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/tendril-net/tendril/pkg/datapath/maps"
	"github.com/tendril-net/tendril/pkg/endpoint"
	"github.com/tendril-net/tendril/pkg/option"
)

// fakeVerdicts decides by peer address: denied, allowed, or neither.
type fakeVerdicts struct {
	deny, allow map[netip.Addr]bool
	asked       []netip.Addr
	policyIDs   []uint16
}

func (f *fakeVerdicts) verdict(ep uint16, _ uint8, peer netip.Addr, _ uint8, _ uint16) (bool, bool, error) {
	f.asked = append(f.asked, peer)
	f.policyIDs = append(f.policyIDs, ep)
	return f.deny[peer], f.allow[peer], nil
}

// fakeFlows is a conntrack table in memory.
type fakeFlows struct {
	entries []maps.CTEntry
	revoked []maps.CTEntry
	ids     []uint16
}

func (f *fakeFlows) Iterate(fn func(maps.CTEntry) bool) error {
	for _, e := range f.entries {
		if !fn(e) {
			break
		}
	}
	return nil
}

func (f *fakeFlows) Revoke(e maps.CTEntry, id uint16) (bool, error) {
	f.revoked = append(f.revoked, e)
	f.ids = append(f.ids, id)
	return true, nil
}

// TestRevokeFlows: only flows the endpoint admitted, in a direction it
// enforces, are checked, against the peer on the other side; deny mode
// ends those a deny covers, all mode also those nothing allows.
func TestRevokeFlows(t *testing.T) {
	addr := netip.MustParseAddr
	ep := &endpoint.Endpoint{ID: 5, EnforceIngress: true}
	self := addr("10.0.0.5")
	flows := []maps.CTEntry{
		{Proto: 6, Src: addr("10.0.0.1"), Dst: self, DstPort: 80, DstEndpoint: 5},             // ingress from a denied peer
		{Proto: 6, Src: addr("10.0.0.2"), Dst: self, DstPort: 80, DstEndpoint: 5},             // ingress, nothing allows it
		{Proto: 6, Src: addr("10.0.0.3"), Dst: self, DstPort: 80, DstEndpoint: 5},             // ingress, allowed
		{Proto: 6, Src: self, Dst: addr("10.0.0.1"), DstPort: 80, SrcEndpoint: 5},             // egress: not enforced
		{Proto: 6, Src: addr("10.0.0.1"), Dst: addr("10.0.0.6"), DstPort: 80, DstEndpoint: 6}, // another endpoint's
		{Proto: 6, Src: addr("10.0.0.1"), Dst: self, DstPort: 81},                             // not admitted by 5 yet
	}
	v := &fakeVerdicts{deny: map[netip.Addr]bool{addr("10.0.0.1"): true}, allow: map[netip.Addr]bool{addr("10.0.0.3"): true}}
	for _, tc := range []struct {
		mode string
		want []int
	}{{option.RevokeDeny, []int{0}}, {option.RevokeAll, []int{0, 1}}} {
		ct := &fakeFlows{entries: flows}
		v.asked = nil
		n, err := revokeFlows(endpointSide(ep), tc.mode, v, ct)
		if err != nil {
			t.Fatal(err)
		}
		var want []maps.CTEntry
		for _, i := range tc.want {
			want = append(want, flows[i])
		}
		if n != len(want) || !slices.Equal(ct.revoked, want) {
			t.Errorf("%s: ended %d %v, want %v", tc.mode, n, ct.revoked, want)
		}
		if want := []netip.Addr{addr("10.0.0.1"), addr("10.0.0.2"), addr("10.0.0.3")}; !slices.Equal(v.asked, want) {
			t.Errorf("%s: peers checked %v, want %v", tc.mode, v.asked, want)
		}
	}
}

// TestRevokeHostFlows: the node's side of a flow is the host firewall's
// conntrack ID; its flows are decided by the host endpoint's policy
// entries and revoked under the conntrack ID, never a pod's flows.
func TestRevokeHostFlows(t *testing.T) {
	addr := netip.MustParseAddr
	node := addr("192.168.0.1")
	flows := []maps.CTEntry{
		{Proto: 6, Src: addr("203.0.113.1"), Dst: node, DstPort: 30080, DstEndpoint: maps.HostFirewallCTID},        // the world into the node, now denied
		{Proto: 6, Src: addr("203.0.113.2"), Dst: node, DstPort: 30080, DstEndpoint: maps.HostFirewallCTID},        // still allowed
		{Proto: 6, Src: node, Dst: addr("203.0.113.1"), DstPort: 443, SrcEndpoint: maps.HostFirewallCTID},          // egress: not enforced
		{Proto: 6, Src: addr("203.0.113.1"), Dst: addr("10.0.0.5"), DstPort: 80, DstEndpoint: 5},                   // a pod's
		{Proto: 6, Src: addr("203.0.113.1"), Dst: addr("10.0.0.5"), DstPort: 80, DstEndpoint: maps.HostEndpointID}, // no side named
	}
	v := &fakeVerdicts{deny: map[netip.Addr]bool{addr("203.0.113.1"): true}, allow: map[netip.Addr]bool{addr("203.0.113.2"): true}}
	ct := &fakeFlows{entries: flows}
	side := revokeSide{ctID: maps.HostFirewallCTID, policyID: maps.HostEndpointID, ingress: true}
	n, err := revokeFlows(side, option.RevokeDeny, v, ct)
	if err != nil {
		t.Fatal(err)
	}
	if n != 1 || !slices.Equal(ct.revoked, flows[:1]) || !slices.Equal(ct.ids, []uint16{maps.HostFirewallCTID}) {
		t.Errorf("ended %d %v under %v, want the first flow under %d", n, ct.revoked, ct.ids, maps.HostFirewallCTID)
	}
	if want := []uint16{maps.HostEndpointID, maps.HostEndpointID}; !slices.Equal(v.policyIDs, want) {
		t.Errorf("decided under policy IDs %v, want %v", v.policyIDs, want)
	}
}

// TestNeedsWalk: deny mode walks after a deny landed, all mode after any
// revocation, none never.
func TestNeedsWalk(t *testing.T) {
	for _, tc := range []struct {
		mode    string
		pending revokeKind
		want    bool
	}{
		{option.RevokeDeny, revokeDenied, true},
		{option.RevokeDeny, revokeAllowGone, false},
		{option.RevokeAll, revokeAllowGone, true},
		{option.RevokeAll, 0, false},
		{option.RevokeNone, revokeDenied | revokeAllowGone, false},
	} {
		if got := needsWalk(tc.mode, tc.pending); got != tc.want {
			t.Errorf("needsWalk(%s, %d) = %v", tc.mode, tc.pending, got)
		}
	}
}

// TestRealizeMarksRevocations: a change that adds a deny marks the
// endpoint for a deny walk; one that only removes an allow marks it for
// an all walk alone.
func TestRealizeMarksRevocations(t *testing.T) {
	m := newTestModule(t)
	ep := &endpoint.Endpoint{ID: 4, Labels: []string{"k8s:app=web"}}
	fm := newFakePolicyMap(0)
	setRules(t, m, portsRule(true, false, 1000, 1))
	if err := m.Realize(t.Context(), ep, fm); err != nil {
		t.Fatal(err)
	}
	m.revoke[ep.ID] = 0
	setRules(t, m, portsRule(false, false, 1000, 1))
	if err := m.Realize(t.Context(), ep, fm); err != nil {
		t.Fatal(err)
	}
	if got := m.revoke[ep.ID]; got != revokeAllowGone {
		t.Errorf("after an allow went: %d, want revokeAllowGone", got)
	}
	m.revoke[ep.ID] = 0
	setRules(t, m, portsRule(false, true, 1000, 1))
	if err := m.Realize(t.Context(), ep, fm); err != nil {
		t.Fatal(err)
	}
	if got := m.revoke[ep.ID]; got&revokeDenied == 0 {
		t.Errorf("after a deny landed: %d, want revokeDenied", got)
	}
}
