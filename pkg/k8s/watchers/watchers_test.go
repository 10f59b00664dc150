package watchers

import (
	"context"
	"io"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"

	"github.com/tendril-net/tendril/pkg/k8s"
	v1alpha1 "github.com/tendril-net/tendril/pkg/k8s/apis/tendril.io/v1alpha1"
	"github.com/tendril-net/tendril/pkg/k8s/crdinstall"
	"github.com/tendril-net/tendril/pkg/loadbalancer/k8scache"
	"github.com/tendril-net/tendril/pkg/policy/api"
	"github.com/tendril-net/tendril/pkg/testutil/k8senv"
)

var controlPlane k8senv.Package

func TestMain(m *testing.M) { os.Exit(controlPlane.Main(m, k8senv.Options{}, nil)) }

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// recorder collects one subscriber's events.
type recorder[T runtime.Object] struct {
	mu     sync.Mutex
	events []string
	synced bool
	// upsertsBeforeSync counts objects delivered before the Synced marker.
	upsertsBeforeSync int
}

func (r *recorder[T]) record(ev Event[T]) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if ev.Kind == Synced {
		r.synced = true
		return
	}
	if !r.synced {
		r.upsertsBeforeSync++
	}
	r.events = append(r.events, ev.Kind.String()+" "+ev.Key)
}

