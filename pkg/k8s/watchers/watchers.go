package watchers

import (
	"context"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"

	"github.com/tendril-net/tendril/pkg/k8s"
	v1alpha1 "github.com/tendril-net/tendril/pkg/k8s/apis/tendril.io/v1alpha1"
	tendrilinformers "github.com/tendril-net/tendril/pkg/k8s/client/informers/externalversions"
	"github.com/tendril-net/tendril/pkg/loadbalancer/k8scache"
)

// Watchers are the agent's caches, one Resource per kind.
type Watchers struct {
	Pods       *Resource[*corev1.Pod]
	Namespaces *Resource[*corev1.Namespace]
	Nodes      *Resource[*corev1.Node]
	// Services are cached as their conversions (k8scache.Service).
	Services *Resource[*k8scache.Service]
	// EndpointSlices are cached as their services' backends (k8scache):
	// the load-balancer source reads nothing else of them.
	EndpointSlices  *Resource[*k8scache.Slice]
	NetworkPolicies *Resource[*networkingv1.NetworkPolicy]

	TendrilNetworkPolicies            *Resource[*v1alpha1.TendrilNetworkPolicy]
	TendrilClusterwideNetworkPolicies *Resource[*v1alpha1.TendrilClusterwideNetworkPolicy]
	TendrilIdentities                 *Resource[*v1alpha1.TendrilIdentity]
	// TendrilEndpoints are cached as their status (k8s.CachedEndpoint).
	TendrilEndpoints *Resource[*k8s.CachedEndpoint]
	TendrilNodes     *Resource[*v1alpha1.TendrilNode]
	// TendrilLoadBalancerIPPools: their l2Announcements say which
	// addresses the node may announce.
	TendrilLoadBalancerIPPools *Resource[*v1alpha1.TendrilLoadBalancerIPPool]
	// TendrilLocalRedirectPolicies: the services' local redirects.
	TendrilLocalRedirectPolicies *Resource[*v1alpha1.TendrilLocalRedirectPolicy]

	log       *slog.Logger
	factories []interface {
		Start(stopCh <-chan struct{})
		Shutdown()
	}
	all    []resourceState
	cancel context.CancelFunc
}

type resourceState interface {
	Name() string
	HasSynced() bool
	Len() int
}

