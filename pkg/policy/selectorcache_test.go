package policy

import (
	"fmt"
	"math/rand"
	"net/netip"
	"reflect"
	"testing"

	"github.com/tendril-net/tendril/pkg/identity"
)

// TestSelectorCacheIncrementalMatchesFullResolution changes the universe
// step by step (identities added, removed, relabelled, CIDR identities
// moved) and checks that resolution through the incrementally updated
// cache always equals resolution without any cache.
func TestSelectorCacheIncrementalMatchesFullResolution(t *testing.T) {
	repo := NewRepository()
	docs := []string{
		`{"endpointSelector":{"matchLabels":{"app":"web"}},"ingress":[{"fromEndpoints":[{"matchLabels":{"app":"client"}}],"toPorts":[{"ports":[{"port":"80","protocol":"TCP"}]}]},{"fromEndpoints":[{"matchExpressions":[{"key":"tier","operator":"In","values":["a","b"]}]}]}]}`,
		`{"endpointSelector":{"matchLabels":{"app":"web"}},"egress":[{"toEndpoints":[{"matchLabels":{"app":"db"}}]},{"toCIDR":["10.0.0.0/8"]},{"toEntities":["world"]}],"egressDeny":[{"toEndpoints":[{"matchLabels":{"tier":"c"}}]}]}`,
		`{"endpointSelector":{},"ingress":[{"fromEndpoints":[{"matchExpressions":[{"key":"app","operator":"Exists"}]}]}]}`,
	}
	for _, d := range docs {
		rules, err := parseForBench(d)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := repo.Add(rules, "", "test", false); err != nil {
			t.Fatal(err)
		}
	}
	apps := []string{"web", "client", "db", "other"}
	tiers := []string{"a", "b", "c"}
	rng := rand.New(rand.NewSource(1))
	mkPeer := func(id int) Peer {
		if id%7 == 0 {
			pf := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(rng.Intn(4)), 0, 0}), 16)
			return Peer{ID: identity.NumericIdentity(1<<24 | id), Labels: []string{"cidr:" + pf.String()}, CIDR: pf}
		}
		return Peer{ID: identity.NumericIdentity(256 + id), Labels: []string{
			"k8s:app=" + apps[rng.Intn(len(apps))], NamespaceLabel + "=default", "k8s:tier=" + tiers[rng.Intn(len(tiers))]}}
	}
	u := ReservedPeers()
	for i := 0; i < 40; i++ {
		u = append(u, mkPeer(i))
	}
	ep := Endpoint{Labels: []string{"k8s:app=web", NamespaceLabel + "=default", "k8s:tier=a"}}
	cache := NewSelectorCache()
	next := 40
	for step := 0; step < 300; step++ {
		nu := append(Universe{}, u...)
		switch op := rng.Intn(4); {
		case op == 0 || len(nu) < 15: // add
			nu = append(nu, mkPeer(next))
			next++
		case op == 1: // remove
			i := 10 + rng.Intn(len(nu)-10)
			nu = append(nu[:i], nu[i+1:]...)
		default: // relabel (same ID, new labels or CIDR)
			i := 10 + rng.Intn(len(nu)-10)
			fresh := mkPeer(int(nu[i].ID) - 256)
			if nu[i].CIDR.IsValid() {
				fresh = mkPeer(7 * rng.Intn(100))
			}
			fresh.ID = nu[i].ID
			nu[i] = fresh
		}
		u = nu
		got := repo.ResolveCached(ep, u, uint64(step+2), cache)
		want := repo.Resolve(ep, u)
		if !reflect.DeepEqual(got.MapState, want.MapState) {
			t.Fatalf("step %d: cached map state differs from a full resolution:\ncached %v\nfull   %v", step, got.MapState, want.MapState)
		}
	}
	if testing.Verbose() {
		fmt.Println("universe at the end:", len(u))
	}
}