func (r *recorder[T]) has(s string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range r.events {
		if e == s {
			return true
		}
	}
	return false
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestWatchersAgainstAPIServer runs in order: without the CRDs the cache
// sync times out naming exactly the Tendril resources; with them, every
// watched kind's create, update and delete reaches a subscriber, existing
// objects come before Synced, and pods of other nodes are not cached.
func TestWatchersAgainstAPIServer(t *testing.T) {
	env := controlPlane.Need(t)
	c, err := k8s.NewClientsForConfig(env.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	t.Run("cache sync timeout names the unsynced resources", func(t *testing.T) {
		w := New(c, "node-a", quiet())
		w.Start(ctx)
		defer w.Stop()
		err := w.WaitForCacheSync(ctx, 2*time.Second)
		if err == nil {
			t.Fatal("caches synced although the Tendril CRDs are not installed")
		}
		want := "kubernetes caches not synced after 2s: tendrilclusterwidenetworkpolicies, tendrilendpoints, tendrilidentities, tendrilloadbalancerippools, tendrillocalredirectpolicies, tendrilnetworkpolicies, tendrilnodes"
		if err.Error() != want {
			t.Fatalf("error %q,\nwant %q", err, want)
		}
	})

	if _, err := crdinstall.Install(ctx, c.Dynamic, quiet()); err != nil {
		t.Fatal(err)
	}
	mkNS := func(name string) {
		if _, err := c.Core.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	mkNS("existing")

	t.Run("events reach subscribers", func(t *testing.T) {
		w := New(c, "node-a", quiet())
		w.Start(ctx)
		defer w.Stop()
		if err := w.WaitForCacheSync(ctx, time.Minute); err != nil {
			t.Fatal(err)
		}
		nsRec := &recorder[*corev1.Namespace]{}
		if _, err := w.Namespaces.Subscribe(nsRec.record); err != nil {
			t.Fatal(err)
		}
		eventually(t, "namespaces synced", func() bool { nsRec.mu.Lock(); defer nsRec.mu.Unlock(); return nsRec.synced })
		if !nsRec.has("upsert existing") || nsRec.upsertsBeforeSync < 1 {
			t.Fatalf("existing namespace not delivered before Synced: %v", nsRec.events)
		}

		pods := &recorder[*corev1.Pod]{}
		nodes := &recorder[*corev1.Node]{}
		svcs := &recorder[*k8scache.Service]{}
		slices := &recorder[*k8scache.Slice]{}
		nps := &recorder[*networkingv1.NetworkPolicy]{}
		tnps := &recorder[*v1alpha1.TendrilNetworkPolicy]{}
		tcnps := &recorder[*v1alpha1.TendrilClusterwideNetworkPolicy]{}
		tids := &recorder[*v1alpha1.TendrilIdentity]{}
		teps := &recorder[*k8s.CachedEndpoint]{}
		tns := &recorder[*v1alpha1.TendrilNode]{}
		for _, err := range []error{
			sub(w.Pods, pods), sub(w.Nodes, nodes), sub(w.Services, svcs), sub(w.EndpointSlices, slices),
			sub(w.NetworkPolicies, nps), sub(w.TendrilNetworkPolicies, tnps), sub(w.TendrilClusterwideNetworkPolicies, tcnps),
			sub(w.TendrilIdentities, tids), sub(w.TendrilEndpoints, teps), sub(w.TendrilNodes, tns),
		} {
			if err != nil {
				t.Fatal(err)
			}
		}

		ns := "w"
		mkNS(ns)
		cs, td := c.Core, c.Tendril.TendrilV1alpha1()
		labels := map[string]string{"app": "web"}
		type step struct {
			key    string
			create func() error
			update func() error
			delete func() error
			rec    interface{ has(string) bool }
		}
		zero := int64(0)
		del := metav1.DeleteOptions{GracePeriodSeconds: &zero}
		pod := func(name, node string) *corev1.Pod {
			return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels},
				Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "none"}}}}
		}
		rule := &api.Rule{EndpointSelector: &api.EndpointSelector{MatchLabels: labels}}
		steps := []step{
			{"w/p1", func() error {
				_, err := cs.CoreV1().Pods(ns).Create(ctx, pod("p1", "node-a"), metav1.CreateOptions{})
				return err
			},
				func() error {
					return patchLabels(ctx, cs.CoreV1().RESTClient().Patch, "pods", ns, "p1")
				},
				func() error { return cs.CoreV1().Pods(ns).Delete(ctx, "p1", del) }, pods},
			{"n1", func() error {
				_, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}, metav1.CreateOptions{})
				return err
			}, func() error { return patchLabels(ctx, cs.CoreV1().RESTClient().Patch, "nodes", "", "n1") },
				func() error { return cs.CoreV1().Nodes().Delete(ctx, "n1", metav1.DeleteOptions{}) }, nodes},
			{"w/s1", func() error {
				_, err := cs.CoreV1().Services(ns).Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "s1", Namespace: ns},
					Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}}}, metav1.CreateOptions{})
				return err
			}, func() error { return patchLabels(ctx, cs.CoreV1().RESTClient().Patch, "services", ns, "s1") },
				func() error { return cs.CoreV1().Services(ns).Delete(ctx, "s1", metav1.DeleteOptions{}) }, svcs},
			{"w/es1", func() error {
				port, ready := int32(8080), true
				_, err := cs.DiscoveryV1().EndpointSlices(ns).Create(ctx, &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: "es1", Namespace: ns,
					Labels: map[string]string{discoveryv1.LabelServiceName: "s1"}},
					AddressType: discoveryv1.AddressTypeIPv4,
					Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"10.244.0.7"}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}}},
					Ports:       []discoveryv1.EndpointPort{{Port: &port}}}, metav1.CreateOptions{})
				if err != nil {
					return err
				}
				// The cache holds the slice as its service's backends.
				eventually(t, "es1 cached as backends", func() bool {
					sl, ok := w.EndpointSlices.Get("w/es1")
					return ok && sl.OK && sl.Service.String() == "w/s1" && len(sl.Backends) == 1 &&
						sl.Backends[0].Addr.String() == "10.244.0.7:8080" && sl.Backends[0].Source == "es1" && sl.ResourceVersion != ""
				})
				return nil
			}, func() error {
				return patchLabels(ctx, cs.DiscoveryV1().RESTClient().Patch, "endpointslices", ns, "es1")
			},
				func() error { return cs.DiscoveryV1().EndpointSlices(ns).Delete(ctx, "es1", metav1.DeleteOptions{}) }, slices},
			{"w/np1", func() error {
				_, err := cs.NetworkingV1().NetworkPolicies(ns).Create(ctx, &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "np1", Namespace: ns}}, metav1.CreateOptions{})
				return err
			}, func() error {
				return patchLabels(ctx, cs.NetworkingV1().RESTClient().Patch, "networkpolicies", ns, "np1")
			},
				func() error { return cs.NetworkingV1().NetworkPolicies(ns).Delete(ctx, "np1", metav1.DeleteOptions{}) }, nps},
			{"w/tnp1", func() error {
				_, err := td.TendrilNetworkPolicies(ns).Create(ctx, &v1alpha1.TendrilNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "tnp1", Namespace: ns}, Spec: rule}, metav1.CreateOptions{})
				return err
			}, func() error {
				return patchLabels(ctx, td.RESTClient().Patch, v1alpha1.ResourceNetworkPolicies, ns, "tnp1")
			},
				func() error { return td.TendrilNetworkPolicies(ns).Delete(ctx, "tnp1", metav1.DeleteOptions{}) }, tnps},
			{"tcnp1", func() error {
				_, err := td.TendrilClusterwideNetworkPolicies().Create(ctx, &v1alpha1.TendrilClusterwideNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "tcnp1"}, Spec: rule}, metav1.CreateOptions{})
				return err
			}, func() error {
				return patchLabels(ctx, td.RESTClient().Patch, v1alpha1.ResourceClusterwideNetworkPolicies, "", "tcnp1")
			}, func() error {
				return td.TendrilClusterwideNetworkPolicies().Delete(ctx, "tcnp1", metav1.DeleteOptions{})
			}, tcnps},
			{"1000", func() error {
				_, err := td.TendrilIdentities().Create(ctx, &v1alpha1.TendrilIdentity{ObjectMeta: metav1.ObjectMeta{Name: "1000"}, SecurityLabels: map[string]string{"k8s:app": "web"}}, metav1.CreateOptions{})
				return err
			}, func() error { return patchLabels(ctx, td.RESTClient().Patch, v1alpha1.ResourceIdentities, "", "1000") },
				func() error { return td.TendrilIdentities().Delete(ctx, "1000", metav1.DeleteOptions{}) }, tids},
			{"w/tep1", func() error {
				_, err := td.TendrilEndpoints(ns).Create(ctx, &v1alpha1.TendrilEndpoint{ObjectMeta: metav1.ObjectMeta{Name: "tep1", Namespace: ns}}, metav1.CreateOptions{})
				return err
			}, func() error { return patchLabels(ctx, td.RESTClient().Patch, v1alpha1.ResourceEndpoints, ns, "tep1") },
				func() error { return td.TendrilEndpoints(ns).Delete(ctx, "tep1", metav1.DeleteOptions{}) }, teps},
			{"tn1", func() error {
				_, err := td.TendrilNodes().Create(ctx, &v1alpha1.TendrilNode{ObjectMeta: metav1.ObjectMeta{Name: "tn1"}}, metav1.CreateOptions{})
				return err
			}, func() error { return patchLabels(ctx, td.RESTClient().Patch, v1alpha1.ResourceNodes, "", "tn1") },
				func() error { return td.TendrilNodes().Delete(ctx, "tn1", metav1.DeleteOptions{}) }, tns},
		}
		for _, s := range steps {
			if err := s.create(); err != nil {
				t.Fatalf("create %s: %v", s.key, err)
			}
			eventually(t, "upsert of "+s.key, func() bool { return s.rec.has("upsert " + s.key) })
			before := countOf(s.rec, "upsert "+s.key)
			if err := s.update(); err != nil {
				t.Fatalf("update %s: %v", s.key, err)
			}
			eventually(t, "update of "+s.key, func() bool { return countOf(s.rec, "upsert "+s.key) > before })
			if err := s.delete(); err != nil {
				t.Fatalf("delete %s: %v", s.key, err)
			}
			eventually(t, "delete of "+s.key, func() bool { return s.rec.has("delete " + s.key) })
		}

		// A pod of another node never reaches this node's cache.
		if _, err := cs.CoreV1().Pods(ns).Create(ctx, pod("other", "node-b"), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := cs.CoreV1().Pods(ns).Create(ctx, pod("mine", "node-a"), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		eventually(t, "the local pod", func() bool { return pods.has("upsert w/mine") })
		if pods.has("upsert w/other") {
			t.Fatal("a pod of node-b reached node-a's cache")
		}
		mine, ok := w.Pods.Get("w/mine")
		if !ok {
			t.Fatal("Get of a cached pod failed")
		}
		// The API server records the creator's fields; the cache drops
		// them (memory at 100k objects).
		if stored, err := cs.CoreV1().Pods(ns).Get(ctx, "mine", metav1.GetOptions{}); err != nil || len(stored.ManagedFields) == 0 {
			t.Fatalf("the API server's pod has no managed fields (%v): nothing to check", err)
		}
		if len(mine.ManagedFields) != 0 {
			t.Errorf("cached pod keeps %d managed fields entries", len(mine.ManagedFields))
		}
		for _, st := range w.Status() {
			if !st.Synced {
				t.Errorf("status: %s not synced", st.Name)
			}
		}
	})
}

func sub[T runtime.Object](r *Resource[T], rec *recorder[T]) error {
	_, err := r.Subscribe(rec.record)
	return err
}

func countOf(r interface{ has(string) bool }, s string) int {
	type counter interface{ count(string) int }
	if c, ok := r.(counter); ok {
		return c.count(s)
	}
	return 0
}

func (r *recorder[T]) count(s string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, e := range r.events {
		if e == s {
			n++
		}
	}
	return n
}

// patchLabels changes an object's labels with a merge patch through a
// REST client, so one helper updates every kind.
func patchLabels(ctx context.Context, patch func(pt types.PatchType) *rest.Request, resource, ns, name string) error {
	req := patch(types.MergePatchType).Resource(resource).Name(name).Body([]byte(`{"metadata":{"labels":{"changed":"yes"}}}`))
	if ns != "" {
		req = req.Namespace(ns)
	}
	return req.Do(ctx).Error()
}
