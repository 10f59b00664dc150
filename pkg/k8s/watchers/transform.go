package watchers

import (
	"unique"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tendril-net/tendril/pkg/k8s"
	"github.com/tendril-net/tendril/pkg/loadbalancer/k8sslice"
)

// annotationLBAlgorithm is the one annotation of a Service the agent reads
// (k8ssource.AnnotationLBAlgorithm; not imported: k8ssource imports this
// package).
const annotationLBAlgorithm = "service.tendril.io/lb-algorithm"

// NewTransform returns the informers' transform (see Transform).
func NewTransform() func(any) (any, error) { return Transform }

// Transform is the informers' transform: every object loses its
// managedFields, Services keep only what the agent reads of them
// (k8ssource.ServiceFrom, their only reader: the cache is there for the
// load-balancer source), and an EndpointSlice becomes the backends of its
// service (k8sslice.Slice), which the backends table then shares. At
// 100,000 Services of 10 endpoints the informer caches held 264 MiB of
// EndpointSlices alone (docs/benchmarks.md, "Memory (issue 31)"). It
// changes a Service in place (client-go hands a transform the decoded
// object before anyone else sees it) and is idempotent.
func Transform(obj any) (any, error) {
	switch o := obj.(type) {
	case *corev1.Service:
		stripService(o)
		return o, nil
	case *discoveryv1.EndpointSlice:
		return k8sslice.From(o), nil
	case *k8sslice.Slice:
		// Already converted (a transform must be idempotent).
		return o, nil
	}
	return k8s.StripManagedFields(obj)
}

// keptMeta is the metadata every stripped object keeps: its key and
// resource version (the informer's), and what the caller asks for.
func keptMeta(m *metav1.ObjectMeta) metav1.ObjectMeta {
	return metav1.ObjectMeta{
		Name:              m.Name,
		Namespace:         intern(m.Namespace),
		UID:               m.UID,
		ResourceVersion:   m.ResourceVersion,
		CreationTimestamp: m.CreationTimestamp,
		DeletionTimestamp: m.DeletionTimestamp,
	}
}

// stripService keeps what ServiceFrom reads: the labels (which policies
// and BGP/L2 pools select the service), UID, creation time, the
// load-balancer algorithm annotation, the spec's addresses, ports and
// policies, and the load-balancer ingress addresses. Dropped: the
// selector, target ports, app protocols, IP family fields, conditions.
// In place: what is kept is not copied.
func stripService(s *corev1.Service) {
	labels := s.Labels
	var annotations map[string]string
	if v, ok := s.Annotations[annotationLBAlgorithm]; ok {
		annotations = s.Annotations
		if len(annotations) > 1 {
			annotations = map[string]string{annotationLBAlgorithm: v}
		}
	}
	s.ObjectMeta = keptMeta(&s.ObjectMeta)
	s.Labels, s.Annotations = labels, annotations
	s.Spec.Selector = nil
	s.Spec.IPFamilies, s.Spec.IPFamilyPolicy = nil, nil
	s.Spec.AllocateLoadBalancerNodePorts, s.Spec.LoadBalancerClass = nil, nil
	s.Spec.ExternalName, s.Spec.LoadBalancerIP = "", ""
	for i := range s.Spec.Ports {
		p := &s.Spec.Ports[i]
		*p = corev1.ServicePort{Name: p.Name, Protocol: p.Protocol, Port: p.Port, NodePort: p.NodePort}
	}
	for i := range s.Status.LoadBalancer.Ingress {
		in := &s.Status.LoadBalancer.Ingress[i]
		*in = corev1.LoadBalancerIngress{IP: in.IP, IPMode: in.IPMode}
	}
	s.Status.Conditions = nil
}

// intern returns the canonical copy of s: the namespaces, node names and
// zones of many objects share one. The unique package drops a value once
// nothing holds it, so names of nodes long gone do not accumulate.
func intern(s string) string {
	if s == "" {
		return ""
	}
	return unique.Make(s).Value()
}
