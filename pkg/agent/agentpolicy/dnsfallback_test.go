package agentpolicy

import (
	"log/slog"
	"maps"
	"strings"
	"testing"

	bpfmaps "github.com/tendril-net/tendril/pkg/datapath/maps"
	"github.com/tendril-net/tendril/pkg/endpoint"
	"github.com/tendril-net/tendril/pkg/fqdn/dnsfallback"
)

// fakeDNSFallbackMap is the DNS fallback map in memory, recording every
// state it passes through.
type fakeDNSFallbackMap struct {
	entries map[bpfmaps.DNSFallbackKey]struct{}
	states  []map[bpfmaps.DNSFallbackKey]struct{}
	dumps   int // walks of the whole map
}

func (f *fakeDNSFallbackMap) Dump() (map[uint16][]bpfmaps.DNSFallbackKey, error) {
	f.dumps++
	out := map[uint16][]bpfmaps.DNSFallbackKey{}
	for k := range f.entries {
		out[k.EndpointID] = append(out[k.EndpointID], k)
	}
	return out, nil
}

func (f *fakeDNSFallbackMap) Has(k bpfmaps.DNSFallbackKey) (bool, error) {
	_, ok := f.entries[k]
	return ok, nil
}

func (f *fakeDNSFallbackMap) Put(k bpfmaps.DNSFallbackKey) error {
	f.entries[k] = struct{}{}
	f.states = append(f.states, maps.Clone(f.entries))
	return nil
}

func (f *fakeDNSFallbackMap) Delete(k bpfmaps.DNSFallbackKey) error {
	delete(f.entries, k)
	f.states = append(f.states, maps.Clone(f.entries))
	return nil
}

// fallbackPasses is the datapath's decision (bpf/lib/dnsfb.h) for a
// query of name by endpoint ep under state.
func fallbackPasses(state map[bpfmaps.DNSFallbackKey]struct{}, ep uint16, name string) bool {
	has := func(kind uint8, h uint64) bool {
		_, ok := state[bpfmaps.DNSFallbackKey{EndpointID: ep, Kind: kind, Hash: h}]
		return ok
	}
	if has(bpfmaps.DNSFallbackAll, 0) || !has(bpfmaps.DNSFallbackFilter, 0) {
		return true
	}
	w, err := dnsfallback.Wire(name)
	if err != nil {
		return false
	}
	if has(bpfmaps.DNSFallbackName, dnsfallback.Hash(w)) {
		return true
	}
	rest := w[1+int(w[0]):]
	return len(rest) > 1 && has(bpfmaps.DNSFallbackSuffix, dnsfallback.Hash(rest))
}

func dnsRule(dns string) string {
	if dns == "" {
		return `[{"endpointSelector":{"matchLabels":{"app":"web"}},"egress":[{"toEntities":["world"]}]}]`
	}
	return `[{"endpointSelector":{"matchLabels":{"app":"web"}},"egress":[{"toEntities":["world"],"toPorts":[{"ports":[{"port":"53","protocol":"UDP"}],"rules":{"dns":[` + dns + `]}}]}]}]`
}

// TestRealizeDNSFallback: the DNS fallback's entries follow the
// endpoint's DNS rules (names, *.rest, a pattern beyond the map making
// every name pass, no DNS rule leaving no entry), no state in between
// lets through a name that neither the old nor the new rules let
// through, a restarted agent's module reads the pinned entries back and
// rewrites nothing that stays, and removing the endpoint removes them.
func TestRealizeDNSFallback(t *testing.T) {
	fm := &fakeDNSFallbackMap{entries: map[bpfmaps.DNSFallbackKey]struct{}{}}
	m := newTestModule(t)
	m.dnsfb, m.dnsfbAllLogged, m.dnsfbMap = map[uint16]dnsfbSet{}, map[uint16]string{}, fm
	ep := &endpoint.Endpoint{ID: 9, Labels: []string{"k8s:app=web"}}
	probes := []string{"a.example", "A.Example", "b.example", "x.example.org", "example.org", "api-1.example", "other.test"}

	steps := []struct {
		name string
		dns  string
		pass []string // the probes that pass afterwards
	}{
		{"names and a suffix", `{"matchName":"a.example"},{"matchPattern":"*.example.org"}`, []string{"a.example", "A.Example", "x.example.org"}},
		{"another name", `{"matchName":"b.example"},{"matchPattern":"*.example.org"}`, []string{"b.example", "x.example.org"}},
		{"a pattern beyond the map", `{"matchName":"b.example"},{"matchPattern":"api-*.example"}`, probes},
		{"names again", `{"matchName":"a.example"}`, []string{"a.example", "A.Example"}},
		{"no DNS rule", ``, probes},
		{"names once more", `{"matchName":"other.test"}`, []string{"other.test"}},
	}
	prev := map[string]bool{}
	for _, p := range probes {
		prev[p] = true // no entries: everything passes
	}
	for _, s := range steps {
		setRules(t, m, dnsRule(s.dns))
		fm.states = nil
		if err := m.Realize(t.Context(), ep, newFakePolicyMap(0)); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		now := map[string]bool{}
		for _, p := range s.pass {
			now[p] = true
		}
		for _, p := range probes {
			if got := fallbackPasses(fm.entries, ep.ID, p); got != now[p] {
				t.Errorf("%s: %s passes %v, want %v", s.name, p, got, now[p])
			}
			for i, st := range fm.states {
				if fallbackPasses(st, ep.ID, p) && !prev[p] && !now[p] {
					t.Errorf("%s: write %d lets %s through, which neither the old nor the new rules do", s.name, i, p)
				}
			}
		}
		prev = now
	}

	// A restarted agent: the pinned entries stay as they are.
	before := maps.Clone(fm.entries)
	m2 := newTestModule(t)
	m2.dnsfb, m2.dnsfbAllLogged, m2.dnsfbMap = map[uint16]dnsfbSet{}, map[uint16]string{}, fm
	setRules(t, m2, dnsRule(`{"matchName":"other.test"}`))
	fm.states = nil
	if err := m2.Realize(t.Context(), ep, newFakePolicyMap(0)); err != nil {
		t.Fatal(err)
	}
	if len(fm.states) != 0 || !maps.Equal(before, fm.entries) {
		t.Errorf("the restarted module rewrote the pinned entries: %d writes, %v -> %v", len(fm.states), before, fm.entries)
	}

	if err := m2.Remove(ep, newFakePolicyMap(0)); err != nil {
		t.Fatal(err)
	}
	if len(fm.entries) != 0 {
		t.Errorf("entries left after the endpoint's removal: %v", fm.entries)
	}
}

