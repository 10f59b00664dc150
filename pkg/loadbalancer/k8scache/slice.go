// Package k8scache converts Services and EndpointSlices into the forms
// the agent's informers cache them in: a Service as its services-table
// row, an EndpointSlice as the backends of its service. The load-balancer
// source reads nothing else of them, so the caches hold the conversions
// instead of the decoded objects, and the tables hold the same values: a
// Service or slice costs its rows once, not its API object beside them
// (docs/benchmarks.md, "Memory (issue 31)").
package k8scache

import (
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/tendril-net/tendril/pkg/k8s"
	"github.com/tendril-net/tendril/pkg/loadbalancer"
)

// Slice is an EndpointSlice as the agent caches it: its key and resource
// version (the informer's), and the backends of its service. It is a
// runtime.Object so that an informer's store holds it in place of the
// slice. Nothing may change a Slice or its backends once made: the
// informer's readers and the backends table share them.
type Slice struct {
	// SlimMeta: the name, namespace and resource version.
	k8s.SlimMeta
	// Service is the service the slice lists backends of (its
	// kubernetes.io/service-name label); valid only if OK.
	Service loadbalancer.ServiceName
	// OK is false for a slice of no service or of an address type
	// other than IPv4 or IPv6: it lists no backends of any service.
	OK bool
	// Backends are its addresses with each of its ports, Service and
	// Source (the slice's name) set.
	Backends []*loadbalancer.Backend
}

// DeepCopyObject implements runtime.Object. The backends are shared: they
// are never changed once made (see Slice).
func (s *Slice) DeepCopyObject() runtime.Object {
	if s == nil {
		return nil
	}
	c := *s
	c.Backends = append([]*loadbalancer.Backend(nil), s.Backends...)
	return &c
}

// SliceFrom converts an EndpointSlice into its cached form. Addresses no
// backend may have (loopback, unspecified, link-local, multicast) are
// left out, so are ports without a number or with a protocol the datapath
// does not balance. Names are interned: the backends on one node share
// its name's bytes.
func SliceFrom(es *discoveryv1.EndpointSlice) *Slice {
	s := &Slice{SlimMeta: k8s.SlimMeta{Name: es.Name, Namespace: k8s.Intern(es.Namespace), ResourceVersion: es.ResourceVersion}}
	svc := es.Labels[discoveryv1.LabelServiceName]
	if svc == "" || (es.AddressType != discoveryv1.AddressTypeIPv4 && es.AddressType != discoveryv1.AddressTypeIPv6) {
		return s
	}
	s.OK = true
	s.Service = loadbalancer.ServiceName{Namespace: s.Namespace, Name: svc}
	for _, ep := range es.Endpoints {
		// Unset conditions mean ready and serving (the API's documented
		// default), not terminating.
		ready := ep.Conditions.Ready == nil || *ep.Conditions.Ready
		serving := ready
		if ep.Conditions.Serving != nil {
			serving = *ep.Conditions.Serving
		}
		terminating := ep.Conditions.Terminating != nil && *ep.Conditions.Terminating
		var nodeName, zone string
		if ep.NodeName != nil {
			nodeName = k8s.Intern(*ep.NodeName)
		}
		if ep.Zone != nil {
			zone = k8s.Intern(*ep.Zone)
		}
		// One Hints for all of the endpoint's addresses and ports.
		var hints *loadbalancer.Hints
		if ep.Hints != nil && len(ep.Hints.ForZones)+len(ep.Hints.ForNodes) > 0 {
			hints = &loadbalancer.Hints{}
			for _, z := range ep.Hints.ForZones {
				hints.ForZones = append(hints.ForZones, k8s.Intern(z.Name))
			}
			for _, n := range ep.Hints.ForNodes {
				hints.ForNodes = append(hints.ForNodes, k8s.Intern(n.Name))
			}
		}
		for _, a := range ep.Addresses {
			addr, err := netip.ParseAddr(a)
			if err != nil || !loadbalancer.Servable(addr.Unmap()) {
				// Whoever may write an EndpointSlice (a selectorless
				// Service's owner) names its addresses: a loopback
				// backend would send a host process's connect() to a
				// cluster IP (the socket LB) to the node's own
				// 127.0.0.1 on that port. The API server refuses these
				// too; checked here whatever wrote the object.
				continue
			}
			for _, p := range es.Ports {
				if p.Port == nil {
					continue
				}
				var proto corev1.Protocol
				if p.Protocol != nil {
					proto = *p.Protocol
				}
				l4, err := ProtoOf(proto)
				if err != nil {
					continue
				}
				var portName string
				if p.Name != nil {
					portName = k8s.Intern(*p.Name)
				}
				s.Backends = append(s.Backends, &loadbalancer.Backend{
					Service: s.Service, Source: s.Name,
					Addr: netip.AddrPortFrom(addr.Unmap(), uint16(*p.Port)), Proto: l4, PortName: portName,
					NodeName: nodeName, Zone: zone, Hints: hints, Ready: ready, Serving: serving, Terminating: terminating,
				})
			}
		}
	}
	return s
}

// ProtoOf maps a Kubernetes protocol to the datapath's ("" is TCP).
func ProtoOf(p corev1.Protocol) (uint8, error) {
	if p == "" {
		return loadbalancer.TCP, nil
	}
	return loadbalancer.ParseProto(string(p))
}
