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
