package k8scache

import (
	"fmt"
	"net/netip"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/tendril-net/tendril/pkg/k8s"
	"github.com/tendril-net/tendril/pkg/loadbalancer"
)

// AnnotationLBAlgorithm picks a service's backend selection: "maglev" or
// "random" (the node's default otherwise).
const AnnotationLBAlgorithm = "service.tendril.io/lb-algorithm"

// Default ClientIP affinity timeout (Kubernetes' default, 3 hours).
const defaultAffinityTimeout = 10800

// ServiceFrom converts a Service; ok is false for services without
// frontends here (headless, ExternalName, no cluster IP).
func ServiceFrom(s *corev1.Service, defaultMaglev bool) (svc *loadbalancer.Service, ok bool, err error) {
	if s.Spec.Type == corev1.ServiceTypeExternalName {
		return nil, false, nil
	}
	out := &loadbalancer.Service{Name: loadbalancer.ServiceName{Namespace: s.Namespace, Name: s.Name}, Type: string(s.Spec.Type),
		InternalTrafficPolicy: loadbalancer.TrafficPolicyCluster, Maglev: defaultMaglev,
		Labels: s.Labels, UID: string(s.UID), Created: s.CreationTimestamp.Time}
	if out.Type == "" {
		out.Type = string(corev1.ServiceTypeClusterIP)
	}
	ips := s.Spec.ClusterIPs
	if len(ips) == 0 && s.Spec.ClusterIP != "" {
		ips = []string{s.Spec.ClusterIP}
	}
	for _, ip := range ips {
		if ip == "" || ip == corev1.ClusterIPNone {
			continue
		}
		a, err := netip.ParseAddr(ip)
		if err != nil {
			return nil, false, fmt.Errorf("service %s: cluster IP %q: %w", out.Name, ip, err)
		}
		out.Addresses = append(out.Addresses, a.Unmap())
	}
	if len(out.Addresses) == 0 {
		return nil, false, nil
	}
	for _, p := range s.Spec.Ports {
		proto, err := ProtoOf(p.Protocol)
		if err != nil {
			return nil, false, fmt.Errorf("service %s port %q: %w", out.Name, p.Name, err)
		}
		sp := loadbalancer.ServicePort{Name: p.Name, Port: uint16(p.Port), Proto: proto}
		if s.Spec.Type == corev1.ServiceTypeNodePort || s.Spec.Type == corev1.ServiceTypeLoadBalancer {
			sp.NodePort = uint16(p.NodePort)
		}
		out.Ports = append(out.Ports, sp)
	}
	for _, ip := range s.Spec.ExternalIPs {
		a, err := netip.ParseAddr(ip)
		if err != nil {
			return nil, false, fmt.Errorf("service %s: external IP %q: %w", out.Name, ip, err)
		}
		out.ExternalIPs = append(out.ExternalIPs, a.Unmap())
	}
	if s.Spec.Type == corev1.ServiceTypeLoadBalancer {
		for _, in := range s.Status.LoadBalancer.Ingress {
			if in.IP == "" {
				continue // a hostname: nothing to answer on here
			}
			if in.IPMode != nil && *in.IPMode == corev1.LoadBalancerIPModeProxy {
				// The load-balancer proxies to the node ports: its
				// address is not ours to answer on.
				continue
			}
			a, err := netip.ParseAddr(in.IP)
			if err != nil {
				return nil, false, fmt.Errorf("service %s: load-balancer ingress %q: %w", out.Name, in.IP, err)
			}
			out.LoadBalancerIPs = append(out.LoadBalancerIPs, a.Unmap())
		}
		for _, r := range s.Spec.LoadBalancerSourceRanges {
			pfx, err := netip.ParsePrefix(strings.TrimSpace(r))
			if err != nil {
				return nil, false, fmt.Errorf("service %s: loadBalancerSourceRanges %q: %w", out.Name, r, err)
			}
			out.SourceRanges = append(out.SourceRanges, pfx.Masked())
		}
	}
	out.ExternalTrafficPolicy = loadbalancer.TrafficPolicyCluster
	if s.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal &&
		(s.Spec.Type == corev1.ServiceTypeNodePort || s.Spec.Type == corev1.ServiceTypeLoadBalancer) {
		out.ExternalTrafficPolicy = loadbalancer.TrafficPolicyLocal
		out.HealthCheckNodePort = uint16(s.Spec.HealthCheckNodePort)
	}
	if s.Spec.SessionAffinity == corev1.ServiceAffinityClientIP {
		out.Affinity, out.AffinityTimeout = true, defaultAffinityTimeout
		if c := s.Spec.SessionAffinityConfig; c != nil && c.ClientIP != nil && c.ClientIP.TimeoutSeconds != nil {
			out.AffinityTimeout = uint32(*c.ClientIP.TimeoutSeconds)
		}
	}
	if p := s.Spec.InternalTrafficPolicy; p != nil && *p == corev1.ServiceInternalTrafficPolicyLocal {
		out.InternalTrafficPolicy = loadbalancer.TrafficPolicyLocal
	}
	if td := s.Spec.TrafficDistribution; td != nil {
		out.TrafficDistribution = *td
	}
	if set, maglev := algorithmOf(s); set {
		out.Maglev = maglev
	}
	return out, true, nil
}

// algorithmOf is the backend selection the Service's annotation picks
// (set false: none, the node's default applies).
func algorithmOf(s *corev1.Service) (set, maglev bool) {
	switch strings.ToLower(s.Annotations[AnnotationLBAlgorithm]) {
	case "maglev":
		return true, true
	case "random":
		return true, false
	}
	return false, false
}

// Service is a Service as the agent caches it: its key and resource
// version, and its conversion (ServiceFrom) with the random selection
// unless its annotation picks Maglev. The source writes Service itself to
// the services table when the node's settings leave it as it is (the
// default algorithm random, node ports in range, no external IPs to
// judge), so that a Service costs one converted object, not its decoded
// form beside it. Nothing may change a Service once made.
type Service struct {
	// SlimMeta: the name, namespace and resource version.
	k8s.SlimMeta
	// Service is the conversion; nil for a Service without frontends
	// here (headless, ExternalName, no cluster IP) or one that does not
	// convert (Err).
	Service *loadbalancer.Service
	// Err is why the Service does not convert.
	Err error
	// MaglevSet: the annotation picked the selection (Service.Maglev);
	// otherwise the node's default applies.
	MaglevSet bool
}

// DeepCopyObject implements runtime.Object. The conversion is shared: it
// is never changed once made (see Service).
func (s *Service) DeepCopyObject() runtime.Object {
	if s == nil {
		return nil
	}
	c := *s
	return &c
}

// CachedServiceFrom converts a Service into its cached form.
func CachedServiceFrom(s *corev1.Service) *Service {
	c := &Service{SlimMeta: k8s.SlimMeta{Name: s.Name, Namespace: k8s.Intern(s.Namespace), ResourceVersion: s.ResourceVersion}}
	svc, ok, err := ServiceFrom(s, false)
	switch {
	case err != nil:
		c.Err = err
	case ok:
		svc.Name.Namespace = c.Namespace
		c.Service = svc
		c.MaglevSet, _ = algorithmOf(s)
	}
	return c
}
