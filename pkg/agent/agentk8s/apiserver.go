package agentk8s

import (
	"net/netip"

	"github.com/tendril-net/tendril/pkg/loadbalancer/k8scache"
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
func endpointsOf(s *k8scache.Slice) []netip.AddrPort {
	var out []netip.AddrPort
	for _, b := range s.Backends {
		if b.Ready && b.Addr.Port() != 0 {
			out = append(out, b.Addr)
		}
	}
	return out
}
