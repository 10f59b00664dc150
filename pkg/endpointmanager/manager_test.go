package endpointmanager

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/tendril-net/tendril/pkg/endpoint"
	"github.com/tendril-net/tendril/pkg/ipam"
)

type fixture struct {
	dir   string
	ipam  *ipam.IPAM
	store *endpoint.Store
	mgr   *Manager
}

func newFixture(t testing.TB, dir string) *fixture {
	t.Helper()
	alloc, err := ipam.New(ipam.DefaultConfig(), nil, netip.MustParsePrefix("10.5.0.0/23"), netip.Prefix{})
	if err != nil {
		t.Fatal(err)
	}
	store, err := endpoint.NewStore(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{dir: dir, ipam: alloc, store: store, mgr: New(store, alloc, nil)}
}

func (f *fixture) createPod(t testing.TB, i int) *endpoint.Endpoint {
	t.Helper()
	owner := fmt.Sprintf("ns/pod-%d", i)
	a, err := f.ipam.AllocateNextWithExpiration(ipam.IPv4, owner)
	if err != nil {
		t.Fatal(err)
	}
	ep := &endpoint.Endpoint{
		ContainerID: fmt.Sprintf("c%d", i), IfName: "eth0", HostIfName: fmt.Sprintf("veth%d", i),
		IPv4: a.IP, PodNamespace: "ns", PodName: fmt.Sprintf("pod-%d", i),
	}
	got, err := f.mgr.Create(context.Background(), ep, CreateOptions{SyncBuild: true, ExpirationUUIDs: map[netip.Addr]string{a.IP: a.ExpirationUUID}})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func TestCreateLookupDelete(t *testing.T) {
	f := newFixture(t, t.TempDir())
	ep := f.createPod(t, 1)
	if ep.State != endpoint.StateReady || ep.ID != 1 {
		t.Fatalf("created %+v", ep)
	}
	for _, id := range []string{"1", "cilium-local:1", "container-id:c1", "cni-attachment-id:c1:eth0", "pod-name:ns/pod-1"} {
		got, err := f.mgr.Lookup(id)
		if err != nil || got.ID != 1 {
			t.Errorf("Lookup(%s) = %v, %v", id, got, err)
		}
	}
	for id, want := range map[string]error{"2": ErrNotFound, "abc": ErrInvalidID, "pod-name:x": ErrInvalidID, "docker-endpoint:x": ErrInvalidID, "foo:1": ErrInvalidID} {
		if _, err := f.mgr.Lookup(id); !errors.Is(err, want) {
			t.Errorf("Lookup(%s) = %v, want %v", id, err, want)
		}
	}
	// The same attachment twice is refused.
	dup := &endpoint.Endpoint{ContainerID: "c1", IfName: "eth0", IPv4: netip.MustParseAddr("10.5.0.100")}
	if _, err := f.mgr.Create(context.Background(), dup, CreateOptions{}); !errors.Is(err, ErrExists) {
		t.Fatalf("duplicate create = %v", err)
	}
	if _, ok := f.ipam.Lookup(netip.MustParseAddr("10.5.0.100")); ok {
		t.Fatal("refused create left an allocation")
	}
	if n, err := f.mgr.DeleteByContainerID(context.Background(), "c1"); n != 1 || err != nil {
		t.Fatalf("delete = %d, %v", n, err)
	}
	if _, ok := f.ipam.Lookup(ep.IPv4); ok {
		t.Fatal("address not released on delete")
	}
	if _, err := os.Stat(filepath.Join(f.dir, "1")); !os.IsNotExist(err) {
		t.Fatal("state dir not removed")
	}
	if err := f.mgr.Delete(context.Background(), 1); !errors.Is(err, ErrNotFound) {
		t.Fatalf("second delete = %v", err)
	}
}

type failingRegen struct{ NopRegenerator }

func (failingRegen) Regenerate(context.Context, *endpoint.Endpoint) error {
	return errors.New("map full")
}

func TestSyncBuildFailureLeavesNothing(t *testing.T) {
	f := newFixture(t, t.TempDir())
	f.mgr.SetRegenerator(failingRegen{})
	ep := &endpoint.Endpoint{ContainerID: "c9", IfName: "eth0", IPv4: netip.MustParseAddr("10.5.0.9")}
	if _, err := f.mgr.Create(context.Background(), ep, CreateOptions{SyncBuild: true}); err == nil {
		t.Fatal("create succeeded although the build failed")
	}
	if len(f.mgr.List()) != 0 {
		t.Fatal("endpoint left behind")
	}
	if _, ok := f.ipam.Lookup(netip.MustParseAddr("10.5.0.9")); ok {
		t.Fatal("address left allocated")
	}
}

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

// TestSyncBuildIsOnDiskAtReturn: a synchronously built endpoint's state,
// as built (ready), is on disk when Create returns, so a restart right
// after finds it; and a store that cannot write fails the Create and
// leaves nothing behind (no endpoint, no allocation).
func TestSyncBuildIsOnDiskAtReturn(t *testing.T) {
	dir := t.TempDir()
	f := newFixture(t, dir)
	ep := f.createPod(t, 1)
	eps, err := f.store.LoadAll()
	if err != nil || len(eps) != 1 || eps[0].ID != ep.ID || eps[0].State != endpoint.StateReady {
		t.Fatalf("on disk after Create: %+v (%v), want endpoint %d ready", eps, err, ep.ID)
	}

	// Endpoint 2's directory cannot be created: a file is in the way.
	if err := os.WriteFile(filepath.Join(dir, "2"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	a, err := f.ipam.AllocateNext(ipam.IPv4, "ns/pod-2")
	if err != nil {
		t.Fatal(err)
	}
	bad := &endpoint.Endpoint{ContainerID: "c2", IfName: "eth0", IPv4: a.IP, PodNamespace: "ns", PodName: "pod-2"}
	if _, err := f.mgr.Create(context.Background(), bad, CreateOptions{SyncBuild: true}); err == nil {
		t.Fatal("Create succeeded although its state could not be written")
	}
	if _, err := f.mgr.Lookup("container-id:c2"); !errors.Is(err, ErrNotFound) {
		t.Errorf("endpoint left after a failed Create: %v", err)
	}
	if _, ok := f.ipam.Lookup(a.IP); ok {
		t.Error("address left allocated after a failed Create")
	}
}

// TestIDCursorAcrossRestart: the persisted cursor runs ahead of the IDs
// handed out, so after a restart a freed ID is not handed out again at
// once; and it is written once per block of creates, not on every create.
func TestIDCursorAcrossRestart(t *testing.T) {
	dir := t.TempDir()
	f := newFixture(t, dir)
	var last *endpoint.Endpoint
	for i := 1; i <= 3; i++ {
		last = f.createPod(t, i)
	}
	cursor := func() string {
		data, err := f.store.ReadFile("next-id")
		if err != nil {
			t.Fatal(err)
		}
		return string(data)
	}
	first := cursor()
	if err := f.mgr.Delete(context.Background(), last.ID); err != nil {
		t.Fatal(err)
	}
	f.createPod(t, 4)
	if got := cursor(); got != first {
		t.Errorf("cursor rewritten within its block: %s then %s", first, got)
	}

	// A new manager on the same state, as after a restart.
	g := &fixture{dir: dir, ipam: f.ipam, store: f.store, mgr: New(f.store, f.ipam, nil)}
	next := g.createPod(t, 5)
	if next.ID <= 4 || next.ID == last.ID {
		t.Errorf("first ID after the restart is %d; IDs up to 4 were handed out (%d freed)", next.ID, last.ID)
	}
	// Crossing the block moves the cursor on disk before the ID is used.
	for i := 6; i < 6+cursorBlock; i++ {
		g.createPod(t, i)
	}
	if got := cursor(); got == first {
		t.Errorf("cursor still %s after %d more creates", got, cursorBlock)
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
