package identitygc

import (
	"context"
	"fmt"
	"github.com/tendril-net/tendril/pkg/kvstore/kvembed"
	"github.com/tendril-net/tendril/pkg/operator/operatortest"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tendril-net/tendril/pkg/identity"
	"github.com/tendril-net/tendril/pkg/identity/crdalloc"
	"github.com/tendril-net/tendril/pkg/identity/kvalloc"
	"github.com/tendril-net/tendril/pkg/k8s"
	v1alpha1 "github.com/tendril-net/tendril/pkg/k8s/apis/tendril.io/v1alpha1"
	"github.com/tendril-net/tendril/pkg/kvstore"
	"github.com/tendril-net/tendril/pkg/operator/kvstoreclient"
	"github.com/tendril-net/tendril/pkg/operator/resources"
	"github.com/tendril-net/tendril/pkg/testutil/k8senv"
)

var env k8senv.Package

func TestMain(m *testing.M) {
	os.Exit(env.Main(m, k8senv.Options{}, operatortest.InstallCRDs))
}

func setup(t *testing.T) (*k8s.Clients, *resources.Resources) {
	t.Helper()
	e := env.Need(t)
	c, err := k8s.NewClientsForConfig(e.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	res, stop, err := resources.Start(context.Background(), c, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	return c, res
}

func testConfig(mode string, grace time.Duration) Config {
	cfg := DefaultConfig()
	cfg.IdentityAllocationMode = mode
	cfg.IdentityHeartbeatTimeout = grace
	cfg.IdentityGCRateLimit = 1_000_000 // unlimited for the tests; the benchmark measures the limit
	return cfg
}

func publish(c *k8s.Clients, ns, name string, id identity.NumericIdentity) error {
	ep := &v1alpha1.TendrilEndpoint{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Status: v1alpha1.EndpointStatus{Identity: &v1alpha1.EndpointIdentity{ID: int64(id)}}}
	_, err := c.Tendril.TendrilV1alpha1().TendrilEndpoints(ns).Create(context.Background(), ep, metav1.CreateOptions{})
	return err
}

// TestCRDMarkThenDelete: an unused identity is marked, then deleted once
// the grace period has passed; one an endpoint uses stays; a marked one
// used again loses its mark.
func TestCRDMarkThenDelete(t *testing.T) {
	c, res := setup(t)
	ctx := context.Background()
	a := crdalloc.New(operatortest.Quiet())
	a.SetClient(c.Tendril)
	used, _, err := a.Allocate([]string{"k8s:app=used"})
	if err != nil {
		t.Fatal(err)
	}
	unused, _, err := a.Allocate([]string{"k8s:app=unused"})
	if err != nil {
		t.Fatal(err)
	}
	_ = a.Release(unused.ID)
	if err := publish(c, "default", "used-pod", used.ID); err != nil {
		t.Fatal(err)
	}
	operatortest.WaitFor(t, "the caches", time.Minute, func() bool {
		ids, _ := res.Identities.List(everything())
		eps, _ := res.EndpointsByIdentity.ByIndex(resources.IdentityIndex, strconv.Itoa(int(used.ID)))
		return len(ids) >= 2 && len(eps) == 1
	})

	gc := New(testConfig("crd", time.Hour), operatortest.Quiet(), c, res, nil)
	now := time.Now()
	gc.SetClock(func() time.Time { return now })
	r, err := gc.Pass(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if r.Marked != 1 || r.Deleted != 0 {
		t.Fatalf("first pass: %s", r)
	}
	ids := c.Tendril.TendrilV1alpha1().TendrilIdentities()
	obj, err := ids.Get(ctx, strconv.Itoa(int(unused.ID)), metav1.GetOptions{})
	if err != nil || obj.Annotations[crdalloc.AnnotationUnusedSince] == "" {
		t.Fatalf("unused identity not marked: %v %v", obj.Annotations, err)
	}
	// Within the grace period: nothing deleted.
	now = now.Add(59 * time.Minute)
	operatortest.WaitFor(t, "the mark in the cache", time.Minute, func() bool {
		o, err := res.Identities.Get(strconv.Itoa(int(unused.ID)))
		return err == nil && o.Annotations[crdalloc.AnnotationUnusedSince] != ""
	})
	if r, err := gc.Pass(ctx); err != nil || r.Deleted != 0 {
		t.Fatalf("pass within grace: %s %v", r, err)
	}
	now = now.Add(2 * time.Minute)
	if r, err := gc.Pass(ctx); err != nil || r.Deleted != 1 {
		t.Fatalf("pass after grace: %s %v", r, err)
	}
	if _, err := ids.Get(ctx, strconv.Itoa(int(unused.ID)), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("unused identity still there: %v", err)
	}
	if _, err := ids.Get(ctx, strconv.Itoa(int(used.ID)), metav1.GetOptions{}); err != nil {
		t.Fatalf("used identity gone: %v", err)
	}
}

func everything() labelsSelector { return labelsEverything() }

// TestCRDChurn: four agents allocate identities from a pool of label sets,
// publish an endpoint with each, check that its identity object exists
// while the endpoint does, then drop it, while the GC runs pass after
// pass with a short grace period. The GC must delete identities during
// the run (so it races with the agents) and no agent may ever hold an
// identity without its object. After the churn, every identity goes.
func TestCRDChurn(t *testing.T) {
	c, res := setup(t)
	gc := New(testConfig("crd", 2*time.Second), operatortest.Quiet(), c, res, nil)
	ctx, cancel := context.WithCancel(context.Background())
	var gcWG sync.WaitGroup
	var deleted, kept atomic.Int64
	gcWG.Add(1)
	go func() {
		defer gcWG.Done()
		for ctx.Err() == nil {
			r, err := gc.Pass(ctx)
			if err != nil && ctx.Err() == nil {
				t.Errorf("GC pass: %v", err)
			}
			deleted.Add(int64(r.Deleted))
			kept.Add(int64(r.Kept))
			time.Sleep(20 * time.Millisecond)
		}
	}()
	const workers, rounds, pool = 4, 60, 12
	var violations atomic.Int64
	var wg sync.WaitGroup
	ns := "default"
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a := crdalloc.New(operatortest.Quiet())
			a.SetClient(c.Tendril)
			eps := c.Tendril.TendrilV1alpha1().TendrilEndpoints(ns)
			for i := 0; i < rounds; i++ {
				labels := []string{fmt.Sprintf("k8s:app=churn-%d", (i*7+w)%pool)}
				id, _, err := a.Allocate(labels)
				if err != nil {
					t.Errorf("allocate: %v", err)
					return
				}
				name := fmt.Sprintf("pod-%d-%d", w, i)
				if err := publish(c, ns, name, id.ID); err != nil {
					t.Errorf("publish: %v", err)
					return
				}
				time.Sleep(time.Duration(50+(i%5)*100) * time.Millisecond)
				obj, err := c.Tendril.TendrilV1alpha1().TendrilIdentities().Get(context.Background(), strconv.Itoa(int(id.ID)), metav1.GetOptions{})
				if err != nil || crdalloc.LabelsOf(obj.SecurityLabels)[0] != labels[0] {
					violations.Add(1)
					t.Errorf("endpoint %s uses identity %d, whose object is %v (%v)", name, id.ID, obj, err)
				}
				if err := eps.Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
					t.Errorf("delete endpoint: %v", err)
				}
				_ = a.Release(id.ID)
				// Sometimes wait out the grace period so the GC collects
				// identities this agent's cache still knows.
				if i%15 == 14 {
					time.Sleep(2500 * time.Millisecond)
				}
			}
		}()
	}
	wg.Wait()
	if violations.Load() > 0 {
		cancel()
		gcWG.Wait()
		t.Fatalf("%d endpoints held an identity without its object", violations.Load())
	}
	if deleted.Load() == 0 {
		cancel()
		gcWG.Wait()
		t.Fatal("the GC deleted nothing during the churn: the test did not race")
	}
	t.Logf("during the churn: %d identities deleted, %d deletions refused by a concurrent claim", deleted.Load(), kept.Load())
	operatortest.WaitFor(t, "every identity to be collected", time.Minute, func() bool {
		l, err := c.Tendril.TendrilV1alpha1().TendrilIdentities().List(context.Background(), metav1.ListOptions{})
		n := 0
		for _, o := range l.Items {
			if len(o.SecurityLabels) > 0 && crdalloc.LabelsOf(o.SecurityLabels)[0] >= "k8s:app=churn-" && crdalloc.LabelsOf(o.SecurityLabels)[0] < "k8s:app=churn." {
				n++
			}
		}
		return err == nil && n == 0
	})
	cancel()
	gcWG.Wait()
}

