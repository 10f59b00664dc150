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

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/tendril-net/tendril/pkg/identity"
	"github.com/tendril-net/tendril/pkg/k8s"
	v1alpha1 "github.com/tendril-net/tendril/pkg/k8s/apis/tendril.io/v1alpha1"
	"github.com/tendril-net/tendril/pkg/k8s/client/informers/externalversions"
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

// runWithWatcher runs the allocator's keeper, fed by a real informer on
// TendrilIdentities as the agent's watcher feeds it, on node's TendrilNode.
func runWithWatcher(t *testing.T, a *Allocator, c *k8s.Clients, node string) {
	t.Helper()
	a.SetNode(node)
	a.resyncInterval = 200 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	factory := externalversions.NewSharedInformerFactory(c.Tendril, 0)
	inf := factory.Tendril().V1alpha1().TendrilIdentities().Informer()
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { a.Upsert(o.(*v1alpha1.TendrilIdentity)) },
		UpdateFunc: func(_, o any) { a.Upsert(o.(*v1alpha1.TendrilIdentity)) },
		DeleteFunc: func(o any) {
			if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
				o = d.Obj
			}
			if obj, ok := o.(*v1alpha1.TendrilIdentity); ok {
				a.Delete(obj)
			}
		},
	}); err != nil {
		t.Fatal(err)
	}
	factory.Start(ctx.Done())
	factory.WaitForCacheSync(ctx.Done())
	done := make(chan struct{})
	go func() {
		defer close(done)
		a.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		factory.Shutdown()
	})
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestDeletedIdentityInUseIsRecreated: an identity this agent's endpoint
// holds is deleted (the GC found no TendrilEndpoint for it, or a person):
// the agent creates it again with the same number and labels. Deleted and
// retaken by other labels, it is revoked instead: the users are told and
// allocate a number that means their labels.
func TestDeletedIdentityInUseIsRecreated(t *testing.T) {
	a, c := newAllocator(t)
	runWithWatcher(t, a, c, "")
	ctx := context.Background()
	ids := c.Tendril.TendrilV1alpha1().TendrilIdentities()
	labels := []string{"k8s:app=keep-me", "k8s:io.kubernetes.pod.namespace=recreate"}
	held, _, err := a.Allocate(labels)
	if err != nil {
		t.Fatal(err)
	}
	name := strconv.Itoa(int(held.ID))
	waitFor(t, "the watcher to see the identity", func() bool { _, ok := a.Lookup(held.ID); return ok })
	if err := ids.Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the identity in use to be created again", func() bool {
		obj, err := ids.Get(ctx, name, metav1.GetOptions{})
		return err == nil && fmt.Sprint(LabelsOf(obj.SecurityLabels)) == fmt.Sprint(held.Labels)
	})

	// Deleted, then taken by other labels before the agent could act.
	revoked := make(chan identity.NumericIdentity, 1)
	a.SubscribeRevoked(func(id identity.NumericIdentity, l []string) {
		if identity.LabelsKey(l) == identity.LabelsKey(labels) {
			revoked <- id
		}
	})
	other := &v1alpha1.TendrilIdentity{ObjectMeta: metav1.ObjectMeta{Name: name}, SecurityLabels: map[string]string{"k8s:app": "usurper"}}
	for attempt := 0; ; attempt++ {
		if err := ids.Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
		// The agent may recreate it first: then delete again.
		_, err := ids.Create(ctx, other, metav1.CreateOptions{})
		if err == nil {
			break
		}
		if !apierrors.IsAlreadyExists(err) || attempt == 100 {
			t.Fatalf("take the number for other labels: %v", err)
		}
	}
	select {
	case id := <-revoked:
		if id != held.ID {
			t.Fatalf("revoked %d, want %d", id, held.ID)
		}
	case <-time.After(time.Minute):
		t.Fatalf("identity %d kept for %v after it went to other labels", held.ID, labels)
	}
	obj, err := ids.Get(ctx, name, metav1.GetOptions{})
	if err != nil || obj.SecurityLabels["k8s:app"] != "usurper" {
		t.Fatalf("the other labels' identity was changed: %v %v", obj, err)
	}
	again, _, err := a.Allocate(labels)
	if err != nil || again.ID == held.ID {
		t.Fatalf("allocate again: %v %v (the old number means other labels now)", again, err)
	}
}

// TestIdentitiesInUsePublished: the agent lists the identities it holds
// in its TendrilNode's annotation (the GC's evidence for endpoints without
// a TendrilEndpoint) and drops them once released.
func TestIdentitiesInUsePublished(t *testing.T) {
	a, c := newAllocator(t)
	ctx := context.Background()
	tn := &v1alpha1.TendrilNode{ObjectMeta: metav1.ObjectMeta{Name: "publisher-node"}}
	if _, err := c.Tendril.TendrilV1alpha1().TendrilNodes().Create(ctx, tn, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	runWithWatcher(t, a, c, "publisher-node")
	one, _, err := a.Allocate([]string{"k8s:app=published-1"})
	if err != nil {
		t.Fatal(err)
	}
	two, _, err := a.Allocate([]string{"k8s:app=published-2"})
	if err != nil {
		t.Fatal(err)
	}
	annotation := func() string {
		n, err := c.Tendril.TendrilV1alpha1().TendrilNodes().Get(ctx, "publisher-node", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return n.Annotations[AnnotationIdentitiesInUse]
	}
	lo, hi := min(one.ID, two.ID), max(one.ID, two.ID)
	waitFor(t, "both identities published", func() bool { return annotation() == fmt.Sprintf("%d,%d", lo, hi) })
	if err := a.Release(one.ID); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the released identity unpublished", func() bool { return annotation() == strconv.Itoa(int(two.ID)) })
}
