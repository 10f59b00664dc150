package nodemanager

import (
	"fmt"
	"net/netip"
	"slices"
)

// Reasons a node's address is not taken as its own (OwnAddresses).
const (
	AddrReasonNotUnicast = "not-unicast"
	AddrReasonLocal      = "this-node-address"
	AddrReasonShared     = "claimed-by-several-nodes"
	AddrReasonPodCIDR    = "inside-pod-cidr"
	AddrReasonPool       = "inside-cluster-pool"
	AddrReasonService    = "inside-service-cidr"
)

// AddressRejection is an address a node claims that is not taken as its
// own, and why.
type AddressRejection struct {
	Addr           netip.Addr
	Reason, Detail string
}

func (r AddressRejection) String() string {
	return r.Addr.String() + " (" + r.Reason + ": " + r.Detail + ")"
}

// OwnAddresses splits each peer's addresses into those it may be trusted
// to own and those it may not. A node's addresses come from objects that
// node writes (its Node's status, its TendrilNode), so, as its pod CIDRs,
// they are claims. What an address may be given for on their strength
// (an allowed IP of the node's WireGuard peer: an inner source the node
// may send from, and with node encryption the destination this node's
// own traffic is encrypted to that node for) must not be what another
// party owns. An address is refused when it is:
//   - not a unicast address a node could hold (unspecified, loopback,
//     multicast, link-local);
//   - one of this node's own addresses (Rules.Local);
//   - claimed by two nodes or more (each would draw the other's
//     traffic; the nodes table cannot tell which one lies);
//   - inside this node's pod CIDRs or another node's accepted pod CIDR
//     (a pod's address: inside the claimant's own accepted pod CIDR it is
//     its router IP, allowed anyway);
//   - inside the cluster's pod pools or the service CIDRs (Rules.Pools,
//     Rules.Reserved): pods' and services' addresses are no node's.
//
// What cannot be told from the objects: whether an address outside all
// of these is the claimant's (a node claiming the address of a machine
// outside the cluster). docs/encryption.md says what that can cost.
func (r Rules) OwnAddresses(all []*Peer) (own map[string][]netip.Addr, refused map[string][]AddressRejection) {
	k := newChecker(r, all)
	// Every peer is judged: index the claims once.
	k.claims = map[netip.Addr][]string{}
	for _, q := range all {
		for _, ip := range uniqueAddrs(q.IPs) {
			k.claims[ip] = append(k.claims[ip], q.Name)
		}
	}
	own, refused = map[string][]netip.Addr{}, map[string][]AddressRejection{}
	for _, p := range all {
		o, rj := k.ownAddresses(p)
		if len(o) > 0 {
			own[p.Name] = o
		}
		if len(rj) > 0 {
			refused[p.Name] = rj
		}
	}
	return own, refused
}

// uniqueAddrs are xs unmapped, each once, in order.
func uniqueAddrs(xs []netip.Addr) []netip.Addr {
	out := make([]netip.Addr, 0, len(xs))
	for _, x := range xs {
		if x = x.Unmap(); !slices.Contains(out, x) {
			out = append(out, x)
		}
	}
	return out
}

// claimants are the names of k's peers claiming each of p's addresses:
// from the index when there is one, else one pass over the peers (the
// node manager judges a few peers per change; an index of the whole
// table would cost more than the pass).
func (k *checker) claimants(p *Peer) map[netip.Addr][]string {
	mine := uniqueAddrs(p.IPs)
	out := make(map[netip.Addr][]string, len(mine))
	if k.claims != nil {
		for _, ip := range mine {
			out[ip] = k.claims[ip]
		}
		return out
	}
	for _, q := range k.peers {
		for _, ip := range q.IPs {
			if ip = ip.Unmap(); slices.Contains(mine, ip) && !slices.Contains(out[ip], q.Name) {
				out[ip] = append(out[ip], q.Name)
			}
		}
	}
	return out
}

// nodeAddresses are p's addresses judged a node's (Peer.NodeIPs): its
// own, and those refused only as claimed by several nodes; refused are
// all the refusals.
func (k *checker) nodeAddresses(p *Peer) (nodeIPs []netip.Addr, refused []AddressRejection) {
	own, refused := k.ownAddresses(p)
	for _, ip := range uniqueAddrs(p.IPs) {
		if slices.Contains(own, ip) || slices.ContainsFunc(refused, func(r AddressRejection) bool {
			return r.Addr == ip && r.Reason == AddrReasonShared
		}) {
			nodeIPs = append(nodeIPs, ip)
		}
	}
	return nodeIPs, refused
}

// ownAddresses judges p's addresses (OwnAddresses) against k's peers,
// p's accepted pod CIDRs as they are in k.peers.
func (k *checker) ownAddresses(p *Peer) (own []netip.Addr, refused []AddressRejection) {
	claims := k.claimants(p)
	for _, ip := range uniqueAddrs(p.IPs) {
		reason, detail := k.rules.judgeAddress(p, ip, k.peers, claims[ip], k.localCIDRs, k.localAddrs)
		if reason != "" {
			refused = append(refused, AddressRejection{Addr: ip, Reason: reason, Detail: detail})
			continue
		}
		own = append(own, ip)
	}
	return own, refused
}

func (r Rules) judgeAddress(p *Peer, ip netip.Addr, all []*Peer, claimants []string, localCIDRs []netip.Prefix, localAddrs []netip.Addr) (reason, detail string) {
	switch {
	case !ip.IsValid() || ip.IsUnspecified() || ip.IsLoopback() || ip.IsMulticast() ||
		ip.IsLinkLocalUnicast() || ip.IsLinkLocalMulticast() || ip.IsInterfaceLocalMulticast():
		return AddrReasonNotUnicast, "not a unicast address a node can hold"
	case slices.Contains(localAddrs, ip):
		return AddrReasonLocal, "an address of this node"
	}
	// Shared is judged last: an address refused only as shared is still
	// a node's (Peer.NodeIPs), so it must have passed everything else.
	shared := func() (string, string) {
		if len(claimants) > 1 {
			return AddrReasonShared, fmt.Sprintf("claimed by %d nodes %v", len(claimants), claimants)
		}
		return "", ""
	}
	for _, c := range p.PodCIDRs {
		if c.Contains(ip) {
			// The claimant's own router IP: its pod CIDR is its
			// already.
			return shared()
		}
	}
	for _, c := range localCIDRs {
		if c.Contains(ip) {
			return AddrReasonPodCIDR, "inside this node's pod CIDR " + c.String()
		}
	}
	for _, o := range all {
		if o.Name == p.Name {
			continue
		}
		for _, c := range o.PodCIDRs {
			if c.Contains(ip) {
				return AddrReasonPodCIDR, fmt.Sprintf("inside the pod CIDR %s of node %s", c, o.Name)
			}
		}
	}
	for _, c := range r.Pools {
		if c.Contains(ip) {
			return AddrReasonPool, "inside the cluster pool " + c.String()
		}
	}
	for _, c := range r.Reserved {
		if c.Contains(ip) {
			return AddrReasonService, "inside the service CIDR " + c.String()
		}
	}
	return shared()
}