// TestDNSFallbackRestartWalksOnce: after a restart, the first
// realization of many endpoints walks the pinned map once (not once per
// endpoint), each keeps its pinned entries without a rewrite, and an
// endpoint whose entries went after the walk (the loader's purge of an
// endpoint that was not restored, its ID then reused) gets its entries
// and filter marker written, not taken as present from the stale walk.
func TestDNSFallbackRestartWalksOnce(t *testing.T) {
	fm := &fakeDNSFallbackMap{entries: map[bpfmaps.DNSFallbackKey]struct{}{}}
	m := newTestModule(t)
	m.dnsfb, m.dnsfbAllLogged, m.dnsfbMap = map[uint16]dnsfbSet{}, map[uint16]string{}, fm
	setRules(t, m, dnsRule(`{"matchName":"a.example"}`))
	const n = 50
	eps := make([]*endpoint.Endpoint, n)
	for i := range eps {
		eps[i] = &endpoint.Endpoint{ID: uint16(100 + i), Labels: []string{"k8s:app=web"}}
		if err := m.Realize(t.Context(), eps[i], newFakePolicyMap(0)); err != nil {
			t.Fatal(err)
		}
	}
	if len(fm.entries) != 2*n {
		t.Fatalf("%d entries, want %d (a name and the filter marker each)", len(fm.entries), 2*n)
	}

	m2 := newTestModule(t)
	m2.dnsfb, m2.dnsfbAllLogged, m2.dnsfbMap = map[uint16]dnsfbSet{}, map[uint16]string{}, fm
	setRules(t, m2, dnsRule(`{"matchName":"a.example"}`))
	fm.dumps, fm.states = 0, nil
	// The first endpoint's realization walks the map...
	if err := m2.Realize(t.Context(), eps[0], newFakePolicyMap(0)); err != nil {
		t.Fatal(err)
	}
	// ...then the loader purges the last one's entries, as for an
	// endpoint that was not restored, and its ID comes back.
	gone := eps[n-1].ID
	for k := range fm.entries {
		if k.EndpointID == gone {
			delete(fm.entries, k)
		}
	}
	for _, ep := range eps[1:] {
		if err := m2.Realize(t.Context(), ep, newFakePolicyMap(0)); err != nil {
			t.Fatal(err)
		}
	}
	if fm.dumps != 1 {
		t.Errorf("%d walks of the pinned map for %d endpoints, want 1", fm.dumps, n)
	}
	if len(fm.states) != 2 {
		t.Errorf("%d writes, want 2 (the purged endpoint's name and marker; the rest kept as pinned)", len(fm.states))
	}
	for _, ep := range eps {
		if fallbackPasses(fm.entries, ep.ID, "b.example") || !fallbackPasses(fm.entries, ep.ID, "a.example") {
			t.Errorf("endpoint %d: b.example passes %v, a.example %v; want false, true",
				ep.ID, fallbackPasses(fm.entries, ep.ID, "b.example"), fallbackPasses(fm.entries, ep.ID, "a.example"))
		}
	}
}

// TestDNSFallbackUnexpressedLoggedOnce: a pattern beyond the map is
// named in one warning, not one per regeneration.
func TestDNSFallbackUnexpressedLoggedOnce(t *testing.T) {
	var logs strings.Builder
	fm := &fakeDNSFallbackMap{entries: map[bpfmaps.DNSFallbackKey]struct{}{}}
	m := newTestModule(t)
	m.log = slog.New(slog.NewTextHandler(&logs, nil))
	m.dnsfb, m.dnsfbAllLogged, m.dnsfbMap = map[uint16]dnsfbSet{}, map[uint16]string{}, fm
	ep := &endpoint.Endpoint{ID: 4, Labels: []string{"k8s:app=web"}}
	setRules(t, m, dnsRule(`{"matchPattern":"api-*.example"}`))
	for range 3 {
		if err := m.Realize(t.Context(), ep, newFakePolicyMap(0)); err != nil {
			t.Fatal(err)
		}
	}
	if n := strings.Count(logs.String(), "beyond the datapath's fallback"); n != 1 {
		t.Errorf("%d warnings, want 1:\n%s", n, logs.String())
	}
}
