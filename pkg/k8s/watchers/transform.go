package watchers

import (
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/tendril-net/tendril/pkg/k8s"
	"github.com/tendril-net/tendril/pkg/loadbalancer/k8scache"
)

// NewTransform returns the informers' transform (see Transform).
func NewTransform() func(any) (any, error) { return Transform }

// Transform is the informers' transform: every object loses its
// managedFields, and Services and EndpointSlices become their conversions
// (k8scache.Service, the services table's row; k8scache.Slice, the
// backends table's rows), which the tables then share: the load-balancer
// source is their only reader. At 100,000 Services of 10 endpoints the
// informer caches held 264 MiB of EndpointSlices alone (docs/benchmarks.md,
// "Memory (issue 31)"). It is idempotent, as client-go asks.
func Transform(obj any) (any, error) {
	switch o := obj.(type) {
	case *corev1.Service:
		return k8scache.CachedServiceFrom(o), nil
	case *k8scache.Service:
		// Already converted.
		return o, nil
	case *discoveryv1.EndpointSlice:
		return k8scache.SliceFrom(o), nil
	case *k8scache.Slice:
		// Already converted.
		return o, nil
	}
	return k8s.StripManagedFields(obj)
}
