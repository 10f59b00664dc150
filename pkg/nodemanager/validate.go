package nodemanager

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
)

// Default shortest pod CIDR a peer may claim per family: a node's pod
// CIDR is a slice of the cluster's pod network (cluster-pool and
// kube-controller-manager cut /24 and /64 by default); a /16 of IPv4 is
// 65,536 pods on one node, anything shorter is a claim on other networks.
const (
	DefaultMinPrefixIPv4 = 16
	DefaultMinPrefixIPv6 = 48
)

// Rules are what a peer's pod CIDRs are checked against before they
// become routes, non-masquerade prefixes or the scope of the peer's
// endpoints' ipcache claims. Every other node's objects are written by
// that node's agent (or whoever holds its credentials), so a pod CIDR is
// a claim, not a fact.
type Rules struct {
	// MinPrefixIPv4 and MinPrefixIPv6 are the shortest prefix lengths
	// accepted (0: the defaults). The default route is refused always.
	MinPrefixIPv4, MinPrefixIPv6 int
	// Pools, when they hold a prefix of a CIDR's family, must contain it
	// (the operator's cluster pools, when the agent is told them).
	Pools []netip.Prefix
	// Reserved are prefixes no pod CIDR may overlap (the service CIDRs).
	Reserved []netip.Prefix
	// Local returns this node's pod CIDRs and addresses; called at each
	// check, since they are known only once the node's CIDRs are chosen.
	Local func() (podCIDRs []netip.Prefix, addrs []netip.Addr)
}

// Rejection is a requested pod CIDR that did not pass the checks, and why.
type Rejection struct {
	CIDR string
	// Reason is one of the Reason* codes, Detail says more.
	Reason, Detail string
}

func (r Rejection) String() string { return r.CIDR + " (" + r.Reason + ": " + r.Detail + ")" }

// Reasons, also the label of the rejection counter.
const (
	ReasonMalformed    = "malformed"
	ReasonDefaultRoute = "default-route"
	ReasonTooShort     = "too-short"
	ReasonFamilyTwice  = "second-of-family"
	ReasonOutsidePool  = "outside-cluster-pool"
	ReasonReserved     = "overlaps-service-cidr"
	ReasonLocal        = "overlaps-local-pod-cidr"
	ReasonNodeAddress  = "contains-node-address"
	ReasonOtherNode    = "overlaps-other-node"
)

func (r Rules) minPrefix(is4 bool) int {
	if is4 {
		return cmp.Or(r.MinPrefixIPv4, DefaultMinPrefixIPv4)
	}
	return cmp.Or(r.MinPrefixIPv6, DefaultMinPrefixIPv6)
}

// Validate checks the rules' own values.
func (r Rules) Validate() error {
	if r.MinPrefixIPv4 < 0 || r.MinPrefixIPv4 > 32 {
		return fmt.Errorf("minimum IPv4 pod CIDR prefix length %d: must be 1 to 32", r.MinPrefixIPv4)
	}
	if r.MinPrefixIPv6 < 0 || r.MinPrefixIPv6 > 128 {
		return fmt.Errorf("minimum IPv6 pod CIDR prefix length %d: must be 1 to 128", r.MinPrefixIPv6)
	}
	return nil
}

// own checks a CIDR on its own: its length, the pools, the reserved
// prefixes and this node's pod CIDRs and addresses. "" passes.
func (r Rules) own(c netip.Prefix, localCIDRs []netip.Prefix, localAddrs []netip.Addr) (reason, detail string) {
	is4 := c.Addr().Is4()
	switch {
	case c.Bits() == 0:
		return ReasonDefaultRoute, "the default route"
	case c.Bits() < r.minPrefix(is4):
		return ReasonTooShort, fmt.Sprintf("shorter than /%d", r.minPrefix(is4))
	}
	inPool, havePool := false, false
	for _, p := range r.Pools {
		if p.Addr().Is4() != is4 {
			continue
		}
		havePool = true
		if p.Bits() <= c.Bits() && p.Contains(c.Addr()) {
			inPool = true
		}
	}
	if havePool && !inPool {
		return ReasonOutsidePool, "outside the cluster pool"
	}
	for _, p := range r.Reserved {
		if p.Overlaps(c) {
			return ReasonReserved, "overlaps the service CIDR " + p.String()
		}
	}
	for _, p := range localCIDRs {
		if p.Overlaps(c) {
			return ReasonLocal, "overlaps this node's pod CIDR " + p.String()
		}
	}
	for _, a := range localAddrs {
		if c.Contains(a) {
			return ReasonNodeAddress, "contains this node's address " + a.String()
		}
	}
	return "", ""
}