// TestKVStoreChurn is the churn test in kvstore mode: two nodes reference
// identities (value keys on their session leases) while the GC deletes
// unreferenced master keys; a node never holds a reference to a master
// key that is gone, and after the churn every master and index key goes.
func TestKVStoreChurn(t *testing.T) {
	dir := t.TempDir()
	srv, err := kvembed.Start(context.Background(), kvembed.Config{Dir: dir, UnsafeNoFsync: true}, operatortest.Quiet())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Stop(context.Background()) })
	connect := func() *kvstore.Client {
		cfg := kvstore.DefaultConfig()
		cfg.Endpoints = srv.Endpoints()
		cfg.ConnectTimeout = 20 * time.Second
		kv, err := kvstore.Connect(context.Background(), cfg, operatortest.Quiet())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = kv.Close(context.Background()) })
		return kv
	}
	gcKV := connect()
	gc := New(testConfig("kvstore", time.Second), operatortest.Quiet(), nil, nil, kvstoreclient.ForClient(gcKV))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var deleted atomic.Int64
	var gcWG sync.WaitGroup
	gcWG.Add(1)
	go func() {
		defer gcWG.Done()
		for ctx.Err() == nil {
			r, err := gc.Pass(ctx)
			if err != nil && ctx.Err() == nil {
				t.Errorf("GC pass: %v", err)
			}
			deleted.Add(int64(r.Deleted))
			time.Sleep(10 * time.Millisecond)
		}
	}()
	const nodes, rounds, pool = 2, 80, 8
	var violations atomic.Int64
	var wg sync.WaitGroup
	for n := 0; n < nodes; n++ {
		kv := connect()
		a := kvalloc.New(kv, fmt.Sprintf("node-%d", n), operatortest.Quiet())
		go a.Run(ctx)
		if err := a.WaitSynced(ctx); err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < rounds; i++ {
				labels := []string{fmt.Sprintf("k8s:app=kv-churn-%d", (i*3+n)%pool)}
				id, _, err := a.Allocate(labels)
				if err != nil {
					t.Errorf("allocate: %v", err)
					return
				}
				time.Sleep(time.Duration(20+(i%4)*60) * time.Millisecond)
				m, found, err := kv.Get(context.Background(), kvalloc.IDPrefix+strconv.Itoa(int(id.ID)))
				if err != nil || !found || string(m.Value) != identity.LabelsKey(labels) {
					violations.Add(1)
					t.Errorf("node-%d references identity %d whose master key is %q (found %v, %v)", n, id.ID, m.Value, found, err)
				}
				if err := a.Release(id.ID); err != nil {
					t.Errorf("release: %v", err)
				}
				if i%20 == 19 {
					time.Sleep(1500 * time.Millisecond)
				}
			}
		}()
	}
	wg.Wait()
	if violations.Load() > 0 {
		t.Fatalf("%d references to collected identities", violations.Load())
	}
	if deleted.Load() == 0 {
		t.Fatal("the GC deleted nothing during the churn: the test did not race")
	}
	t.Logf("during the churn: %d identities deleted", deleted.Load())
	operatortest.WaitFor(t, "every master and index key to be collected", time.Minute, func() bool {
		m, _, err1 := gcKV.GetPrefix(context.Background(), kvalloc.IDPrefix)
		x, _, err2 := gcKV.GetPrefix(context.Background(), kvalloc.LabelsPrefix)
		return err1 == nil && err2 == nil && len(m) == 0 && len(x) == 0
	})
	cancel()
	gcWG.Wait()
}

