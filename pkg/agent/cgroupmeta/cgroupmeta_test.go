package cgroupmeta

import (
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/tendril-net/tendril/pkg/cgroups"
	"github.com/tendril-net/tendril/pkg/endpoint"
)

type fakeEndpoints []*endpoint.Endpoint

func (f fakeEndpoints) ListForAPI() ([]*endpoint.Endpoint, error) { return f, nil }

// TestResolverNamesPodsByCgroup: over a hierarchy laid out by the kubelet
// (cgroupfs and systemd drivers), a container's and a pod's cgroup ID
// name the endpoint with the pod's UID; a cgroup created after the last
// scan is found by a rescan; a pod without an endpoint and an unknown ID
// name nothing; the dump lists each pod with its containers and
// addresses.
func TestResolverNamesPodsByCgroup(t *testing.T) {
	root := t.TempDir()
	const uidA, uidB, uidC = "11111111-2222-3333-4444-555555555555", "66666666-7777-8888-9999-000000000000", "abababab-cdcd-efef-0101-232323232323"
	ctrA := filepath.Join(root, "kubepods", "burstable", "pod"+uidA, "ctr-a")
	ctrB := filepath.Join(root, "kubepods.slice", "kubepods-besteffort.slice", "kubepods-besteffort-pod66666666_7777_8888_9999_000000000000.slice", "cri-containerd-b.scope")
	ctrC := filepath.Join(root, "kubepods", "pod"+uidC, "ctr-c")
	for _, d := range []string{ctrA, ctrB, ctrC} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	a := &endpoint.Endpoint{ID: 11, Identity: 5001, PodNamespace: "shop", PodName: "web-0", K8sUID: uidA, IPv4: netip.MustParseAddr("10.244.0.11")}
	b := &endpoint.Endpoint{ID: 12, Identity: 5002, PodNamespace: "shop", PodName: "db-0", K8sUID: uidB}
	r := New(root, fakeEndpoints{a, b}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	clock := time.Unix(1000, 0)
	r.now = func() time.Time { return clock }

	id := func(p string) uint64 {
		v, err := cgroups.ID(p)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	for p, want := range map[string]string{ctrA: "web-0", filepath.Dir(ctrA): "web-0", ctrB: "db-0"} {
		e, ok := r.EndpointByCgroup(id(p))
		if !ok || e.PodName != want || e.Namespace != "shop" {
			t.Errorf("cgroup %s: %+v %v, want %s", p, e, ok, want)
		}
	}
	if e, ok := r.EndpointByCgroup(id(ctrC)); ok {
		t.Errorf("pod without an endpoint named %+v", e)
	}
	if _, ok := r.EndpointByCgroup(id(root)); ok {
		t.Error("the root named a pod")
	}

	// A new container of pod A after the scan: found once a rescan is due.
	late := filepath.Join(filepath.Dir(ctrA), "ctr-late")
	if err := os.Mkdir(late, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, ok := r.EndpointByCgroup(id(late)); ok {
		t.Fatal("a lookup rescanned before rescanEvery")
	}
	clock = clock.Add(rescanEvery)
	if e, ok := r.EndpointByCgroup(id(late)); !ok || e.PodName != "web-0" {
		t.Fatalf("late container: %+v %v", e, ok)
	}

	d, err := r.Dump()
	if err != nil {
		t.Fatal(err)
	}
	if len(d.PodMetadatas) != 2 {
		t.Fatalf("dump: %d pods, want 2", len(d.PodMetadatas))
	}
	db, web := d.PodMetadatas[0], d.PodMetadatas[1]
	if db.Name != "db-0" || len(db.Containers) != 1 || db.Containers[0].CgroupPath != ctrB || db.Containers[0].CgroupID != id(ctrB) {
		t.Errorf("dump of db-0: %+v", db)
	}
	if web.Name != "web-0" || len(web.Containers) != 2 || len(web.Ips) != 1 || web.Ips[0] != "10.244.0.11" {
		t.Errorf("dump of web-0: %+v (containers %d)", web, len(web.Containers))
	}
}
