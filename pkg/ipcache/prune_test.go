package ipcache_test

import (
	"net/netip"
	"testing"
	"time"

	"github.com/tendril-net/tendril/pkg/datapath/maps"
	"github.com/tendril-net/tendril/pkg/ipcache"
	"github.com/tendril-net/tendril/pkg/ipcache/ipcachetest"
)

// TestPrivilegedPruneAfterRestore: a real BPF ipcache map holds an entry
// of a previous run that no claim backs. The reconciler writes the table's
// entries at once but does not prune before the agent has restored its
// state (a prune asked for earlier does nothing); once MarkRestored is
// called the stale entry goes and the claimed ones stay.
func TestPrivilegedPruneAfterRestore(t *testing.T) {
	m := newIPCacheMap(t)
	stale := netip.MustParsePrefix("10.99.0.7/32")
	if err := m.Upsert(stale, maps.IPCacheEntry{Identity: 4242}); err != nil {
		t.Fatal(err)
	}
	c := ipcachetest.Start(t, bpfBackend{m})
	kept := netip.MustParsePrefix("10.0.0.5/32")
	if err := c.Upsert(kept, ipcache.Entry{Identity: 300, Source: ipcache.SourceLocal, Owner: ipcache.OwnerEndpoint(5)}); err != nil {
		t.Fatal(err)
	}
	ipcachetest.Synced(t, c)
	if e, ok, err := m.Lookup(kept); err != nil || !ok || e.Identity != 300 {
		t.Fatalf("claimed entry not written: %+v %v %v", e, ok, err)
	}
	c.Prune()
	time.Sleep(300 * time.Millisecond)
	if _, ok, err := m.Lookup(stale); err != nil || !ok {
		t.Fatalf("stale entry pruned before the agent restored its state (present %v, %v)", ok, err)
	}
	c.MarkRestored()
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, ok, err := m.Lookup(stale)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("stale entry still in the map 10 s after MarkRestored")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if e, ok, err := m.Lookup(kept); err != nil || !ok || e.Identity != 300 {
		t.Fatalf("prune removed a claimed entry: %+v %v %v", e, ok, err)
	}
}