// TestCRDIdentityListedByNodeIsKept: an identity no TendrilEndpoint refers
// to, but that an existing TendrilNode lists as in use by its agent's
// endpoints (one without a pod, or whose TendrilEndpoint writes fail), is
// never collected; once the node no longer lists it, it is. Malformed
// entries in the list are skipped.
func TestCRDIdentityListedByNodeIsKept(t *testing.T) {
	c, res := setup(t)
	ctx := context.Background()
	a := crdalloc.New(operatortest.Quiet())
	a.SetClient(c.Tendril)
	held, _, err := a.Allocate([]string{"k8s:app=no-tendrilendpoint"})
	if err != nil {
		t.Fatal(err)
	}
	name := strconv.Itoa(int(held.ID))
	const annotation = "tendril.io/identities-in-use" // crdalloc.AnnotationIdentitiesInUse
	tn := &v1alpha1.TendrilNode{ObjectMeta: metav1.ObjectMeta{Name: "node-without-endpoints",
		Annotations: map[string]string{annotation: "not-a-number,12," + name + ",99999999"}}}
	tnodes := c.Tendril.TendrilV1alpha1().TendrilNodes()
	if _, err := tnodes.Create(ctx, tn, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tnodes.Delete(context.Background(), tn.Name, metav1.DeleteOptions{}) })
	operatortest.WaitFor(t, "the caches", time.Minute, func() bool {
		_, errID := res.Identities.Get(name)
		n, errN := res.TNodes.Get(tn.Name)
		return errID == nil && errN == nil && n.Annotations[annotation] != ""
	})
	gc := New(testConfig("crd", time.Minute), operatortest.Quiet(), c, res, nil)
	now := time.Now()
	gc.SetClock(func() time.Time { return now })
	ids := c.Tendril.TendrilV1alpha1().TendrilIdentities()
	for range 3 {
		if _, err := gc.Pass(ctx); err != nil {
			t.Fatal(err)
		}
		now = now.Add(time.Hour)
	}
	obj, err := ids.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("identity %d in use on a node was collected: %v", held.ID, err)
	}
	if _, marked := obj.Annotations[crdalloc.AnnotationUnusedSince]; marked {
		t.Fatalf("identity %d in use on a node is marked unused", held.ID)
	}
	// The node no longer lists it: collected after the grace period.
	cur, err := tnodes.Get(ctx, tn.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cur.Annotations[annotation] = ""
	if _, err := tnodes.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	operatortest.WaitFor(t, "the node's list in the cache", time.Minute, func() bool {
		n, err := res.TNodes.Get(tn.Name)
		return err == nil && n.Annotations[annotation] == ""
	})
	deleted := false
	for range 3 {
		r, err := gc.Pass(ctx)
		if err != nil {
			t.Fatal(err)
		}
		deleted = deleted || r.Deleted > 0
		now = now.Add(time.Hour)
		// Wait for the mark to reach the cache before the next pass.
		operatortest.WaitFor(t, "the identity's state in the cache", time.Minute, func() bool {
			o, err := res.Identities.Get(name)
			return err != nil || o.Annotations[crdalloc.AnnotationUnusedSince] != ""
		})
	}
	if _, err := ids.Get(ctx, name, metav1.GetOptions{}); !apierrors.IsNotFound(err) || !deleted {
		t.Fatalf("identity %d no longer listed was not collected: %v", held.ID, err)
	}
}
