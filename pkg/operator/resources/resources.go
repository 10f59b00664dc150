// Package resources keeps the operator's informer caches: Pods, Nodes,
// TendrilIdentities, TendrilEndpoints (indexed by identity) and
// TendrilNodes. Every replica keeps them warm from its start, so a replica
// that becomes leader acts on a synced view at once. Pods are stripped to
// what the collectors read (name, UID, node, phase) to bound memory.
package resources

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/tendril-net/tendril/pkg/k8s"
	v1alpha1 "github.com/tendril-net/tendril/pkg/k8s/apis/tendril.io/v1alpha1"
	tendrilinformers "github.com/tendril-net/tendril/pkg/k8s/client/informers/externalversions"
	tendrillisters "github.com/tendril-net/tendril/pkg/k8s/client/listers/tendril.io/v1alpha1"
)

// IdentityIndex indexes TendrilEndpoints by their identity's number.
const IdentityIndex = "identity"

// Config bounds the initial sync.
type Config struct {
	K8sCacheSyncTimeout time.Duration
}

// DefaultConfig waits up to 3 minutes.
func DefaultConfig() Config { return Config{K8sCacheSyncTimeout: 3 * time.Minute} }

// Flags registers the options.
func (c Config) Flags(fs *pflag.FlagSet) {
	fs.Duration("k8s-cache-sync-timeout", c.K8sCacheSyncTimeout, "How long the start waits for the informer caches to sync")
}

// Resources are the listers over the synced caches.
type Resources struct {
	Pods       corelisters.PodLister
	Nodes      corelisters.NodeLister
	Identities tendrillisters.TendrilIdentityLister
	Endpoints  tendrillisters.TendrilEndpointLister
	TNodes     tendrillisters.TendrilNodeLister

	// EndpointsByIdentity is the TendrilEndpoint informer's indexer
	// (IdentityIndex).
	EndpointsByIdentity cache.Indexer
	// NodeInformer and TNodeInformer let jobs react to changes.
	NodeInformer  cache.SharedIndexInformer
	TNodeInformer cache.SharedIndexInformer

	// CoreFactory and TendrilFactory let a cell add an informer of its
	// own kind while the hive is built (before the start hook syncs them
	// all), so only configured jobs pay for the caches they need.
	CoreFactory    informers.SharedInformerFactory
	TendrilFactory tendrilinformers.SharedInformerFactory
}

// Cell provides *Resources, synced by its start hook.
var Cell = cell.Module("resources", "Informer caches of what the jobs read",
	cell.Config(DefaultConfig()),
	cell.Provide(newResources),
)

type params struct {
	cell.In
	Config    Config
	Clients   *k8s.Clients
	Log       *slog.Logger
	Lifecycle cell.Lifecycle
}

func newResources(p params) (*Resources, error) {
	r, start, stop, err := build(p.Clients)
	if err != nil {
		return nil, err
	}
	p.Lifecycle.Append(cell.Hook{
		OnStart: func(ctx cell.HookContext) error {
			if err := start(ctx, p.Config.K8sCacheSyncTimeout); err != nil {
				return err
			}
			p.Log.Info("Informer caches synced")
			return nil
		},
		OnStop: func(cell.HookContext) error { stop(); return nil },
	})
	return r, nil
}

// Start builds the caches and waits for their sync, for tests and
// benchmarks that use a collector without the hive; stop ends them.
func Start(ctx context.Context, clients *k8s.Clients, timeout time.Duration) (r *Resources, stop func(), err error) {
	r, start, stop, err := build(clients)
	if err != nil {
		return nil, nil, err
	}
	if err := start(ctx, timeout); err != nil {
		stop()
		return nil, nil, err
	}
	return r, stop, nil
}

// Build returns the caches unstarted (a test registers more informers
// before calling start); start syncs them, stop ends them.
func Build(clients *k8s.Clients) (r *Resources, start func(context.Context, time.Duration) error, stop func(), err error) {
	return build(clients)
}

func build(clients *k8s.Clients) (*Resources, func(context.Context, time.Duration) error, func(), error) {
	core := informers.NewSharedInformerFactory(clients.Core, 0)
	td := tendrilinformers.NewSharedInformerFactory(clients.Tendril, 0)
	pods := core.Core().V1().Pods()
	if err := pods.Informer().SetTransform(stripPod); err != nil {
		return nil, nil, nil, fmt.Errorf("pod informer transform: %w", err)
	}
	eps := td.Tendril().V1alpha1().TendrilEndpoints()
	if err := eps.Informer().AddIndexers(cache.Indexers{IdentityIndex: endpointIdentity}); err != nil {
		return nil, nil, nil, fmt.Errorf("endpoint identity index: %w", err)
	}
	if err := eps.Informer().SetTransform(k8s.StripManagedFields); err != nil {
		return nil, nil, nil, fmt.Errorf("endpoint informer transform: %w", err)
	}
	r := &Resources{
		Pods:                pods.Lister(),
		Nodes:               core.Core().V1().Nodes().Lister(),
		Identities:          td.Tendril().V1alpha1().TendrilIdentities().Lister(),
		Endpoints:           eps.Lister(),
		TNodes:              td.Tendril().V1alpha1().TendrilNodes().Lister(),
		EndpointsByIdentity: eps.Informer().GetIndexer(),
		NodeInformer:        core.Core().V1().Nodes().Informer(),
		TNodeInformer:       td.Tendril().V1alpha1().TendrilNodes().Informer(),
		CoreFactory:         core,
		TendrilFactory:      td,
	}
	stopCh := make(chan struct{})
	start := func(ctx context.Context, timeout time.Duration) error {
		core.Start(stopCh)
		td.Start(stopCh)
		ctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		var pending []string
		for typ, ok := range core.WaitForCacheSync(ctx.Done()) {
			if !ok {
				pending = append(pending, typ.String())
			}
		}
		for typ, ok := range td.WaitForCacheSync(ctx.Done()) {
			if !ok {
				pending = append(pending, typ.String())
			}
		}
		if len(pending) > 0 {
			return fmt.Errorf("kubernetes caches not synced after %s: %v", timeout, pending)
		}
		return nil
	}
	stop := func() {
		close(stopCh)
		core.Shutdown()
		td.Shutdown()
	}
	return r, start, stop, nil
}

// stripPod keeps what the collectors read of a pod.
func stripPod(obj any) (any, error) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil // a tombstone
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace, UID: pod.UID, ResourceVersion: pod.ResourceVersion},
		Spec:       corev1.PodSpec{NodeName: pod.Spec.NodeName},
		Status:     corev1.PodStatus{Phase: pod.Status.Phase},
	}, nil
}

func endpointIdentity(obj any) ([]string, error) {
	ep, ok := obj.(*v1alpha1.TendrilEndpoint)
	if !ok || ep.Status.Identity == nil {
		return nil, nil
	}
	return []string{strconv.FormatInt(ep.Status.Identity.ID, 10)}, nil
}
