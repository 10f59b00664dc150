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
func stripService(s *corev1.Service) {
	meta := keptMeta(&s.ObjectMeta)
	meta.Labels = s.Labels
	if v, ok := s.Annotations[annotationLBAlgorithm]; ok {
		meta.Annotations = map[string]string{annotationLBAlgorithm: v}
	}
	spec := corev1.ServiceSpec{
		Type:                     s.Spec.Type,
		ClusterIP:                s.Spec.ClusterIP,
		ClusterIPs:               s.Spec.ClusterIPs,
		ExternalIPs:              s.Spec.ExternalIPs,
		SessionAffinity:          s.Spec.SessionAffinity,
		SessionAffinityConfig:    s.Spec.SessionAffinityConfig,
		LoadBalancerSourceRanges: s.Spec.LoadBalancerSourceRanges,
		ExternalTrafficPolicy:    s.Spec.ExternalTrafficPolicy,
		HealthCheckNodePort:      s.Spec.HealthCheckNodePort,
		InternalTrafficPolicy:    s.Spec.InternalTrafficPolicy,
		TrafficDistribution:      s.Spec.TrafficDistribution,
	}
	if len(s.Spec.Ports) > 0 {
		spec.Ports = make([]corev1.ServicePort, len(s.Spec.Ports))
		for i, p := range s.Spec.Ports {
			spec.Ports[i] = corev1.ServicePort{Name: p.Name, Protocol: p.Protocol, Port: p.Port, NodePort: p.NodePort}
		}
	}
	var status corev1.ServiceStatus
	if len(s.Status.LoadBalancer.Ingress) > 0 {
		status.LoadBalancer.Ingress = make([]corev1.LoadBalancerIngress, len(s.Status.LoadBalancer.Ingress))
		for i, in := range s.Status.LoadBalancer.Ingress {
			status.LoadBalancer.Ingress[i] = corev1.LoadBalancerIngress{IP: in.IP, IPMode: in.IPMode}
		}
	}
	*s = corev1.Service{TypeMeta: s.TypeMeta, ObjectMeta: meta, Spec: spec, Status: status}
}

// stripEndpointSlice keeps what BackendsFrom reads: the service-name
// label, the address type, the ports, and each endpoint's addresses,
// conditions, node, zone and hints. Dropped: target references (a pod's
// kind, namespace, name and UID per endpoint), hostnames, the deprecated
// topology, other labels, annotations, owner references. The node names,
// zones and conditions each endpoint used to hold a copy of are shared.
func (t *transformer) stripEndpointSlice(es *discoveryv1.EndpointSlice) {
	meta := keptMeta(&es.ObjectMeta)
	if v, ok := es.Labels[discoveryv1.LabelServiceName]; ok {
		meta.Labels = map[string]string{discoveryv1.LabelServiceName: v}
	}
	var eps []discoveryv1.Endpoint
	if len(es.Endpoints) > 0 {
		eps = make([]discoveryv1.Endpoint, len(es.Endpoints))
		for i, ep := range es.Endpoints {
			eps[i] = discoveryv1.Endpoint{
				Addresses: ep.Addresses,
				Conditions: discoveryv1.EndpointConditions{
					Ready: t.sharedBool(ep.Conditions.Ready), Serving: t.sharedBool(ep.Conditions.Serving), Terminating: t.sharedBool(ep.Conditions.Terminating),
				},
				NodeName: t.sharedPtr(ep.NodeName),
				Zone:     t.sharedPtr(ep.Zone),
				Hints:    ep.Hints,
			}
		}
	}
	var ports []discoveryv1.EndpointPort
	if len(es.Ports) > 0 {
		ports = make([]discoveryv1.EndpointPort, len(es.Ports))
		for i, p := range es.Ports {
			ports[i] = discoveryv1.EndpointPort{Name: p.Name, Protocol: p.Protocol, Port: p.Port}
		}
	}
	*es = discoveryv1.EndpointSlice{TypeMeta: es.TypeMeta, ObjectMeta: meta, AddressType: es.AddressType, Endpoints: eps, Ports: ports}
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
