package identitytable

import (
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"

	"github.com/cilium/statedb"

	"github.com/tendril-net/tendril/pkg/identity"
	"github.com/tendril-net/tendril/pkg/identity/crdalloc"
)

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func newTable(t *testing.T, alloc identity.Allocator) *Table {
	t.Helper()
	tbl, err := New(statedb.New(), alloc, quiet())
	if err != nil {
		t.Fatal(err)
	}
	return tbl
}

// content is the table as id=labels/references, by ID.
func content(t *Table) string {
	var out []string
	for _, r := range t.List() {
		out = append(out, fmt.Sprintf("%d=%v/%d", r.ID, r.Labels, r.References))
	}
	return fmt.Sprint(out)
}

// want is the allocator's state in the same form.
func want(a identity.Allocator) string {
	var out []string
	for _, i := range a.List() {
		s := append([]string(nil), i.Labels...)
		out = append(out, fmt.Sprintf("%d=%v/%d", i.ID, sortStrings(s), i.RefCount))
	}
	return fmt.Sprint(out)
}

func sortStrings(s []string) []string {
	for i := range s {
		for j := i + 1; j < len(s); j++ {
			if s[j] < s[i] {
				s[i], s[j] = s[j], s[i]
			}
		}
	}
	return s
}

// TestFollowsLocalAllocator: identities known before the table, new ones,
// references taken and dropped, a reserved one and a released one are in
// the table as the allocator has them; the generation moves with the set
// of identities and their labels, not with references.
func TestFollowsLocalAllocator(t *testing.T) {
	a := identity.NewLocalAllocator()
	web, _, err := a.Allocate([]string{"k8s:app=web", "k8s:io.kubernetes.pod.namespace=shop"})
	if err != nil {
		t.Fatal(err)
	}
	tbl := newTable(t, a)
	if got, w := content(tbl), want(a); got != w || got == "[]" {
		t.Fatalf("initial table %s, allocator %s", got, w)
	}
	gen := tbl.Generation()
	db, _, _ := a.Allocate([]string{"k8s:io.kubernetes.pod.namespace=shop", "k8s:app=db"})
	if tbl.Generation() == gen {
		t.Fatal("a new identity did not change the generation")
	}
	gen = tbl.Generation()
	_, _, _ = a.Allocate([]string{"k8s:app=web", "k8s:io.kubernetes.pod.namespace=shop"})
	if r, ok := tbl.Lookup(web.ID); !ok || r.References != 2 {
		t.Fatalf("web after a second reference: %+v %v", r, ok)
	}
	if err := a.Reserve(identity.MinCluster+100, []string{"k8s:app=restored"}); err != nil {
		t.Fatal(err)
	}
	if _, ok := tbl.Lookup(identity.MinCluster + 100); !ok {
		t.Fatal("a reserved identity is not in the table")
	}
	gen = tbl.Generation()
	_ = a.Release(web.ID)
	if tbl.Generation() != gen {
		t.Fatal("dropping one of two references changed the generation")
	}
	_ = a.Release(db.ID)
	if _, ok := tbl.Lookup(db.ID); ok || tbl.Generation() == gen {
		t.Fatalf("released identity still in the table (generation %d, was %d)", tbl.Generation(), gen)
	}
	if got, w := content(tbl), want(a); got != w {
		t.Fatalf("table %s, allocator %s", got, w)
	}
	if got := tbl.WithLabel("k8s:io.kubernetes.pod.namespace=shop"); len(got) != 1 || got[0].ID != web.ID {
		t.Fatalf("identities with the namespace label: %v", got)
	}
}

// TestFollowsClusterCache: the cluster allocators' cache (identities
// learned from the cluster, forgotten, referenced locally) is followed the
// same way; an identity forgotten by the cluster while referenced here
// stays.
func TestFollowsClusterCache(t *testing.T) {
	a := crdalloc.New(quiet())
	a.Learn(1000, []string{"k8s:app=a"})
	tbl := newTable(t, a)
	a.Learn(1001, []string{"k8s:app=b"})
	a.Ref(1001)
	a.Forget(1001)
	a.Forget(1000)
	if got, w := content(tbl), "[1001=[k8s:app=b]/1]"; got != w || want(a) != w {
		t.Fatalf("table %s, allocator %s, want %s", got, want(a), w)
	}
	if _, err := a.Unref(1001); err != nil {
		t.Fatal(err)
	}
	a.Forget(1001)
	if got := content(tbl); got != "[]" {
		t.Fatalf("table %s after the last reference and the cluster's delete", got)
	}
}

// TestConcurrentChanges: allocations and releases from many goroutines
// (notifications arrive out of order) leave the table equal to the
// allocator.
func TestConcurrentChanges(t *testing.T) {
	a := identity.NewLocalAllocator()
	tbl := newTable(t, a)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				labels := []string{fmt.Sprintf("k8s:app=%d", i%17)}
				id, _, err := a.Allocate(labels)
				if err != nil {
					t.Error(err)
					return
				}
				if (i+g)%3 != 0 {
					_ = a.Release(id.ID)
				}
			}
		}()
	}
	wg.Wait()
	if got, w := content(tbl), want(a); got != w {
		t.Fatalf("table %s\nallocator %s", got, w)
	}
}
