package agentpolicy

import (
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"strings"
	"syscall"
	"testing"

	bpfmaps "github.com/tendril-net/tendril/pkg/datapath/maps"
	"github.com/tendril-net/tendril/pkg/endpoint"
	"github.com/tendril-net/tendril/pkg/identity"
	"github.com/tendril-net/tendril/pkg/option"
	"github.com/tendril-net/tendril/pkg/policy"
	"github.com/tendril-net/tendril/pkg/policy/api"
)

// newTestModule is the policy module without a datapath: the universe is
// the reserved identities (host, world, ...), enough for rules on
// entities.
func newTestModule(t *testing.T) *Module {
	t.Helper()
	return &Module{
		log: slog.New(slog.DiscardHandler), repo: policy.NewRepository(),
		runtime:  option.NewRuntime(option.RuntimeValues{PolicyEnforcement: option.EnforcementDefault}),
		realized: map[uint16]policy.MapState{}, results: map[uint16]policy.Result{},
		cidrIDs: map[netip.Prefix]identity.NumericIdentity{}, nextCIDR: 1, cache: policy.NewSelectorCache(),
		revokeMode: option.RevokeDeny, revoke: map[uint16]revokeKind{}, enforced: map[uint16][2]bool{},
		regen: make(chan struct{}, 1),
	}
}