// New builds the informers; nodeName limits the pod cache to this node's
// pods. Nothing is listed until Start.
func New(c *k8s.Clients, nodeName string, log *slog.Logger) *Watchers {
	core := informers.NewSharedInformerFactoryWithOptions(c.Core, 0, informers.WithTransform(Transform))
	local := informers.NewSharedInformerFactoryWithOptions(c.Core, 0, informers.WithTransform(Transform),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", nodeName).String()
		}))
	td := tendrilinformers.NewSharedInformerFactoryWithOptions(c.Tendril, 0, tendrilinformers.WithTransform(k8s.StripTendril))
	tv := td.Tendril().V1alpha1()

	w := &Watchers{
		Pods:            newResource[*corev1.Pod]("pods", local.Core().V1().Pods().Informer()),
		Namespaces:      newResource[*corev1.Namespace]("namespaces", core.Core().V1().Namespaces().Informer()),
		Nodes:           newResource[*corev1.Node]("nodes", core.Core().V1().Nodes().Informer()),
		Services:        newResource[*k8scache.Service]("services", core.Core().V1().Services().Informer()),
		EndpointSlices:  newResource[*k8scache.Slice]("endpointslices", core.Discovery().V1().EndpointSlices().Informer()),
		NetworkPolicies: newResource[*networkingv1.NetworkPolicy]("networkpolicies", core.Networking().V1().NetworkPolicies().Informer()),

		TendrilNetworkPolicies:            newResource[*v1alpha1.TendrilNetworkPolicy](v1alpha1.ResourceNetworkPolicies, tv.TendrilNetworkPolicies().Informer()),
		TendrilClusterwideNetworkPolicies: newResource[*v1alpha1.TendrilClusterwideNetworkPolicy](v1alpha1.ResourceClusterwideNetworkPolicies, tv.TendrilClusterwideNetworkPolicies().Informer()),
		TendrilIdentities:                 newResource[*v1alpha1.TendrilIdentity](v1alpha1.ResourceIdentities, tv.TendrilIdentities().Informer()),
		TendrilEndpoints:                  newResource[*k8s.CachedEndpoint](v1alpha1.ResourceEndpoints, tv.TendrilEndpoints().Informer()),
		TendrilNodes:                      newResource[*v1alpha1.TendrilNode](v1alpha1.ResourceNodes, tv.TendrilNodes().Informer()),
		TendrilLoadBalancerIPPools:        newResource[*v1alpha1.TendrilLoadBalancerIPPool](v1alpha1.ResourceLoadBalancerIPPools, tv.TendrilLoadBalancerIPPools().Informer()),
		TendrilLocalRedirectPolicies:      newResource[*v1alpha1.TendrilLocalRedirectPolicy](v1alpha1.ResourceLocalRedirectPolicies, tv.TendrilLocalRedirectPolicies().Informer()),
		log:                               log,
	}
	w.factories = append(w.factories, core, local, td)
	w.all = []resourceState{w.Pods, w.Namespaces, w.Nodes, w.Services, w.EndpointSlices, w.NetworkPolicies,
		w.TendrilNetworkPolicies, w.TendrilClusterwideNetworkPolicies, w.TendrilIdentities, w.TendrilEndpoints, w.TendrilNodes, w.TendrilLoadBalancerIPPools, w.TendrilLocalRedirectPolicies}
	for _, r := range []interface{ setErrorHandler(*slog.Logger) }{w.Pods, w.Namespaces, w.Nodes, w.Services, w.EndpointSlices, w.NetworkPolicies,
		w.TendrilNetworkPolicies, w.TendrilClusterwideNetworkPolicies, w.TendrilIdentities, w.TendrilEndpoints, w.TendrilNodes, w.TendrilLoadBalancerIPPools, w.TendrilLocalRedirectPolicies} {
		r.setErrorHandler(log)
	}
	return w
}

func (r *Resource[T]) setErrorHandler(log *slog.Logger) {
	// A watch that keeps failing (a missing CRD, RBAC) is logged with the
	// resource's name instead of klog's anonymous reflector lines.
	_ = r.informer.SetWatchErrorHandlerWithContext(func(_ context.Context, _ *cache.Reflector, err error) {
		log.Warn("Kubernetes watch failed", "resource", r.name, "error", err)
	})
}

// Start starts every informer; they run until Stop.
func (w *Watchers) Start(ctx context.Context) {
	ctx, w.cancel = context.WithCancel(ctx)
	for _, f := range w.factories {
		f.Start(ctx.Done())
	}
}

// Stop stops the informers and waits for them.
func (w *Watchers) Stop() {
	if w.cancel != nil {
		w.cancel()
	}
	for _, f := range w.factories {
		f.Shutdown()
	}
}

// WaitForCacheSync waits until every cache holds its initial list. After
// timeout it fails, naming the resources that did not sync.
func (w *Watchers) WaitForCacheSync(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		var pending []string
		for _, r := range w.all {
			if !r.HasSynced() {
				pending = append(pending, r.Name())
			}
		}
		if len(pending) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			sort.Strings(pending)
			return fmt.Errorf("kubernetes caches not synced after %s: %s", timeout, strings.Join(pending, ", "))
		case <-tick.C:
		}
	}
}

// ResourceStatus is one cache's state, for `tendril status`.
type ResourceStatus struct {
	Name    string `json:"name"`
	Synced  bool   `json:"synced"`
	Objects int    `json:"objects"`
}

// Status lists every cache's state.
func (w *Watchers) Status() []ResourceStatus {
	out := make([]ResourceStatus, 0, len(w.all))
	for _, r := range w.all {
		out = append(out, ResourceStatus{Name: r.Name(), Synced: r.HasSynced(), Objects: r.Len()})
	}
	return out
}
