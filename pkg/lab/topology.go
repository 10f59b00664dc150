package lab

import (
	"fmt"
	"strconv"
)

// Topologies of the lab network. Both put every node namespace and the
// world on the one lab bridge; they differ in the nodes' addresses.
const (
	// TopologyFlat: every node in one subnet, NodeSubnetPrefix+"0/24",
	// node N at NodeSubnetPrefix+(10+N); each node reaches the others
	// on-link, as nodes on one LAN.
	TopologyFlat = "flat"
	// TopologyRouted: node N alone in its subnet 172.30.N.0/24, at
	// 172.30.N.11, its gateway the world at 172.30.N.1. The world routes
	// between the node subnets (IP forwarding on, no ICMP redirects) but
	// not to the pod CIDRs, as cloud VMs in different subnets behind the
	// provider's router: a node reaches another only through the
	// router, and a packet addressed to a pod on another node goes to
	// the router, which drops it. Native routing's route to another
	// node's pod CIDR via that node cannot be made (its gateway is not
	// on-link); the tunnel carries pod traffic between node addresses,
	// which the router does route.
	TopologyRouted = "routed"
)

// routedSubnetPrefix is the first three octets' start of the routed
// topology's node subnets: node N's is routedSubnetPrefix+N+".0/24".
const routedSubnetPrefix = "172.30."

// ValidateTopology checks a lab topology's name ("" is TopologyFlat).
func ValidateTopology(t string) error {
	switch t {
	case "", TopologyFlat, TopologyRouted:
		return nil
	}
	return fmt.Errorf("--topology %q: must be %s or %s", t, TopologyFlat, TopologyRouted)
}

// nodeAddressing is node i's (from 1) address and gateway in a topology.
func nodeAddressing(topology string, i int) (address, gateway string) {
	if topology == TopologyRouted {
		sub := routedSubnetPrefix + strconv.Itoa(i) + "."
		return sub + "11", sub + "1"
	}
	return NodeSubnetPrefix + strconv.Itoa(10+i), WorldGateway
}

// gateway is the node's default gateway.
func (n Node) gateway() string {
	if n.Gateway != "" {
		return n.Gateway
	}
	return WorldGateway
}
