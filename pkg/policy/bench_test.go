package policy

import (
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/tendril-net/tendril/pkg/identity"
	"github.com/tendril-net/tendril/pkg/policy/api"
)

// benchCluster: 5,000 identities (50 apps × 20 namespaces × 5 tiers), 200
// rules each selecting one app and allowing ingress from another app on a
// port, 1,000 endpoints.
func benchCluster(b testing.TB) (*Repository, Universe, []Endpoint) {
	u := ReservedPeers()
	for i := 0; i < 5000; i++ {
		u = append(u, Peer{ID: identity.NumericIdentity(256 + i), Labels: []string{
			fmt.Sprintf("k8s:app=app%d", i%50), fmt.Sprintf("%s=ns%d", NamespaceLabel, (i/50)%20), fmt.Sprintf("k8s:tier=t%d", i/1000),
		}})
	}
	repo := NewRepository()
	for i := 0; i < 200; i++ {
		doc := fmt.Sprintf(`[{"endpointSelector":{"matchLabels":{"app":"app%d"}},"ingress":[{"fromEndpoints":[{"matchLabels":{"app":"app%d"}}],"toPorts":[{"ports":[{"port":"%d","protocol":"TCP"}]}]}],"egress":[{"toEndpoints":[{"matchLabels":{"app":"app%d"}}]}]}]`,
			i%50, (i+1)%50, 8000+i, (i+2)%50)
		rules, err := parseForBench(doc)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := repo.Add(rules, "", "bench", false); err != nil {
			b.Fatal(err)
		}
	}
	eps := make([]Endpoint, 1000)
	for i := range eps {
		eps[i] = Endpoint{Labels: u[10+i*5].Labels}
	}
	return repo, u, eps
}

// BenchmarkInitialResolution resolves all 1,000 endpoints from scratch.
func BenchmarkInitialResolution(b *testing.B) {
	repo, u, eps := benchCluster(b)
	b.ResetTimer()
	entries := 0
	for i := 0; i < b.N; i++ {
		cache := NewSelectorCache()
		entries = 0
		for _, ep := range eps {
			entries += len(repo.ResolveCached(ep, u, 1, cache).MapState)
		}
	}
	b.ReportMetric(float64(entries), "entries")
}

// BenchmarkNewIdentity adds one identity and re-resolves the endpoints its
// labels concern (those whose rules select app0 as a peer).
func BenchmarkNewIdentity(b *testing.B) {
	repo, u, eps := benchCluster(b)
	cache := NewSelectorCache()
	for _, ep := range eps {
		repo.ResolveCached(ep, u, 1, cache)
	}
	b.ResetTimer()
	took := make([]time.Duration, 0, b.N)
	for i := 0; i < b.N; i++ {
		begin := time.Now()
		nu := append(append(Universe{}, u...), Peer{ID: identity.NumericIdentity(60000 + i%1000), Labels: []string{"k8s:app=app0", NamespaceLabel + "=ns0", "k8s:tier=new"}})
		for _, ep := range eps[:20] { // the app49/app48 endpoints whose peers are app0
			repo.ResolveCached(ep, nu, uint64(2+i), cache)
		}
		took = append(took, time.Since(begin))
	}
	b.StopTimer()
	sort.Slice(took, func(i, j int) bool { return took[i] < took[j] })
	b.ReportMetric(float64(took[len(took)*99/100].Microseconds())/1000, "p99-ms")
}

func parseForBench(doc string) (api.Rules, error) { return api.ParseRules([]byte(doc)) }

// TestDiffIsProportionalToTheChange: adding a rule that opens one more
// port from one app to an endpoint changes exactly the entries of that
// app's identities, not the endpoint's whole map; removing it takes the
// same entries out. The agent writes only the diff to the BPF map.
func TestDiffIsProportionalToTheChange(t *testing.T) {
	repo, u, eps := benchCluster(t)
	ep := eps[0] // app0: ingress from app1 on one port, egress to app2
	cur := repo.Resolve(ep, u).MapState
	app7 := 0
	for _, p := range u {
		for _, l := range p.Labels {
			if l == "k8s:app=app7" {
				app7++
			}
		}
	}
	if app7 == 0 || len(cur) <= app7 {
		t.Fatalf("bad setup: %d app7 identities, %d entries", app7, len(cur))
	}
	rules, err := parseForBench(`[{"endpointSelector":{"matchLabels":{"app":"app0"}},"labels":["change=one"],"ingress":[{"fromEndpoints":[{"matchLabels":{"app":"app7"}}],"toPorts":[{"ports":[{"port":"9999","protocol":"TCP"}]}]}]}]`)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := repo.Add(rules, "", "test", false); err != nil {
		t.Fatal(err)
	}
	want := repo.Resolve(ep, u).MapState
	upserts, deletes := Diff(cur, want)
	if len(upserts) != app7 || len(deletes) != 0 {
		t.Fatalf("adding one rule: %d upserts, %d deletes; want %d upserts (app7's identities), 0 deletes (the map has %d entries)",
			len(upserts), len(deletes), app7, len(want))
	}
	if _, n := repo.DeleteByLabels(mustSelect(t, "change=one")); n != 1 {
		t.Fatalf("deleted %d rules", n)
	}
	back := repo.Resolve(ep, u).MapState
	upserts, deletes = Diff(want, back)
	if len(upserts) != 0 || len(deletes) != app7 {
		t.Fatalf("removing it: %d upserts, %d deletes; want 0 and %d", len(upserts), len(deletes), app7)
	}
}