// before orders peers for overlapping claims: the node created first
// wins, by name among equals, so every agent picks the same owner
// whatever order it saw the events in.
func before(a, b *Peer) bool {
	if !a.Created.Equal(b.Created) {
		return a.Created.Before(b.Created)
	}
	return a.Name < b.Name
}

// checker evaluates peers against the rules and the other peers.
type checker struct {
	rules      Rules
	localCIDRs []netip.Prefix
	localAddrs []netip.Addr
	// peers are every peer as requested (the table's objects, with the
	// one being changed replaced).
	peers []*Peer
}

func newChecker(r Rules, peers []*Peer) *checker {
	c := &checker{rules: r, peers: peers}
	if r.Local != nil {
		c.localCIDRs, c.localAddrs = r.Local()
	}
	return c
}

// acceptable reports whether q's requested CIDR c passes every check
// that does not depend on a third node: a CIDR another node is refused
// for on its own never blocks anyone.
func (k *checker) acceptable(q *Peer, c netip.Prefix) (reason, detail string) {
	if reason, detail = k.rules.own(c, k.localCIDRs, k.localAddrs); reason != "" {
		return reason, detail
	}
	for _, p := range k.peers {
		for _, a := range p.IPs {
			if c.Contains(a) {
				return ReasonNodeAddress, fmt.Sprintf("contains the address %s of node %s", a, p.Name)
			}
		}
	}
	return "", ""
}

// evaluate fills q's accepted PodCIDRs and Rejected from its Requested
// (malformed ones, found when the objects were read, stay rejected).
func (k *checker) evaluate(q *Peer) {
	q.PodCIDRs = nil
	q.Rejected = slices.DeleteFunc(slices.Clone(q.Rejected), func(r Rejection) bool { return r.Reason != ReasonMalformed })
	var have4, have6 bool
	for _, c := range q.Requested {
		reason, detail := k.acceptable(q, c)
		if reason == "" {
			if other, oc := k.overlapping(q, c); other != nil {
				reason, detail = ReasonOtherNode, fmt.Sprintf("overlaps %s of node %s", oc, other.Name)
			}
		}
		if reason == "" && ((c.Addr().Is4() && have4) || (!c.Addr().Is4() && have6)) {
			reason, detail = ReasonFamilyTwice, "a second pod CIDR of its family"
		}
		if reason != "" {
			q.Rejected = append(q.Rejected, Rejection{CIDR: c.String(), Reason: reason, Detail: detail})
			continue
		}
		if c.Addr().Is4() {
			have4 = true
		} else {
			have6 = true
		}
		q.PodCIDRs = append(q.PodCIDRs, c)
	}
}

// overlapping returns the peer ordered before q that asks for a CIDR
// overlapping c and passes the checks of its own with it.
func (k *checker) overlapping(q *Peer, c netip.Prefix) (*Peer, netip.Prefix) {
	var best *Peer
	var bestCIDR netip.Prefix
	for _, p := range k.peers {
		if p.Name == q.Name || !before(p, q) || (best != nil && !before(p, best)) {
			continue
		}
		for _, oc := range p.Requested {
			if oc.Overlaps(c) {
				if r, _ := k.acceptable(p, oc); r == "" {
					best, bestCIDR = p, oc
					break
				}
			}
		}
	}
	return best, bestCIDR
}

// related reports whether a change of peer p (its requested CIDRs or its
// addresses) may change what q is accepted for.
func related(p, q *Peer) bool {
	if p == nil || q == nil {
		return false
	}
	for _, c := range q.Requested {
		for _, oc := range p.Requested {
			if c.Overlaps(oc) {
				return true
			}
		}
		for _, a := range p.IPs {
			if c.Contains(a) {
				return true
			}
		}
	}
	return false
}

// sameOutcome reports whether two evaluations of a peer want the same.
func (p *Peer) sameOutcome(o *Peer) bool {
	return p.sameSpec(o) && slices.Equal(p.Requested, o.Requested) && slices.Equal(p.Rejected, o.Rejected) &&
		p.Created.Equal(o.Created) && p.WireGuardKey == o.WireGuardKey && p.KeyError == o.KeyError &&
		slices.Equal(p.HealthIPs, o.HealthIPs)
}
