package agentk8s

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tendril-net/tendril/pkg/ipcache"
	"github.com/tendril-net/tendril/pkg/k8s"
	v1alpha1 "github.com/tendril-net/tendril/pkg/k8s/apis/tendril.io/v1alpha1"
	"github.com/tendril-net/tendril/pkg/k8s/watchers"
	"github.com/tendril-net/tendril/pkg/nodemanager"
)

// TestClaimRemoteFollowsTheObject: the handler keeps no list of its own of
// what a TendrilEndpoint claimed: an address the object stops listing is
// withdrawn from the gate (and the ipcache), one still listed stays (a
// local endpoint's address too, which is not claimed again), and the
// object's delete or lost identity withdraws every claim it made.
func TestClaimRemoteFollowsTheObject(t *testing.T) {
	cache := &claimsRecorder{claims: map[string]ipcache.Entry{}}
	gate := nodemanager.NewClaimGate(nodemanager.ClaimGateParams{NoNodes: true, Cache: cache, Log: quietLog()})
	ctx, cancel := context.WithCancel(context.Background())
	runDone := make(chan struct{})
	go func() { _ = gate.Run(ctx); close(runDone) }()
	t.Cleanup(func() { cancel(); <-runDone })
	ready := make(chan struct{})
	gate.Synced(func() { close(ready) })
	<-ready

	k := &Module{gate: gate}
	var local []netip.Addr
	isLocal := func(ip netip.Addr) bool { return slices.Contains(local, ip) }
	event := func(kind watchers.EventKind, id int64, pairs ...v1alpha1.AddressPair) watchers.Event[*k8s.CachedEndpoint] {
		tep := &v1alpha1.TendrilEndpoint{ObjectMeta: metav1.ObjectMeta{Name: "db", Namespace: "x"},
			Status: v1alpha1.EndpointStatus{Networking: &v1alpha1.EndpointNetworking{NodeIP: "172.18.0.2", Addressing: pairs}}}
		if id != 0 {
			tep.Status.Identity = &v1alpha1.EndpointIdentity{ID: id}
		}
		return watchers.Event[*k8s.CachedEndpoint]{Kind: kind, Key: "x/db", Object: k8s.NewCachedEndpoint(tep)}
	}
	dual := v1alpha1.AddressPair{IPv4: "10.65.0.2", IPv6: "fd00:65::2"}
	steps := []struct {
		name  string
		ev    watchers.Event[*k8s.CachedEndpoint]
		local []netip.Addr
		want  string
	}{
		{"dual stack", event(watchers.Upsert, 20001, dual), nil, "[10.65.0.2=20001 fd00:65::2=20001]"},
		{"IPv6 no longer listed", event(watchers.Upsert, 20001, v1alpha1.AddressPair{IPv4: "10.65.0.2"}), nil, "[10.65.0.2=20001]"},
		{"the IPv4 address local now, still listed: kept", event(watchers.Upsert, 20002, v1alpha1.AddressPair{IPv4: "10.65.0.2"}),
			[]netip.Addr{netip.MustParseAddr("10.65.0.2")}, "[10.65.0.2=20001]"},
		{"listed again with IPv6", event(watchers.Upsert, 20003, dual), nil, "[10.65.0.2=20003 fd00:65::2=20003]"},
		{"no identity: every claim withdrawn", event(watchers.Upsert, 0, dual), nil, "[]"},
		{"claimed again", event(watchers.Upsert, 20004, dual), nil, "[10.65.0.2=20004 fd00:65::2=20004]"},
		{"deleted", event(watchers.Delete, 20004, dual), nil, "[]"},
		{"this node's own object is not claimed", func() watchers.Event[*k8s.CachedEndpoint] {
			ev := event(watchers.Upsert, 20005, dual)
			ev.Object.Status.Networking.NodeIP = "172.30.0.1"
			return ev
		}(), nil, "[]"},
	}
	for _, s := range steps {
		local = s.local
		k.claimRemote(s.ev, "172.30.0.1", isLocal)
		if got := cache.String(); got != s.want {
			t.Fatalf("%s: ipcache %s, want %s", s.name, got, s.want)
		}
	}
}

// claimsRecorder is the ipcache as the gate writes it: address=identity,
// each claim owned by the TendrilEndpoint.
type claimsRecorder struct {
	mu     sync.Mutex
	claims map[string]ipcache.Entry
}

func (c *claimsRecorder) UpsertRemoteEndpoint(ip netip.Addr, e ipcache.Entry) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e.Owner != ipcache.OwnerTendrilEndpoint("x", "db") || e.Source != ipcache.SourceKubernetes || e.Name != "db" || e.Namespace != "x" ||
		e.HostIP != netip.MustParseAddr("172.18.0.2") {
		return fmt.Errorf("unexpected entry %+v", e)
	}
	c.claims[ip.String()] = e
	return nil
}

func (c *claimsRecorder) DeleteRemoteEndpoint(ip netip.Addr, _ ipcache.Source, _ ipcache.Owner) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.claims, ip.String())
	return nil
}

func (c *claimsRecorder) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for ip, e := range c.claims {
		out = append(out, fmt.Sprintf("%s=%d", ip, e.Identity))
	}
	slices.Sort(out)
	return fmt.Sprint(out)
}
