package policy

import (
	"net/netip"
	"testing"

	"github.com/tendril-net/tendril/pkg/identity"
)

// toFQDNs select only the CIDR identities learned for their names; a
// toFQDNs section with ports is not an L4-only (any peer) section; a port
// with DNS rules or HTTP rules is open to the peer, through the proxy
// (TestL7RedirectEntries).
func TestFQDNSelection(t *testing.T) {
	world := Peer{ID: identity.LocalScope | 10, Labels: []string{"cidr:192.0.2.10/32"}, CIDR: netip.MustParsePrefix("192.0.2.10/32"), Names: []string{"world.example."}}
	api1 := Peer{ID: identity.LocalScope | 11, Labels: []string{"cidr:192.0.2.11/32"}, CIDR: netip.MustParsePrefix("192.0.2.11/32"), Names: []string{"api-1.example."}}
	other := Peer{ID: identity.LocalScope | 12, Labels: []string{"cidr:192.0.2.12/32"}, CIDR: netip.MustParsePrefix("192.0.2.12/32"), Names: []string{"other.test."}}
	// A pod identity whose labels happen to carry no CIDR: never an FQDN peer.
	named := Peer{ID: 1500, Labels: []string{"k8s:app=z", NamespaceLabel + "=x"}, Names: []string{"world.example"}}
	u := append(universe(), world, api1, other, named)
	repo := NewRepository()
	if _, err := repo.Add(mustRules(t, `[{"endpointSelector":{"matchLabels":{"app":"a"}},"egress":[
	  {"toEndpoints":[{"matchLabels":{"app":"b"}}],"toPorts":[{"ports":[{"port":"53","protocol":"UDP"}],"rules":{"dns":[{"matchPattern":"*.example"}]}}]},
	  {"toFQDNs":[{"matchName":"WORLD.example"},{"matchPattern":"api-*.example"}],"toPorts":[{"ports":[{"port":"80","protocol":"TCP"}]}]},
	  {"toEndpoints":[{"matchLabels":{"app":"b"}}],"toPorts":[{"ports":[{"port":"8080","protocol":"TCP"}],"rules":{"http":[{"method":"GET"}]}}]}
	]}]`), "x", "t", false); err != nil {
		t.Fatal(err)
	}
	for _, useCache := range []bool{false, true} {
		var res Result
		if useCache {
			res = repo.ResolveCached(Endpoint{Labels: xa.Labels}, u, 1, NewSelectorCache())
		} else {
			res = repo.Resolve(Endpoint{Labels: xa.Labels}, u)
		}
		for _, c := range []struct {
			name  string
			id    identity.NumericIdentity
			proto uint8
			port  uint16
			want  bool
		}{
			{"learned name", world.ID, 6, 80, true},
			{"learned name, other port", world.ID, 6, 443, false},
			{"pattern", api1.ID, 6, 80, true},
			{"name not selected", other.ID, 6, 80, false},
			{"not a CIDR identity", named.ID, 6, 80, false},
			{"unrelated pod on the FQDN port", xb.ID, 6, 80, false},
			{"the world on the FQDN port", identity.World, 6, 80, false},
			{"DNS port open at L4", xb.ID, 17, 53, true},
			{"HTTP-rule port open, through the proxy", xb.ID, 6, 8080, true},
		} {
			got, _ := res.MapState.Allowed(Egress, c.id, c.proto, c.port)
			if got != c.want {
				t.Errorf("cache=%v %s: allowed = %v, want %v", useCache, c.name, got, c.want)
			}
		}
	}
}

// A CIDR identity that gains a name (the DNS proxy learned it) is selected
// by a cached toFQDNs selection on the next universe: names are part of
// what makes a peer changed.
func TestFQDNSelectionCachedNameLearned(t *testing.T) {
	repo := NewRepository()
	if _, err := repo.Add(mustRules(t, `[{"endpointSelector":{"matchLabels":{"app":"a"}},"egress":[
	  {"toFQDNs":[{"matchName":"world.example"}],"toPorts":[{"ports":[{"port":"80","protocol":"TCP"}]}]}]}]`), "x", "t", false); err != nil {
		t.Fatal(err)
	}
	peer := Peer{ID: identity.LocalScope | 10, Labels: []string{"cidr:192.0.2.10/32"}, CIDR: netip.MustParsePrefix("192.0.2.10/32")}
	c := NewSelectorCache()
	ep := Endpoint{Labels: xa.Labels}
	res := repo.ResolveCached(ep, append(universe(), peer), 1, c)
	if ok, _ := res.MapState.Allowed(Egress, peer.ID, 6, 80); ok {
		t.Fatal("allowed before the name was learned")
	}
	peer.Names = []string{"world.example."}
	res = repo.ResolveCached(ep, append(universe(), peer), 2, c)
	if ok, _ := res.MapState.Allowed(Egress, peer.ID, 6, 80); !ok {
		t.Fatal("not allowed after the name was learned")
	}
	peer.Names = nil
	res = repo.ResolveCached(ep, append(universe(), peer), 3, c)
	if ok, _ := res.MapState.Allowed(Egress, peer.ID, 6, 80); ok {
		t.Fatal("still allowed after the name expired")
	}
}