// setRules replaces the module's rules with doc's.
func setRules(t *testing.T, m *Module, doc string) {
	t.Helper()
	rules, err := api.ParseRules([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.repo.ReplaceSource("test", "", rules); err != nil {
		t.Fatal(err)
	}
}

// portsRule is a rule for app=web: ingress from host on any port (when
// host), deny from world on TCP 22 (when deny), allow from world on TCP
// ports first..first+n-1.
func portsRule(host, deny bool, first, n int) string {
	var ports []string
	for p := first; p < first+n; p++ {
		ports = append(ports, fmt.Sprintf(`{"port":"%d","protocol":"TCP"}`, p))
	}
	var ingress []string
	if host {
		ingress = append(ingress, `{"fromEntities":["host"]}`)
	}
	if n > 0 {
		ingress = append(ingress, `{"fromEntities":["world"],"toPorts":[{"ports":[`+strings.Join(ports, ",")+`]}]}`)
	}
	doc := `[{"endpointSelector":{"matchLabels":{"app":"web"}},"ingress":[` + strings.Join(ingress, ",") + `]`
	if deny {
		doc += `,"ingressDeny":[{"fromEntities":["world"],"toPorts":[{"ports":[{"port":"22","protocol":"TCP"}]}]}]`
	}
	return doc + `}]`
}

// fakePolicyMap is one endpoint's policy map in memory: it refuses a new
// key once it holds capacity entries (a full trie: ENOSPC), and fails the
// upsert call whose number is failAt, and every later upsert of that
// call's key, with ENOMEM until healed. Every state it passes through is
// recorded.
type fakePolicyMap struct {
	entries  map[bpfmaps.PolicyKey]bpfmaps.PolicyValue
	capacity int
	failAt   int
	failKey  *bpfmaps.PolicyKey
	healed   bool
	upserts  int
	states   []map[bpfmaps.PolicyKey]bpfmaps.PolicyValue
}

func newFakePolicyMap(capacity int) *fakePolicyMap {
	return &fakePolicyMap{entries: map[bpfmaps.PolicyKey]bpfmaps.PolicyValue{}, capacity: capacity}
}

func (f *fakePolicyMap) DumpEndpoint(id uint16) (map[bpfmaps.PolicyKey]bpfmaps.PolicyValue, error) {
	out := map[bpfmaps.PolicyKey]bpfmaps.PolicyValue{}
	for k, v := range f.entries {
		if k.EndpointID == id {
			out[k] = v
		}
	}
	return out, nil
}

func (f *fakePolicyMap) Upsert(k bpfmaps.PolicyKey, v bpfmaps.PolicyValue) error {
	f.upserts++
	if f.upserts == f.failAt {
		f.failKey = &k
	}
	if f.failKey != nil && *f.failKey == k && !f.healed {
		return fmt.Errorf("write policy entry %v: %w", k, syscall.ENOMEM)
	}
	if _, ok := f.entries[k]; !ok && f.capacity > 0 && len(f.entries) >= f.capacity {
		return fmt.Errorf("write policy entry %v: %w", k, syscall.ENOSPC)
	}
	f.entries[k] = v
	f.states = append(f.states, maps.Clone(f.entries))
	return nil
}

func (f *fakePolicyMap) Delete(k bpfmaps.PolicyKey) error {
	delete(f.entries, k)
	f.states = append(f.states, maps.Clone(f.entries))
	return nil
}

func (f *fakePolicyMap) DeleteEndpoint(id uint16) error {
	for k := range f.entries {
		if k.EndpointID == id {
			delete(f.entries, k)
		}
	}
	return nil
}

// mapStateOf reads a map's entries back as a map state.
func mapStateOf(entries map[bpfmaps.PolicyKey]bpfmaps.PolicyValue) policy.MapState {
	out := policy.MapState{}
	for k, v := range entries {
		out[policy.Key{Identity: identity.NumericIdentity(k.Identity), Direction: k.Direction, Proto: k.Proto, Port: k.Port, PrefixLen: k.PortPrefixLen}] = policy.Entry{Deny: v.Deny, Cookie: v.Cookie, Views: viewFlags(v.Flags)}
	}
	return out
}

// probe is one packet to check states with.
type probe struct {
	id    identity.NumericIdentity
	proto uint8
	port  uint16
}

func probes() []probe {
	var out []probe
	for _, id := range []identity.NumericIdentity{identity.Host, identity.World, identity.WorldIPv4, identity.WorldIPv6} {
		for _, port := range []uint16{22, 80, 1000, 1001, 1005, 1009, 2000, 2001, 2005, 5000} {
			out = append(out, probe{id, 6, port}, probe{id, 17, port})
		}
	}
	return out
}

// checkNeverMorePermissive fails when one of the states lets a probe in
// that neither old nor want lets in.
func checkNeverMorePermissive(t *testing.T, states []map[bpfmaps.PolicyKey]bpfmaps.PolicyValue, old, want policy.MapState) {
	t.Helper()
	for i, st := range states {
		ms := mapStateOf(st)
		for _, pr := range probes() {
			got, _ := ms.Allowed(bpfmaps.DirIngress, pr.id, pr.proto, pr.port)
			o, _ := old.Allowed(bpfmaps.DirIngress, pr.id, pr.proto, pr.port)
			n, _ := want.Allowed(bpfmaps.DirIngress, pr.id, pr.proto, pr.port)
			if got && !o && !n {
				t.Errorf("state %d lets in identity %d %d/%d, which neither the old nor the new policy allows", i, pr.id, pr.proto, pr.port)
			}
		}
	}
}

// TestRealizeFullMapRevokesAndConverges: a policy change that revokes an
// allow (from host) and adds a deny and more allows than the map holds
// fails, but the revoked allow is gone and the deny is in; what landed is
// what the module believes landed; no state on the way lets in more than
// the old or the new policy; a later revision that fits converges to
// exactly its entries.
func TestRealizeFullMapRevokesAndConverges(t *testing.T) {
	m := newTestModule(t)
	ep := &endpoint.Endpoint{ID: 7, Labels: []string{"k8s:app=web"}}
	host := bpfmaps.PolicyKey{EndpointID: 7, Direction: bpfmaps.DirIngress, Identity: uint32(identity.Host)}

	setRules(t, m, portsRule(true, false, 1000, 2))
	fm := newFakePolicyMap(12)
	if err := m.Realize(t.Context(), ep, fm); err != nil {
		t.Fatalf("first revision: %v", err)
	}
	if _, ok := fm.entries[host]; !ok {
		t.Fatalf("the allow from host did not land: %v", fm.entries)
	}
	old := mapStateOf(fm.entries)
	rev1 := ep.PolicyRevision

	// Revoke host, deny world on 22, allow 10 ports from world: 3 world
	// identities each, far more than 12 entries.
	setRules(t, m, portsRule(false, true, 2000, 10))
	want := m.resolve(ep).MapState
	fm.states = nil
	err := m.Realize(t.Context(), ep, fm)
	if err == nil {
		t.Fatalf("a change that does not fit succeeded: %d entries in a map of 12", len(want))
	}
	if !strings.Contains(err.Error(), "no space") {
		t.Errorf("error does not say the map is full: %v", err)
	}
	if _, ok := fm.entries[host]; ok {
		t.Fatal("the revoked allow from host is still in the map after a failed write")
	}
	for _, id := range []identity.NumericIdentity{identity.World, identity.WorldIPv4, identity.WorldIPv6} {
		if ok, _ := mapStateOf(fm.entries).Allowed(bpfmaps.DirIngress, id, 6, 22); ok {
			t.Errorf("identity %d allowed on TCP 22 against the new deny", id)
		}
	}
	if ep.PolicyRevision != rev1 {
		t.Errorf("endpoint marked at revision %d, which it did not realize", ep.PolicyRevision)
	}
	m.mu.Lock()
	believed := maps.Clone(m.realized[ep.ID])
	m.mu.Unlock()
	if got := mapStateOf(fm.entries); !maps.Equal(got, believed) {
		t.Errorf("the module believes the map holds\n%v\nbut it holds\n%v", believed, got)
	}
	checkNeverMorePermissive(t, fm.states, old, want)

	// A revision with fewer allows converges exactly.
	setRules(t, m, portsRule(false, true, 2000, 2))
	want = m.resolve(ep).MapState
	if err := m.Realize(t.Context(), ep, fm); err != nil {
		t.Fatalf("a change that fits: %v", err)
	}
	if got := mapStateOf(fm.entries); !maps.Equal(got, want) {
		t.Errorf("map holds\n%v\nwant\n%v", got, want)
	}
	if ep.PolicyRevision != m.repo.Revision() {
		t.Errorf("endpoint at revision %d, want %d", ep.PolicyRevision, m.repo.Revision())
	}
}

// TestRealizeFailedUpsertStillRevokes: the Nth upsert fails (ENOMEM), for
// each N of a change: the revoked allow is deleted all the same, no state
// lets in more than the old or the new policy, and the retry converges.
func TestRealizeFailedUpsertStillRevokes(t *testing.T) {
	for n := 1; n <= 4; n++ {
		t.Run(fmt.Sprint("upsert ", n), func(t *testing.T) {
			m := newTestModule(t)
			ep := &endpoint.Endpoint{ID: 3, Labels: []string{"k8s:app=web"}}
			host := bpfmaps.PolicyKey{EndpointID: 3, Direction: bpfmaps.DirIngress, Identity: uint32(identity.Host)}
			setRules(t, m, portsRule(true, false, 1000, 1))
			fm := newFakePolicyMap(0)
			if err := m.Realize(t.Context(), ep, fm); err != nil {
				t.Fatal(err)
			}
			old := mapStateOf(fm.entries)
			setRules(t, m, portsRule(false, true, 1000, 2))
			want := m.resolve(ep).MapState
			fm.states = nil
			fm.failAt = fm.upserts + n
			if err := m.Realize(t.Context(), ep, fm); err == nil {
				t.Fatal("a failed upsert went unreported")
			}
			if ep.PolicyRevision == m.repo.Revision() {
				t.Error("the endpoint is marked at a revision it did not realize")
			}
			if _, ok := fm.entries[host]; ok {
				t.Fatal("the revoked allow from host is still in the map")
			}
			checkNeverMorePermissive(t, fm.states, old, want)
			fm.healed = true
			if err := m.Realize(t.Context(), ep, fm); err != nil {
				t.Fatalf("retry: %v", err)
			}
			if got := mapStateOf(fm.entries); !maps.Equal(got, want) {
				t.Errorf("after the retry the map holds\n%v\nwant\n%v", got, want)
			}
		})
	}
}

// TestRealizeMissingDenyFailsClosed: a new deny that does not fit in the
// full map takes out the allows it would have overridden (here world on
// every port, against a deny of world on TCP 22): after each attempt
// world is not let in on 22, no state on the way lets in more than the old
// policy, and the allows stay out while the deny cannot land.
func TestRealizeMissingDenyFailsClosed(t *testing.T) {
	m := newTestModule(t)
	ep := &endpoint.Endpoint{ID: 9, Labels: []string{"k8s:app=web"}}
	allWorld := `[{"endpointSelector":{"matchLabels":{"app":"web"}},"ingress":[{"fromEntities":["host","world"]}]`
	setRules(t, m, allWorld+`}]`)
	fm := newFakePolicyMap(0)
	if err := m.Realize(t.Context(), ep, fm); err != nil {
		t.Fatal(err)
	}
	old := mapStateOf(fm.entries)
	fm.capacity = len(fm.entries)
	if ok, _ := old.Allowed(bpfmaps.DirIngress, identity.WorldIPv4, 6, 22); !ok {
		t.Fatal("world not allowed on TCP 22 before the deny")
	}
	setRules(t, m, allWorld+`,"ingressDeny":[{"fromEntities":["world"],"toPorts":[{"ports":[{"port":"22","protocol":"TCP"}]}]}]}]`)
	want := m.resolve(ep).MapState
	for attempt := range 2 {
		fm.states = nil
		if err := m.Realize(t.Context(), ep, fm); err == nil {
			t.Fatalf("attempt %d: the change does not fit, yet succeeded", attempt)
		}
		for _, id := range []identity.NumericIdentity{identity.World, identity.WorldIPv4, identity.WorldIPv6} {
			if ok, _ := mapStateOf(fm.entries).Allowed(bpfmaps.DirIngress, id, 6, 22); ok {
				t.Fatalf("attempt %d: identity %d allowed on TCP 22 although its deny is missing", attempt, id)
			}
		}
		checkNeverMorePermissive(t, fm.states, old, want)
	}
	if ok, _ := mapStateOf(fm.entries).Allowed(bpfmaps.DirIngress, identity.Host, 6, 22); !ok {
		t.Error("host, which no deny covers, lost its allow")
	}
	fm.capacity = 0
	if err := m.Realize(t.Context(), ep, fm); err != nil {
		t.Fatalf("with room: %v", err)
	}
	if got := mapStateOf(fm.entries); !maps.Equal(got, want) {
		t.Errorf("map holds\n%v\nwant\n%v", got, want)
	}
}

// TestOverlaps: an allow overlaps a deny when a packet can match both.
func TestOverlaps(t *testing.T) {
	k := func(id identity.NumericIdentity, proto uint8, port uint16, plen uint8) policy.Key {
		return policy.Key{Identity: id, Direction: bpfmaps.DirIngress, Proto: proto, Port: port, PrefixLen: plen}
	}
	cidr := identity.LocalScope | 5
	for _, tc := range []struct {
		a, b policy.Key
		want bool
	}{
		{k(100, 6, 80, 16), k(100, 6, 80, 16), true},
		{k(100, 6, 80, 16), k(100, 6, 81, 16), false},
		{k(100, 6, 80, 16), k(101, 6, 80, 16), false},
		{k(100, 6, 80, 16), k(0, 6, 80, 16), true},
		{k(100, 0, 0, 0), k(100, 17, 53, 16), true},
		{k(100, 6, 80, 16), k(100, 17, 80, 16), false},
		{k(100, 6, 8192, 6), k(100, 6, 9000, 16), true},
		{k(100, 6, 8192, 6), k(100, 6, 80, 16), false},
		{k(100, 6, 80, 16), k(cidr, 6, 80, 16), true},
		{k(100, 6, 80, 16), policy.Key{Identity: 100, Direction: bpfmaps.DirEgress, Proto: 6, Port: 80, PrefixLen: 16}, false},
	} {
		if got := overlaps(tc.a, tc.b); got != tc.want || overlaps(tc.b, tc.a) != tc.want {
			t.Errorf("overlaps(%+v, %+v) = %v, want %v", tc.a, tc.b, got, tc.want)
		}
	}
}
