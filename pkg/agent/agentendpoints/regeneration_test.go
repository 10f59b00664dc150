package agentendpoints

import (
	"context"
	"net/netip"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"

	"github.com/tendril-net/tendril/api/v1/server"
	"github.com/tendril-net/tendril/pkg/endpoint"
	"github.com/tendril-net/tendril/pkg/health"
	"github.com/tendril-net/tendril/pkg/identity"
	"github.com/tendril-net/tendril/pkg/lifecycle"
	"github.com/tendril-net/tendril/pkg/option"
)

// fakeRealizer records what the endpoints hand it.
type fakeRealizer struct {
	mu           sync.Mutex
	restored     []uint16
	regenerated  []uint16
	revokedHolds map[identity.NumericIdentity][]uint16
}

func (f *fakeRealizer) Regenerate(_ context.Context, ep *endpoint.Endpoint) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.regenerated = append(f.regenerated, ep.ID)
	return nil
}
func (f *fakeRealizer) Remove(context.Context, *endpoint.Endpoint) error { return nil }
func (f *fakeRealizer) Restored(eps []*endpoint.Endpoint) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, ep := range eps {
		f.restored = append(f.restored, ep.ID)
	}
}
func (f *fakeRealizer) Revoked(id identity.NumericIdentity) []uint16 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.revokedHolds[id]
}
func (f *fakeRealizer) MarkRestored()                          {}
func (f *fakeRealizer) RefreshPolicy(*endpoint.Endpoint) error { return nil }
func (f *fakeRealizer) regenerations() []uint16 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.regenerated)
}
func (f *fakeRealizer) restoredIDs() []uint16 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.restored)
}
func (noPolicy) Run(ctx context.Context, _ func(*endpoint.Endpoint) error) { <-ctx.Done() }

type noPolicy struct{}

// revocations is an allocator whose revocations the test fires.
type revocations struct {
	*identity.LocalAllocator
	mu  sync.Mutex
	fns []func(identity.NumericIdentity, []string)
}

func (r *revocations) SubscribeRevoked(fn func(identity.NumericIdentity, []string)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.fns = append(r.fns, fn)
}

func (r *revocations) revoke(id identity.NumericIdentity) {
	r.mu.Lock()
	fns := slices.Clone(r.fns)
	r.mu.Unlock()
	for _, fn := range fns {
		fn(id, nil)
	}
}

// TestRegenerationHandsTheRealizerItsInputs: the realizer is the
// endpoints' regeneration hook; it gets the endpoints restored from disk
// (and only those) before they regenerate, and an identity it held that
// the cluster revokes requeues the endpoints it names, which regenerate
// again. The realizer itself calls nothing of the endpoints.
func TestRegenerationHandsTheRealizerItsInputs(t *testing.T) {
	agent := option.DefaultAgent()
	agent.StateDir = filepath.Join(t.TempDir(), "state")
	store, err := endpoint.NewStore(filepath.Join(agent.StateDir, "endpoints"), hivetest.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, ep := range []*endpoint.Endpoint{
		{ID: 3, PodNamespace: "default", PodName: "a", IPv4: netip.MustParseAddr("10.77.3.10"), Identity: 1000},
		{ID: 5, PodNamespace: "default", PodName: "b", IPv4: netip.MustParseAddr("10.77.3.11"), Identity: 1001},
	} {
		if err := store.Write(ep); err != nil {
			t.Fatal(err)
		}
	}
	real := &fakeRealizer{revokedHolds: map[identity.NumericIdentity][]uint16{1001: {5}}}
	ids := &revocations{LocalAllocator: identity.NewLocalAllocator()}
	var m *Module
	h := hive.New(
		cell.Invoke(func(lifecycle.InvokedAll) {}),
		statedb.Cell,
		job.Cell,
		cell.Provide(
			func() option.Agent { return agent },
			func() server.Config { return server.Config{Socket: filepath.Join(agent.StateDir, "t.sock")} },
			func() option.LocalNode { return option.LocalNode{Name: "node-a"} },
			func() Kubernetes { return nil },
			func() Realizer { return real },
			func() PolicyRegeneration { return noPolicy{} },
			func() identity.Allocator { return ids },
			health.NewRegistry,
			lifecycle.NewSteps,
		),
		Cell,
		RegenerationCell,
		cell.Invoke(func(mod *Module) { m = mod }),
	)
	h.Viper().Set("install-host-networking", "false")
	h.Viper().Set("ipv4-range", "10.77.3.0/24")
	h.Viper().Set("ipv6-range", "none")
	log := hivetest.Logger(t)
	if err := h.Start(log, context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := h.Stop(log, context.Background()); err != nil {
			t.Error(err)
		}
	})
	if got := real.restoredIDs(); !slices.Equal(got, []uint16{3, 5}) {
		t.Fatalf("realizer got restored endpoints %v, want [3 5]", got)
	}
	if got := real.regenerations(); !slices.Contains(got, 3) || !slices.Contains(got, 5) {
		t.Fatalf("regenerations after start %v, want both restored endpoints", got)
	}
	before := len(real.regenerations())
	ids.revoke(1001)
	deadline := time.Now().Add(30 * time.Second)
	for {
		got := real.regenerations()
		if len(got) > before && slices.Contains(got[before:], 5) {
			if slices.Contains(got[before:], 3) {
				t.Fatalf("regenerations after revoking 1001: %v; endpoint 3 does not hold it", got[before:])
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("endpoint 5 was not regenerated after its identity was revoked (regenerations %v)", got)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if m.Manager() == nil {
		t.Fatal("no endpoint manager")
	}
}
