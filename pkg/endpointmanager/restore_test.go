package endpointmanager

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/tendril-net/tendril/pkg/endpoint"
)

func TestRestoreTwentyEndpoints(t *testing.T) {
	dir := t.TempDir()
	f := newFixture(t, dir)
	want := map[uint16]netip.Addr{}
	for i := 0; i < 20; i++ {
		ep := f.createPod(t, i)
		want[ep.ID] = ep.IPv4
	}
	// One endpoint's interface is gone, one state file is corrupt.
	gone := "veth3"
	if err := os.WriteFile(filepath.Join(dir, "8", "state.json"), []byte("garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	// A new agent process: fresh IPAM and manager on the same state dir.
	g := newFixture(t, dir)
	res, err := g.mgr.Restore(context.Background(), func(name string) (bool, error) { return name != gone, nil })
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Restored) != 18 || len(res.Removed) != 1 {
		t.Fatalf("restore result %+v", res)
	}
	for _, ep := range g.mgr.List() {
		if want[ep.ID] != ep.IPv4 || ep.State != endpoint.StateRestoring {
			t.Errorf("endpoint %d restored as %s/%s, want %s", ep.ID, ep.IPv4, ep.State, want[ep.ID])
		}
		// Restored endpoints are found by address (the L7 proxies name
		// senders by it right after a restart).
		if o, ok := g.mgr.LookupAddr(ep.IPv4); !ok || o.EndpointID != ep.ID {
			t.Errorf("LookupAddr(%s) after restore = %+v, %v, want endpoint %d", ep.IPv4, o, ok, ep.ID)
		}
	}
	if err := g.mgr.RegenerateRestored(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, ep := range g.mgr.List() {
		if ep.State != endpoint.StateReady {
			t.Errorf("endpoint %d is %s after regeneration", ep.ID, ep.State)
		}
	}
	// The next allocation gets an address no restored endpoint holds, and a
	// new endpoint gets a fresh ID.
	used := map[netip.Addr]bool{}
	for _, ep := range g.mgr.List() {
		used[ep.IPv4] = true
	}
	next := g.createPodAfterRestore(t, 100)
	if used[next.IPv4] {
		t.Fatalf("address %s handed out twice", next.IPv4)
	}
	if _, clash := want[next.ID]; clash {
		t.Fatalf("ID %d reused", next.ID)
	}
}

func (f *fixture) createPodAfterRestore(t *testing.T, i int) *endpoint.Endpoint {
	return f.createPod(t, i)
}

// BenchmarkRestore200 is the restore of 200 endpoints from disk: read the
// states, check interfaces, re-reserve IDs and addresses.
func BenchmarkRestore200(b *testing.B) {
	dir := b.TempDir()
	f := newFixture(b, dir)
	for i := 0; i < 200; i++ {
		f.createPod(b, i)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		g := newFixture(b, dir)
		res, err := g.mgr.Restore(context.Background(), func(string) (bool, error) { return true, nil })
		if err != nil || len(res.Restored) != 200 {
			b.Fatalf("%+v %v", res, err)
		}
	}
}

// BenchmarkRestoreAndRegenerate200 adds the regeneration of the 200
// restored endpoints (with a no-op datapath: the state writes remain).
func BenchmarkRestoreAndRegenerate200(b *testing.B) {
	dir := b.TempDir()
	f := newFixture(b, dir)
	for i := 0; i < 200; i++ {
		f.createPod(b, i)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		g := newFixture(b, dir)
		if _, err := g.mgr.Restore(context.Background(), func(string) (bool, error) { return true, nil }); err != nil {
			b.Fatal(err)
		}
		if err := g.mgr.RegenerateRestored(context.Background()); err != nil {
			b.Fatal(err)
		}
	}
}

// TestRestoreRefusesIDsOutOfRange: a state directory whose endpoint ID is
// 0 or above MaxID (written by hand, or by another program) is not
// restored: the ID does not fit the datapath's per-endpoint maps, and no
// endpoint created through the API could have it.
func TestRestoreRefusesIDsOutOfRange(t *testing.T) {
	dir := t.TempDir()
	f := newFixture(t, dir)
	good := f.createPod(t, 1)
	for _, id := range []uint16{0, MaxID + 1, 65535} {
		bad := *good
		bad.ID = id
		bad.IPv4 = netip.MustParseAddr("10.5.1.200")
		if err := f.store.Write(&bad); err != nil {
			t.Fatal(err)
		}
	}
	g := newFixture(t, dir)
	res, err := g.mgr.Restore(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Restored) != 1 || res.Restored[0] != good.ID {
		t.Errorf("restored %v, want only endpoint %d", res.Restored, good.ID)
	}
	for _, ep := range g.mgr.List() {
		if ep.ID != good.ID {
			t.Errorf("endpoint %d restored", ep.ID)
		}
	}
	if len(res.Failed) != 3 {
		t.Errorf("failed %v, want the three out-of-range IDs", res.Failed)
	}
}
