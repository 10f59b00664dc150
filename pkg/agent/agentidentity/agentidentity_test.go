package agentidentity

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"

	"github.com/tendril-net/tendril/pkg/agent/agentk8s"
	"github.com/tendril-net/tendril/pkg/identity"
	"github.com/tendril-net/tendril/pkg/identity/crdalloc"
	"github.com/tendril-net/tendril/pkg/identity/identitytable"
	"github.com/tendril-net/tendril/pkg/identity/kvalloc"
	"github.com/tendril-net/tendril/pkg/labels"
	"github.com/tendril-net/tendril/pkg/lifecycle"
	"github.com/tendril-net/tendril/pkg/option"
)

// built is what the identity cell provides.
type built struct {
	alloc  identity.Allocator
	table  *identitytable.Table
	filter *labels.Filter
}

// newHive is the identity cell with the Kubernetes options k8s (no
// client configured: standalone) and the flags' values set over the
// defaults; b receives what the cell provides. The environment's
// in-cluster address is cleared so that "standalone" means it.
func newHive(t *testing.T, k8s agentk8s.Config, flags map[string]string, b *built) *hive.Hive {
	t.Helper()
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	h := hive.New(
		cell.Invoke(func(lifecycle.InvokedAll) {}),
		statedb.Cell,
		job.Cell,
		cell.Provide(
			func() agentk8s.Config { return k8s },
			func() option.LocalNode { return option.LocalNode{Name: "node-a"} },
		),
		Cell,
		cell.Invoke(func(a identity.Allocator, tbl *identitytable.Table, f *labels.Filter) {
			if b != nil {
				*b = built{a, tbl, f}
			}
		}),
	)
	for k, v := range flags {
		h.Viper().Set(k, v)
	}
	return h
}

func start(t *testing.T, h *hive.Hive) {
	t.Helper()
	log := hivetest.Logger(t)
	if err := h.Start(log, context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := h.Stop(log, context.Background()); err != nil {
			t.Error(err)
		}
	})
}

// TestLocalAllocation: in local mode the cell's allocator hands a label
// set a cluster identity, the same number for the same labels (another
// reference), another for other labels; the identities table, taken by
// type, has each with its labels and references.
func TestLocalAllocation(t *testing.T) {
	var b built
	start(t, newHive(t, agentk8s.DefaultConfig(), map[string]string{"identity-allocation-mode": "local"}, &b))
	if _, ok := b.alloc.(*identity.LocalAllocator); !ok {
		t.Fatalf("local mode: allocator %T, want the local allocator", b.alloc)
	}
	web := []string{"k8s:app=web", "k8s:io.kubernetes.pod.namespace=default"}
	id1, isNew, err := b.alloc.Allocate(web)
	if err != nil || !isNew || !id1.ID.IsCluster() {
		t.Fatalf("first allocation: %v new %v err %v; want a new cluster identity", id1.ID, isNew, err)
	}
	id2, isNew, err := b.alloc.Allocate([]string{web[1], web[0]})
	if err != nil || isNew || id2.ID != id1.ID {
		t.Fatalf("same labels again: %v new %v err %v; want %v again", id2.ID, isNew, err, id1.ID)
	}
	db, _, err := b.alloc.Allocate([]string{"k8s:app=db", "k8s:io.kubernetes.pod.namespace=default"})
	if err != nil || db.ID == id1.ID {
		t.Fatalf("other labels: %v err %v; want another identity than %v", db.ID, err, id1.ID)
	}

	row, ok := b.table.Lookup(id1.ID)
	if !ok || !slices.Equal(row.Labels, web) || row.References != 2 {
		t.Fatalf("table row of %v: %+v (found %v); want labels %v with 2 references", id1.ID, row, ok, web)
	}
	if rows := b.table.WithLabel("k8s:app=db"); len(rows) != 1 || rows[0].ID != db.ID {
		t.Fatalf("table rows with k8s:app=db: %+v, want %v", rows, db.ID)
	}
	if err := b.alloc.Release(db.ID); err != nil {
		t.Fatal(err)
	}
	if _, ok := b.table.Lookup(db.ID); ok {
		t.Fatalf("identity %v still in the table after its last reference went", db.ID)
	}
}

// TestAllocatorOfMode: crd mode is TendrilIdentity objects with an API
// server configured and falls back to local without one (as the flag
// says); kvstore mode is etcd keys.
func TestAllocatorOfMode(t *testing.T) {
	withAPIServer := agentk8s.DefaultConfig()
	withAPIServer.Client.APIServer = "https://127.0.0.1:6443"
	for _, tc := range []struct {
		name string
		k8s  agentk8s.Config
		mode string
		want identity.Allocator
	}{
		{"crd standalone", agentk8s.DefaultConfig(), "crd", (*identity.LocalAllocator)(nil)},
		{"crd with Kubernetes", withAPIServer, "crd", (*crdalloc.Allocator)(nil)},
		{"kvstore", agentk8s.DefaultConfig(), "kvstore", (*kvalloc.Allocator)(nil)},
		{"local with Kubernetes", withAPIServer, "local", (*identity.LocalAllocator)(nil)},
	} {
		var b built
		h := newHive(t, tc.k8s, map[string]string{"identity-allocation-mode": tc.mode}, &b)
		if err := h.Populate(hivetest.Logger(t)); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if got, want := typeName(b.alloc), typeName(tc.want); got != want {
			t.Errorf("%s: allocator %s, want %s", tc.name, got, want)
		}
	}
}

func typeName(v any) string {
	switch v.(type) {
	case *identity.LocalAllocator:
		return "local"
	case *crdalloc.Allocator:
		return "crd"
	case *kvalloc.Allocator:
		return "kvstore"
	}
	return "other"
}

// TestInvalidConfigRefused: an unknown allocation mode, or a label
// filter that does not parse, fails Populate as a configuration error
// naming the option.
func TestInvalidConfigRefused(t *testing.T) {
	for _, tc := range []struct{ flag, value, want string }{
		{"identity-allocation-mode", "etcd", "identity-allocation-mode"},
		{"identity-labels-include", "[", "identity-labels"},
	} {
		h := newHive(t, agentk8s.DefaultConfig(), map[string]string{tc.flag: tc.value}, nil)
		err := h.Populate(hivetest.Logger(t))
		if err == nil {
			t.Errorf("--%s=%s accepted", tc.flag, tc.value)
			continue
		}
		if !option.IsInvalid(err) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("--%s=%s: %v (invalid %v); want a configuration error naming %s", tc.flag, tc.value, err, option.IsInvalid(err), tc.want)
		}
	}
}
