package endpointmanager

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
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

// TestLookupAddrFollowsCreateAndDelete: the address index names an
// endpoint from its Create to its Delete, for both families and for the
// IPv4-mapped form of its IPv4 address, and a refused Create adds nothing.
func TestLookupAddrFollowsCreateAndDelete(t *testing.T) {
	f := newFixture(t, t.TempDir())
	alloc, err := ipam.New(ipam.DefaultConfig(), nil, netip.MustParsePrefix("10.5.0.0/23"), netip.MustParsePrefix("fd00:5::/112"))
	if err != nil {
		t.Fatal(err)
	}
	f.ipam, f.mgr = alloc, New(f.store, alloc, nil)
	a := f.createPod(t, 1)
	v6 := netip.MustParseAddr("fd00:5::30")
	b, err := f.mgr.Create(context.Background(), &endpoint.Endpoint{ContainerID: "c2", IfName: "eth0",
		IPv4: netip.MustParseAddr("10.5.0.200"), IPv6: v6, PodNamespace: "ns", PodName: "pod-2", Identity: 4242},
		CreateOptions{SyncBuild: true})
	if err != nil {
		t.Fatal(err)
	}
	for addr, want := range map[netip.Addr]uint16{
		a.IPv4: a.ID, netip.AddrFrom16(a.IPv4.As16()): a.ID, b.IPv4: b.ID, v6: b.ID,
	} {
		if o, ok := f.mgr.LookupAddr(addr); !ok || o.EndpointID != want {
			t.Errorf("LookupAddr(%s) = %+v, %v, want endpoint %d", addr, o, ok, want)
		}
	}
	if o, _ := f.mgr.LookupAddr(v6); o.Identity != 4242 {
		t.Errorf("LookupAddr(%s) identity %d, want 4242", v6, o.Identity)
	}
	// A second endpoint claiming a's address is refused and does not take
	// over the index.
	if _, err := f.mgr.Create(context.Background(), &endpoint.Endpoint{ContainerID: "c3", IfName: "eth0", IPv4: a.IPv4}, CreateOptions{}); err == nil {
		t.Fatal("create with a held address succeeded")
	}
	if o, ok := f.mgr.LookupAddr(a.IPv4); !ok || o.EndpointID != a.ID {
		t.Errorf("after a refused create LookupAddr(%s) = %+v, %v", a.IPv4, o, ok)
	}
	if err := f.mgr.Delete(context.Background(), b.ID); err != nil {
		t.Fatal(err)
	}
	for _, addr := range []netip.Addr{b.IPv4, v6, {}} {
		if o, ok := f.mgr.LookupAddr(addr); ok {
			t.Errorf("LookupAddr(%s) after delete = %+v", addr, o)
		}
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

// TestCreateFailureAtEachStepGivesBackItsClaims makes each step of Create
// fail in turn, after the steps before it have taken their claims (the ID,
// the IPv4 address, the IPv6 address, the entry in the endpoint table, the
// state on disk), and checks that the failed Create gave back every claim
// it took and nothing it did not take: no endpoint is left, no state on
// disk, its addresses are free again while an address another endpoint or
// a pending allocation holds stays held, and once the cause is gone the
// same endpoint (same ID, attachment and addresses) can be created.
func TestCreateFailureAtEachStepGivesBackItsClaims(t *testing.T) {
	const id = 7
	v4, v6 := netip.MustParseAddr("10.5.0.20"), netip.MustParseAddr("fd00:5::20")
	newEP := func() *endpoint.Endpoint {
		return &endpoint.Endpoint{ContainerID: "c1", IfName: "eth0", HostIfName: "veth1",
			IPv4: v4, IPv6: v6, PodNamespace: "ns", PodName: "pod-1"}
	}
	type env struct {
		t    *testing.T
		f    *fixture
		ep   *endpoint.Endpoint
		opts CreateOptions
	}
	// held checks that an address the failed Create did not take is
	// still allocated as it was.
	held := func(e *env, ip netip.Addr, claimed bool) {
		e.t.Helper()
		if a, ok := e.f.ipam.Lookup(ip); !ok || a.Claimed != claimed {
			e.t.Errorf("address %s, not the failed Create's, is %+v (allocated %v), want allocated, claimed %v", ip, a, ok, claimed)
		}
	}
	// otherHolds creates another endpoint holding ip.
	otherHolds := func(e *env, ip netip.Addr) *endpoint.Endpoint {
		e.t.Helper()
		other := &endpoint.Endpoint{ContainerID: "c2", IfName: "eth0", PodNamespace: "ns", PodName: "pod-2"}
		if ip.Is4() {
			other.IPv4 = ip
		} else {
			other.IPv6 = ip
		}
		got, err := e.f.mgr.Create(context.Background(), other, CreateOptions{SyncBuild: true})
		if err != nil {
			e.t.Fatal(err)
		}
		return got
	}
	deleteOther := func(e *env) {
		if _, err := e.f.mgr.DeleteByContainerID(context.Background(), "c2"); err != nil {
			e.t.Fatal(err)
		}
	}
	// blockStateDir puts a file where the endpoint's state directory goes.
	blockStateDir := func(e *env) {
		if err := os.WriteFile(filepath.Join(e.f.dir, strconv.Itoa(id)), []byte("x"), 0o600); err != nil {
			e.t.Fatal(err)
		}
	}
	unblockStateDir := func(e *env) {
		// (A failed build's Delete may have removed it already.)
		if err := os.RemoveAll(filepath.Join(e.f.dir, strconv.Itoa(id))); err != nil {
			e.t.Fatal(err)
		}
	}
	tests := []struct {
		name string
		// fail sets up the failure; notTaken checks what the failed Create
		// must leave as it was; fix removes the cause.
		fail     func(e *env)
		notTaken func(e *env)
		fix      func(e *env)
	}{{
		name: "requested ID in use",
		fail: func(e *env) {
			e.opts.RequestedID = otherHolds(e, netip.MustParseAddr("10.5.0.30")).ID
			e.ep.ContainerID = "c3"
		},
		notTaken: func(e *env) { held(e, netip.MustParseAddr("10.5.0.30"), true) },
		fix:      func(e *env) { deleteOther(e); e.ep.ContainerID = "c1"; e.opts.RequestedID = id },
	}, {
		name:     "first address held by another endpoint",
		fail:     func(e *env) { otherHolds(e, v4) },
		notTaken: func(e *env) { held(e, v4, true) },
		fix:      deleteOther,
	}, {
		name:     "second address held by another endpoint",
		fail:     func(e *env) { otherHolds(e, v6) },
		notTaken: func(e *env) { held(e, v6, true) },
		fix:      deleteOther,
	}, {
		name: "second address's claim refused (expiration UUID)",
		fail: func(e *env) {
			a, err := e.f.ipam.AllocateNextWithExpiration(ipam.IPv6, e.ep.IPAMOwner())
			if err != nil {
				e.t.Fatal(err)
			}
			e.ep.IPv6 = a.IP
			e.opts.ExpirationUUIDs = map[netip.Addr]string{a.IP: "not-" + a.ExpirationUUID}
		},
		notTaken: func(e *env) { held(e, e.ep.IPv6, false) },
		fix: func(e *env) {
			a, _ := e.f.ipam.Lookup(e.ep.IPv6)
			e.opts.ExpirationUUIDs = map[netip.Addr]string{a.IP: a.ExpirationUUID}
		},
	}, {
		name:     "second address outside the pod CIDR",
		fail:     func(e *env) { e.ep.IPv6 = netip.MustParseAddr("fd00:6::20") },
		notTaken: func(e *env) {},
		fix:      func(e *env) { e.ep.IPv6 = v6 },
	}, {
		name:     "initial state refused",
		fail:     func(e *env) { e.ep.State = endpoint.StateDisconnected },
		notTaken: func(e *env) {},
		fix:      func(e *env) { e.ep.State = "" },
	}, {
		name:     "state write fails",
		fail:     blockStateDir,
		notTaken: func(e *env) {},
		fix:      unblockStateDir,
	}, {
		name:     "build fails",
		fail:     func(e *env) { e.opts.SyncBuild = true; e.f.mgr.SetRegenerator(failingRegen{}) },
		notTaken: func(e *env) {},
		fix:      func(e *env) { e.f.mgr.SetRegenerator(NopRegenerator{}) },
	}, {
		name:     "state write after the build fails",
		fail:     func(e *env) { e.opts.SyncBuild = true; blockStateDir(e) },
		notTaken: func(e *env) {},
		fix:      unblockStateDir,
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			alloc, err := ipam.New(ipam.DefaultConfig(), nil, netip.MustParsePrefix("10.5.0.0/23"), netip.MustParsePrefix("fd00:5::/112"))
			if err != nil {
				t.Fatal(err)
			}
			dir := t.TempDir()
			store, err := endpoint.NewStore(dir, nil)
			if err != nil {
				t.Fatal(err)
			}
			f := &fixture{dir: dir, ipam: alloc, store: store, mgr: New(store, alloc, nil)}
			e := &env{t: t, f: f, ep: newEP(), opts: CreateOptions{RequestedID: id}}
			tt.fail(e)
			before := len(f.mgr.List())
			if _, err := f.mgr.Create(context.Background(), e.ep, e.opts); err == nil {
				t.Fatal("Create succeeded despite the injected failure")
			}
			if n := len(f.mgr.List()); n != before {
				t.Errorf("%d endpoints after the failed Create, want %d", n, before)
			}
			if _, err := f.mgr.Lookup("container-id:" + e.ep.ContainerID); !errors.Is(err, ErrNotFound) {
				t.Errorf("failed endpoint still there: %v", err)
			}
			if _, err := os.Stat(filepath.Join(dir, strconv.Itoa(int(e.ep.ID)), "state.json")); err == nil {
				t.Errorf("state of endpoint %d left on disk", e.ep.ID)
			}
			tt.notTaken(e)
			// (An address a case allocated itself is checked by notTaken.)
			for _, ip := range []netip.Addr{v4, v6} {
				owner := ""
				if a, ok := f.ipam.Lookup(ip); ok {
					owner = a.Owner
				}
				if owner == e.ep.IPAMOwner() {
					t.Errorf("address %s still held for %s after the failed Create", ip, owner)
				}
			}
			// With the cause gone, the same endpoint can be created: its
			// ID, attachment and addresses were all given back.
			tt.fix(e)
			retry := newEP()
			retry.IPv6 = e.ep.IPv6
			got, err := f.mgr.Create(context.Background(), retry, e.opts)
			if err != nil {
				t.Fatalf("Create after the cause was removed: %v", err)
			}
			if got.ID != e.opts.RequestedID {
				t.Errorf("created as endpoint %d, want %d", got.ID, e.opts.RequestedID)
			}
		})
	}
}

// BenchmarkLookupAddr: the L7 proxies' sender lookup on a node with 250
// endpoints (constant time; it was a scan and a copy of every endpoint).
func BenchmarkLookupAddr(b *testing.B) {
	f := newFixture(b, b.TempDir())
	var addrs []netip.Addr
	for i := range 250 {
		addrs = append(addrs, f.createPod(b, i).IPv4)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		if _, ok := f.mgr.LookupAddr(addrs[i%len(addrs)]); !ok {
			b.Fatal("not found")
		}
	}
}

// LookupNames gives a flow's view of an endpoint: its pod and labels, the
// labels a copy the manager's later changes do not touch.
func TestLookupNames(t *testing.T) {
	f := newFixture(t, t.TempDir())
	ep := f.createPod(t, 1)
	if _, err := f.mgr.SetLabels(ep.ID, []string{"k8s:app=web", "k8s:tier=front"}, "test"); err != nil {
		t.Fatal(err)
	}
	got, ok := f.mgr.LookupNames(ep.ID)
	if !ok || got.ID != ep.ID || got.Identity != ep.Identity || got.PodNamespace != "ns" || got.PodName != "pod-1" ||
		!slices.Equal(got.Labels, []string{"k8s:app=web", "k8s:tier=front"}) {
		t.Fatalf("LookupNames(%d) = %+v, %v", ep.ID, got, ok)
	}
	got.Labels[0] = "changed"
	if again, _ := f.mgr.LookupNames(ep.ID); again.Labels[0] != "k8s:app=web" {
		t.Errorf("the caller's labels are the manager's: %v", again.Labels)
	}
	if _, ok := f.mgr.LookupNames(ep.ID + 1); ok {
		t.Error("LookupNames of an unknown ID found one")
	}
}

// BenchmarkFlowEndpoint: what naming a flow's local endpoint costs, by
// its ID, on an endpoint with labels and a full log (a pod that has
// regenerated a few times): Lookup (a copy of the whole endpoint, what
// the flows used) against LookupNames.
func BenchmarkFlowEndpoint(b *testing.B) {
	f := newFixture(b, b.TempDir())
	ep := f.createPod(b, 1)
	labels := []string{"k8s:app=web", "k8s:io.kubernetes.pod.namespace=ns", "k8s:io.cilium.k8s.policy.serviceaccount=default", "k8s:tier=front"}
	if _, err := f.mgr.SetLabels(ep.ID, labels, "bench"); err != nil {
		b.Fatal(err)
	}
	for i := range 40 {
		f.mgr.Requeue(ep.ID, fmt.Sprintf("bench %d", i))
	}
	id := strconv.Itoa(int(ep.ID))
	b.Run("Lookup", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			got, err := f.mgr.Lookup(id)
			if err != nil || len(got.Labels) != len(labels) {
				b.Fatal(got, err)
			}
		}
	})
	b.Run("LookupNames", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			got, ok := f.mgr.LookupNames(ep.ID)
			if !ok || len(got.Labels) != len(labels) {
				b.Fatal(got, ok)
			}
		}
	})
}
