package policycidr

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"

	"github.com/tendril-net/tendril/pkg/identity"
	"github.com/tendril-net/tendril/pkg/testutil"
)

// fakeMap is a Backend that can be made to fail.
type fakeMap struct {
	mu      sync.Mutex
	entries map[netip.Prefix]identity.NumericIdentity
	fail    bool
}

func (f *fakeMap) Upsert(p netip.Prefix, id identity.NumericIdentity) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail {
		return errors.New("injected map write error")
	}
	f.entries[p] = id
	return nil
}

func (f *fakeMap) Delete(p netip.Prefix) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.entries, p)
	return nil
}

func (f *fakeMap) Prefixes() ([]netip.Prefix, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Collect(maps.Keys(f.entries)), nil
}

func (f *fakeMap) snapshot() map[netip.Prefix]identity.NumericIdentity {
	f.mu.Lock()
	defer f.mu.Unlock()
	return maps.Clone(f.entries)
}

func start(t *testing.T, b Backend) *Table {
	t.Helper()
	var tbl *Table
	h := hive.New(
		statedb.Cell,
		job.Cell,
		cell.Provide(func() cell.Health { hl, _ := cell.NewSimpleHealth(); return hl }),
		cell.Module("policycidr-test", "policy CIDR table under test",
			cell.Invoke(func(db *statedb.DB, jobs job.Registry, hl cell.Health, id cell.FullModuleID, log *slog.Logger) error {
				var err error
				tbl, err = New(Params{DB: db, Jobs: jobs.NewGroup(hl), Log: log, ModuleID: id, Backend: b,
					Options: []reconciler.Option{reconciler.WithRetry(10*time.Millisecond, 50*time.Millisecond), reconciler.WithPruning(20 * time.Millisecond)}})
				return err
			})),
	)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	if err := h.Start(quiet, context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Stop(quiet, context.Background()) })
	return tbl
}

func synced(t *testing.T, tbl *Table) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := tbl.Synced(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestSetReconcilesTheDifference(t *testing.T) {
	pf := netip.MustParsePrefix
	id := func(n int) identity.NumericIdentity {
		return identity.LocalScope | identity.InClusterCIDR | identity.NumericIdentity(n)
	}
	// A leftover of a previous run, pruned only once the agent restored.
	fm := &fakeMap{entries: map[netip.Prefix]identity.NumericIdentity{pf("192.0.2.0/24"): id(9)}}
	tbl := start(t, fm)
	if err := tbl.Set(map[netip.Prefix]identity.NumericIdentity{pf("10.244.1.7/24"): id(1), pf("fd00::/64"): id(2)}); err != nil {
		t.Fatal(err)
	}
	synced(t, tbl)
	got := fm.snapshot()
	if got[pf("10.244.1.0/24")] != id(1) || got[pf("fd00::/64")] != id(2) {
		t.Fatalf("map = %v, want the masked prefixes with their identities", got)
	}
	if _, ok := got[pf("192.0.2.0/24")]; !ok {
		t.Fatal("the previous run's entry was pruned before MarkRestored")
	}
	if i, ok := tbl.Lookup(pf("10.244.1.0/24")); !ok || i != id(1) {
		t.Fatalf("Lookup = %v %v", i, ok)
	}

	// A failing write is retried until it lands; a prefix no longer wanted
	// goes.
	fm.mu.Lock()
	fm.fail = true
	fm.mu.Unlock()
	if err := tbl.Set(map[netip.Prefix]identity.NumericIdentity{pf("10.244.1.0/24"): id(3)}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	if fm.snapshot()[pf("10.244.1.0/24")] == id(3) {
		t.Fatal("write landed while the map failed")
	}
	fm.mu.Lock()
	fm.fail = false
	fm.mu.Unlock()
	synced(t, tbl)
	got = fm.snapshot()
	if got[pf("10.244.1.0/24")] != id(3) {
		t.Fatalf("retried write = %v", got)
	}
	if _, ok := got[pf("fd00::/64")]; ok {
		t.Fatal("a prefix no longer wanted stayed")
	}

	tbl.MarkRestored()
	testutil.Eventually(t, 30*time.Second, "the prune of the previous run's entry", func() bool {
		_, ok := fm.snapshot()[pf("192.0.2.0/24")]
		return !ok
	})
	if fm.snapshot()[pf("10.244.1.0/24")] != id(3) {
		t.Fatal("the prune removed a wanted entry")
	}
}
