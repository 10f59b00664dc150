package agentk8s

import (
	"net/netip"

	discoveryv1 "k8s.io/api/discovery/v1"
)

// APIServerEndpoints are the API server's addresses and ports as the API
// server itself publishes them: the endpoints of the kubernetes Service
// in the default namespace (its EndpointSlice "kubernetes", which the API
// server writes, not a node). Nil until the watchers have started, or
// without Kubernetes.
func (k *Client) APIServerEndpoints() []netip.AddrPort {
	if k == nil || k.watchers == nil || k.watchers.EndpointSlices == nil {
		return nil
	}
	s, ok := k.watchers.EndpointSlices.Get("default/kubernetes")
	if !ok {
		return nil
	}
	return endpointsOf(s)
}

// endpointsOf are a slice's ready addresses with each of its ports.
func endpointsOf(s *discoveryv1.EndpointSlice) []netip.AddrPort {
	var out []netip.AddrPort
	for _, ep := range s.Endpoints {
		if ep.Conditions.Ready != nil && !*ep.Conditions.Ready {
			continue
		}
		for _, a := range ep.Addresses {
			ip, err := netip.ParseAddr(a)
			if err != nil {
				continue
			}
			for _, p := range s.Ports {
				if p.Port != nil && *p.Port > 0 && *p.Port < 65536 {
					out = append(out, netip.AddrPortFrom(ip.Unmap(), uint16(*p.Port)))
				}
			}
		}
	}
	return out
}
