package loadbalancer

import "slices"

// Topology modes: which of an EndpointSlice's hints narrow a service's
// backends on this node (kube-proxy's names for the same choices).
const (
	// TopologyNone: every ready backend.
	TopologyNone = ""
	// TopologyPreferSameNode: the backends hinted for this node
	// (hints.forNodes).
	TopologyPreferSameNode = "PreferSameNode"
	// TopologyPreferSameZone: the backends hinted for this node's zone
	// (hints.forZones).
	TopologyPreferSameZone = "PreferSameZone"
)

// Hints are one ready backend's EndpointSlice hints.
type Hints struct {
	ForNodes []string
	ForZones []string
}

// For reports whether the hints name this node (or its zone) in mode.
func (h Hints) For(mode, node, zone string) bool {
	switch mode {
	case TopologyNone:
		return true
	case TopologyPreferSameNode:
		return node != "" && slices.Contains(h.ForNodes, node)
	case TopologyPreferSameZone:
		return zone != "" && slices.Contains(h.ForZones, zone)
	}
	return false
}

// TopologyMode picks the mode for a service port from the hints of its
// ready backends, as kube-proxy does (pkg/proxy/topology.go): node hints
// when every ready backend has one and at least one names node; else zone
// hints when every ready backend has one and at least one names zone;
// else none. A mode is only chosen when it leaves a ready backend, and
// one backend without hints of a kind turns that kind off (its hints
// are being written or were withdrawn: the hinted backends alone would be
// overloaded). The Service's trafficDistribution is not consulted: the
// EndpointSlice controller writes the hints it asks for (and those of
// service.kubernetes.io/topology-mode Auto), and the hints are what the
// proxy follows.
func TopologyMode(ready []Hints, node, zone string) string {
	if len(ready) == 0 {
		return TopologyNone
	}
	allNodes, forNode := true, false
	allZones, forZone := true, false
	for _, h := range ready {
		if len(h.ForNodes) == 0 {
			allNodes = false
		} else if h.For(TopologyPreferSameNode, node, zone) {
			forNode = true
		}
		if len(h.ForZones) == 0 {
			allZones = false
		} else if h.For(TopologyPreferSameZone, node, zone) {
			forZone = true
		}
	}
	switch {
	case allNodes && forNode:
		return TopologyPreferSameNode
	case allZones && forZone:
		return TopologyPreferSameZone
	}
	return TopologyNone
}
