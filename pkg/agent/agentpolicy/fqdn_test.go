package agentpolicy

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/statedb"

	"github.com/tendril-net/tendril/pkg/datapath/maps"
	"github.com/tendril-net/tendril/pkg/endpoint"
	"github.com/tendril-net/tendril/pkg/endpointmanager"
	"github.com/tendril-net/tendril/pkg/identity"
	"github.com/tendril-net/tendril/pkg/identity/identitytable"
	"github.com/tendril-net/tendril/pkg/policy"
)

type noMaps struct{}

func (noMaps) Maps() *maps.Maps { return nil }

type noEndpoints struct{}

func (noEndpoints) Manager() *endpointmanager.Manager     { return nil }
func (noEndpoints) Subscribe(func(endpointmanager.Event)) {}

// The names the DNS proxy learned reach an endpoint's policy: after
// SetFQDNNames and WaitFQDNNames (a regeneration pass has run), the
// learned address has a CIDR identity that toFQDNs select, on the rule's
// port only; replaced names drop the address again.
func TestFQDNNamesReachPolicy(t *testing.T) {
	m := newTestModule(t)
	db := statedb.New()
	tbl, err := identitytable.New(db, identity.NewLocalAllocator(), m.log)
	if err != nil {
		t.Fatal(err)
	}
	m.dp, m.idTable, m.eps = noMaps{}, tbl, noEndpoints{}
	setRules(t, m, `[{"endpointSelector":{"matchLabels":{"app":"a"}},"egress":[
	  {"toFQDNs":[{"matchPattern":"*.example"}],"toPorts":[{"ports":[{"port":"80","protocol":"TCP"}]}]}]}]`)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() { m.Run(ctx, nil); close(done) }()
	defer func() { cancel(); <-done }()

	ep := &endpoint.Endpoint{ID: 5, Labels: []string{"k8s:app=a"}}
	world := netip.MustParseAddr("192.0.2.10")
	g := m.SetFQDNNames(map[netip.Addr][]string{world: {"world.example"}, netip.MustParseAddr("192.0.2.20"): {"other.test"}})
	wctx, wcancel := context.WithTimeout(ctx, time.Minute)
	defer wcancel()
	if err := m.WaitFQDNNames(wctx, g); err != nil {
		t.Fatal(err)
	}
	idOf := func(a netip.Addr) identity.NumericIdentity {
		m.mu.Lock()
		defer m.mu.Unlock()
		return m.cidrIDs[netip.PrefixFrom(a, 32)]
	}
	id := idOf(world)
	if id == 0 || idOf(netip.MustParseAddr("192.0.2.20")) == 0 {
		t.Fatal("learned addresses have no CIDR identity")
	}
	res := m.resolve(ep)
	if ok, _ := res.MapState.Allowed(policy.Egress, id, 6, 80); !ok {
		t.Fatal("learned world.example not allowed on TCP 80")
	}
	if ok, _ := res.MapState.Allowed(policy.Egress, id, 6, 22); ok {
		t.Fatal("learned world.example allowed on TCP 22")
	}
	if ok, _ := res.MapState.Allowed(policy.Egress, idOf(netip.MustParseAddr("192.0.2.20")), 6, 80); ok {
		t.Fatal("a name no selector matches allowed")
	}
	g = m.SetFQDNNames(nil)
	if err := m.WaitFQDNNames(wctx, g); err != nil {
		t.Fatal(err)
	}
	if idOf(world) != 0 {
		t.Fatal("forgotten address keeps its CIDR identity")
	}
	if ok, _ := m.resolve(ep).MapState.Allowed(policy.Egress, id, 6, 80); ok {
		t.Fatal("forgotten name still allowed")
	}
}
