// Package bgp is the BGP control plane's pure logic: from this node's
// labels and pod CIDRs, the services, the LoadBalancer IP pools and the
// TendrilBGP* objects, what the node's speaker runs (its ASN, its peers)
// and which prefixes it announces; and the guard (Allowed) every prefix
// passes before it reaches the speaker: a node announces only its own pod
// CIDRs and LoadBalancer addresses that lie in a pool serving their
// Service. The speaker itself (gobgp) is pkg/bgp/speaker; the agent's
// cell is pkg/agent/bgpcp.
package bgp
