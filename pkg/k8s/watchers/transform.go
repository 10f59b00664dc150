package watchers

import (
	"sync"
	"unique"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tendril-net/tendril/pkg/k8s"
)

// annotationLBAlgorithm is the one annotation of a Service the agent reads
// (k8ssource.AnnotationLBAlgorithm; not imported: k8ssource imports this
// package).
const annotationLBAlgorithm = "service.tendril.io/lb-algorithm"

// transformer is the informers' transform (Transform) with the pointers
// it shares between objects.
type transformer struct {
	// yes and no are the canonical condition values.
	yes, no *bool
	mu      sync.Mutex
	// ptrs are shared pointers to node names and zones; bounded (cleared
	// when full) so that names of nodes long gone do not accumulate.
	ptrs map[string]*string
}

// maxSharedPtrs bounds transformer.ptrs: more distinct node names and
// zones than this only share less.
const maxSharedPtrs = 1 << 14

// NewTransform returns the informers' transform (see transformer.Transform),
// with its own shared pointers.
func NewTransform() func(any) (any, error) { return newTransformer().Transform }

func newTransformer() *transformer {
	yes, no := true, false
	return &transformer{yes: &yes, no: &no, ptrs: map[string]*string{}}
}

// Transform is the informers' transform: every object loses its
// managedFields, and Services and EndpointSlices keep only what the
// agent reads of them (k8ssource.ServiceFrom and BackendsFrom, which are
// their only readers: the caches are there for the load-balancer source).
// At 100,000 Services of 10 endpoints the informer caches held 264 MiB of
// EndpointSlices alone (docs/benchmarks.md, "Memory (issue 31)"). It
// mutates the object in place (client-go hands a transform the decoded
// object before anyone else sees it) and is idempotent.
func (t *transformer) Transform(obj any) (any, error) {
	switch o := obj.(type) {
	case *corev1.Service:
		stripService(o)
		return o, nil
	case *discoveryv1.EndpointSlice:
		t.stripEndpointSlice(o)
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

// stripEndpointSlice keeps what BackendsFrom reads: the service-name
// label, the address type, the ports, and each endpoint's addresses,
// conditions, node, zone and hints. Dropped: target references (a pod's
// kind, namespace, name and UID per endpoint), hostnames, the deprecated
// topology, other labels, annotations, owner references. The node names,
// zones and conditions each endpoint used to hold a copy of are shared.
// In place: what is kept is not copied.
func (t *transformer) stripEndpointSlice(es *discoveryv1.EndpointSlice) {
	labels := es.Labels
	if v, ok := labels[discoveryv1.LabelServiceName]; !ok {
		labels = nil
	} else if len(labels) > 1 {
		labels = map[string]string{discoveryv1.LabelServiceName: v}
	}
	es.ObjectMeta = keptMeta(&es.ObjectMeta)
	es.Labels = labels
	for i := range es.Endpoints {
		ep := &es.Endpoints[i]
		ep.Conditions = discoveryv1.EndpointConditions{
			Ready: t.sharedBool(ep.Conditions.Ready), Serving: t.sharedBool(ep.Conditions.Serving), Terminating: t.sharedBool(ep.Conditions.Terminating),
		}
		ep.NodeName, ep.Zone = t.sharedPtr(ep.NodeName), t.sharedPtr(ep.Zone)
		ep.Hostname, ep.TargetRef, ep.DeprecatedTopology = nil, nil, nil
	}
	for i := range es.Ports {
		es.Ports[i].AppProtocol = nil
	}
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

// sharedPtr is a pointer to the canonical copy of *p: the endpoints on one
// node share one pointer and one string.
func (t *transformer) sharedPtr(p *string) *string {
	if p == nil {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if q, ok := t.ptrs[*p]; ok {
		return q
	}
	if len(t.ptrs) >= maxSharedPtrs {
		clear(t.ptrs)
	}
	s := intern(*p)
	t.ptrs[s] = &s
	return &s
}

// sharedBool is a pointer to a canonical true or false (nil stays nil:
// an unset condition has its own meaning). Nothing writes through the
// cache's objects (the informer's contract), so they may share it.
func (t *transformer) sharedBool(p *bool) *bool {
	switch {
	case p == nil:
		return nil
	case *p:
		return t.yes
	}
	return t.no
}
