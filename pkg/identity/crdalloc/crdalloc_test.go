package crdalloc

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tendril-net/tendril/pkg/identity"
	"github.com/tendril-net/tendril/pkg/k8s"
	v1alpha1 "github.com/tendril-net/tendril/pkg/k8s/apis/tendril.io/v1alpha1"
	"github.com/tendril-net/tendril/pkg/k8s/crdinstall"
	"github.com/tendril-net/tendril/pkg/testutil/k8senv"
)

var controlPlane k8senv.Package

func TestMain(m *testing.M) {
	os.Exit(controlPlane.Main(m, k8senv.Options{}, func(env *k8senv.Env) error {
		c, err := k8s.NewClientsForConfig(env.RESTConfig())
		if err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, err = crdinstall.Install(ctx, c.Dynamic, slog.New(slog.NewTextHandler(io.Discard, nil)))
		return err
	}))
}

func newAllocator(t *testing.T) (*Allocator, *k8s.Clients) {
	t.Helper()
	env := controlPlane.Need(t)
	c, err := k8s.NewClientsForConfig(env.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	a := New(slog.New(slog.NewTextHandler(io.Discard, nil)))
	a.SetClient(c.Tendril)
	return a, c
}

// TestConcurrentAgentsAgreeOnIdentities: two allocators (two agents) with
// empty caches allocate the same 30 label sets at the same time; each set
// gets one identity, the same on both, and the API server holds exactly 30
// objects.
func TestConcurrentAgentsAgreeOnIdentities(t *testing.T) {
	a1, c := newAllocator(t)
	a2, _ := newAllocator(t)
	const sets = 30
	got := [2][sets]identity.NumericIdentity{}
	var wg sync.WaitGroup
	errs := make(chan error, 2*sets)
	for n, a := range []*Allocator{a1, a2} {
		for i := 0; i < sets; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				id, _, err := a.Allocate([]string{"k8s:app=app" + strconv.Itoa(i), "k8s:io.kubernetes.pod.namespace=race"})
				if err != nil {
					errs <- err
					return
				}
				got[n][i] = id.ID
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	seen := map[identity.NumericIdentity]bool{}
	for i := 0; i < sets; i++ {
		if got[0][i] != got[1][i] {
			t.Fatalf("label set %d: agent 1 got %d, agent 2 got %d", i, got[0][i], got[1][i])
		}
		if seen[got[0][i]] {
			t.Fatalf("identity %d given to two label sets", got[0][i])
		}
		seen[got[0][i]] = true
	}
	list, err := c.Tendril.TendrilV1alpha1().TendrilIdentities().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, o := range list.Items {
		if o.SecurityLabels["k8s:io.kubernetes.pod.namespace"] == "race" {
			n++
		}
	}
	if n != sets {
		t.Fatalf("%d objects for %d label sets", n, sets)
	}
}

// TestCollisionProbesOnward: the first candidate number of a label set is
// taken by other labels; allocation moves to the next number, and a second
// agent ends at the same one.
func TestCollisionProbesOnward(t *testing.T) {
	a1, c := newAllocator(t)
	labels := []string{"k8s:app=collide"}
	first := candidate(identity.LabelsKey(labels), 0)
	squatter := &v1alpha1.TendrilIdentity{ObjectMeta: metav1.ObjectMeta{Name: strconv.Itoa(int(first))}, SecurityLabels: map[string]string{"k8s:app": "squatter"}}
	if _, err := c.Tendril.TendrilV1alpha1().TendrilIdentities().Create(context.Background(), squatter, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	id, created, err := a1.Allocate(labels)
	if err != nil {
		t.Fatal(err)
	}
	if id.ID != candidate(identity.LabelsKey(labels), 1) || !created {
		t.Fatalf("got %d (created %v), want the second candidate %d", id.ID, created, candidate(identity.LabelsKey(labels), 1))
	}
	// The squatter became known on the way.
	if l, ok := a1.Lookup(first); !ok || l.Labels[0] != "k8s:app=squatter" {
		t.Fatalf("squatter not learned: %+v", l)
	}
	a2, _ := newAllocator(t)
	id2, created2, err := a2.Allocate(labels)
	if err != nil {
		t.Fatal(err)
	}
	if id2.ID != id.ID || created2 {
		t.Fatalf("second agent got %d (created %v), want %d reused", id2.ID, created2, id.ID)
	}
	// Reserve of a restored endpoint's identity: right number ok, wrong
	// number refused.
	if err := a2.Reserve(id.ID, labels); err != nil {
		t.Fatal(err)
	}
	if err := a2.Reserve(first, labels); err == nil {
		t.Fatal("reserved a number the cluster gives to other labels")
	}
}

// TestWatcherEventsReachListeners: identities other agents create arrive
// through Upsert and Delete, change the generation and reach listeners; a
// locally referenced identity survives a Delete.
func TestWatcherEventsReachListeners(t *testing.T) {
	a, _ := newAllocator(t)
	var mu sync.Mutex
	var added, deleted []identity.NumericIdentity
	a.Subscribe(func(ad, de []identity.Identity) {
		mu.Lock()
		defer mu.Unlock()
		for _, i := range ad {
			added = append(added, i.ID)
		}
		for _, i := range de {
			deleted = append(deleted, i.ID)
		}
	})
	g0 := a.Generation()
	obj := &v1alpha1.TendrilIdentity{ObjectMeta: metav1.ObjectMeta{Name: "40000"}, SecurityLabels: map[string]string{"k8s:app": "remote"}}
	a.Upsert(obj)
	a.Upsert(obj) // a resync: nothing new
	if l, ok := a.Lookup(40000); !ok || l.Labels[0] != "k8s:app=remote" {
		t.Fatalf("lookup %+v", l)
	}
	a.Delete(obj)
	if _, ok := a.Lookup(40000); ok {
		t.Fatal("deleted identity still known")
	}
	if fmt.Sprint(added, deleted) != "[40000] [40000]" || a.Generation() != g0+2 {
		t.Fatalf("added %v deleted %v generation %d→%d", added, deleted, g0, a.Generation())
	}
	a.Upsert(&v1alpha1.TendrilIdentity{ObjectMeta: metav1.ObjectMeta{Name: "not-a-number"}})
	if len(a.List()) != 0 {
		t.Fatalf("bad name accepted: %v", a.List())
	}
}

// BenchmarkAllocate creates a new identity per iteration against the real
// API server (one create per allocation).
func BenchmarkAllocate(b *testing.B) {
	env := controlPlane.Need(b)
	c, err := k8s.NewClientsForConfig(env.RESTConfig())
	if err != nil {
		b.Fatal(err)
	}
	a := New(slog.New(slog.NewTextHandler(io.Discard, nil)))
	a.SetClient(c.Tendril)
	run := strconv.FormatInt(time.Now().UnixNano(), 10)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, _, err := a.Allocate([]string{"k8s:app=bench" + strconv.Itoa(i), "k8s:run=" + run}); err != nil {
			b.Fatal(err)
		}
	}
}

// TestThousandDistinctLabelSets: 1,000 label sets allocated by 8
// goroutines get 1,000 distinct identities.
func TestThousandDistinctLabelSets(t *testing.T) {
	a, _ := newAllocator(t)
	seen := map[identity.NumericIdentity]int{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	errs := make(chan error, 1000)
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < 1000; i += 8 {
				id, _, err := a.Allocate([]string{"k8s:app=bulk" + strconv.Itoa(i), "k8s:io.kubernetes.pod.namespace=bulk"})
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				if prev, dup := seen[id.ID]; dup {
					errs <- fmt.Errorf("identity %d given to sets %d and %d", id.ID, prev, i)
				}
				seen[id.ID] = i
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if len(seen) != 1000 {
		t.Fatalf("%d distinct identities for 1,000 label sets", len(seen))
	}
}

// TestClaimFromGC: an agent's first use of a known identity removes the
// GC's unused mark (so the GC's delete, preconditioned on the marked
// version, fails), and an identity collected behind the agent's cache is
// created again instead of being used without an object.
func TestClaimFromGC(t *testing.T) {
	a, c := newAllocator(t)
	ctx := context.Background()
	ids := c.Tendril.TendrilV1alpha1().TendrilIdentities()
	labels := []string{"k8s:app=claim-test", "k8s:io.kubernetes.pod.namespace=claim"}
	first, _, err := a.Allocate(labels)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Release(first.ID); err != nil {
		t.Fatal(err)
	}
	name := strconv.Itoa(int(first.ID))
	// The GC marks it unused.
	obj, err := ids.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	obj.Annotations = map[string]string{AnnotationUnusedSince: time.Now().UTC().Format(time.RFC3339)}
	marked, err := ids.Update(ctx, obj, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// First local use again: the mark goes, the marked version is stale.
	again, _, err := a.Allocate(labels)
	if err != nil || again.ID != first.ID {
		t.Fatalf("allocate again: %v %v", again, err)
	}
	obj, err = ids.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, still := obj.Annotations[AnnotationUnusedSince]; still {
		t.Fatal("the unused mark survived a claim")
	}
	err = ids.Delete(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{ResourceVersion: &marked.ResourceVersion}})
	if err == nil {
		t.Fatal("a delete at the marked version succeeded after the claim")
	}
	// Collected while the agent's cache still knows it: the next first
	// use creates the object again with the same number and labels.
	if err := a.Release(again.ID); err != nil {
		t.Fatal(err)
	}
	if err := ids.Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	third, _, err := a.Allocate(labels)
	if err != nil {
		t.Fatal(err)
	}
	obj, err = ids.Get(ctx, strconv.Itoa(int(third.ID)), metav1.GetOptions{})
	if err != nil {
		t.Fatalf("identity %d in use without its object: %v", third.ID, err)
	}
	if fmt.Sprint(LabelsOf(obj.SecurityLabels)) != fmt.Sprint(third.Labels) {
		t.Fatalf("recreated object labels %v, want %v", obj.SecurityLabels, third.Labels)
	}
}
