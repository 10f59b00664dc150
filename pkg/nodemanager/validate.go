package nodemanager

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"
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
	ReasonTooLong      = "too-long"
	ReasonFamilyTwice  = "second-of-family"
	ReasonOutsidePool  = "outside-cluster-pool"
	ReasonReserved     = "overlaps-service-cidr"
	ReasonLocal        = "overlaps-local-pod-cidr"
	ReasonNodeAddress  = "contains-node-address"
	ReasonOtherNode    = "overlaps-other-node"
)

// inPools reports whether a lies inside the cluster pools (false when
// none is known).
func (r Rules) inPools(a netip.Addr) bool {
	for _, p := range r.Pools {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

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
	// claims, when set, index the names of the peers claiming each
	// address (unmapped): OwnAddresses, judging every peer, builds it.
	claims map[netip.Addr][]string
}

func newChecker(r Rules, peers []*Peer) *checker {
	c := &checker{rules: r, peers: peers}
	if r.Local != nil {
		c.localCIDRs, c.localAddrs = r.Local()
	}
	return c
}

// acceptable reports whether q's requested CIDR c passes every check
// that does not depend on a third node's CIDRs: a CIDR another node is
// refused for on its own never blocks anyone.
//
// A CIDR holding an address another node claims is where one of the two
// claims is false, and both come from objects a node writes: refusing
// the CIDR whatever the claim would let any node take another's pod
// CIDR away by claiming one address inside it. So the claim that loses
// is the one that can be told false: with the cluster pools known, an
// address inside them (a pod's, never a node's: OwnAddresses refuses
// it); else the newer of the two nodes (before), as for overlapping
// CIDRs, so every agent decides alike. The address then is refused as
// that node's (inside another node's pod CIDR) wherever addresses are
// trusted: the ipcache, routes, encryption.
func (k *checker) acceptable(q *Peer, c netip.Prefix) (reason, detail string) {
	if reason, detail = k.rules.own(c, k.localCIDRs, k.localAddrs); reason != "" {
		return reason, detail
	}
	for _, p := range k.peers {
		for _, a := range p.IPs {
			if !c.Contains(a.Unmap()) {
				continue
			}
			if p.Name != q.Name && (k.rules.inPools(a.Unmap()) || before(q, p)) {
				continue
			}
			return ReasonNodeAddress, fmt.Sprintf("contains the address %s of node %s", a, p.Name)
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

// sameOutcome reports whether two evaluations of a peer want the same,
// from what the node claims (its own addresses follow from those claims
// and the other peers', so an unchanged claim changes no one's).
func (p *Peer) sameOutcome(o *Peer) bool {
	return p.Name == o.Name && slices.Equal(p.IPs, o.IPs) && slices.Equal(p.PodCIDRs, o.PodCIDRs) &&
		slices.Equal(p.Requested, o.Requested) && slices.Equal(p.Rejected, o.Rejected) &&
		p.Created.Equal(o.Created) && p.WireGuardKey == o.WireGuardKey && p.KeyError == o.KeyError &&
		slices.Equal(p.HealthIPs, o.HealthIPs)
}

// addressTouched reports whether q's own addresses may change when the
// peers claiming ips or holding cidrs change: q claims one of ips (a
// shared address), or has an address inside one of cidrs.
func addressTouched(q *Peer, ips []netip.Addr, cidrs []netip.Prefix) bool {
	for _, a := range q.IPs {
		a = a.Unmap()
		for _, b := range ips {
			if a == b.Unmap() {
				return true
			}
		}
		for _, c := range cidrs {
			if c.Contains(a) {
				return true
			}
		}
	}
	return false
}

// Longest pod CIDR a node may be given per family: it must hold the
// node's router address and a pod at least (an IPv4 /31 or /32 has no
// address to spare).
const (
	MaxPrefixIPv4 = 30
	MaxPrefixIPv6 = 126
)

// CheckOwn checks this node's own pod CIDRs before the agent uses them
// (with --ipam cluster-pool they come from the TendrilNode, an object
// others write too): each no shorter than the minimum and no longer than
// MaxPrefixIPv4/IPv6, inside the cluster pool of its family when the
// rules know one, overlapping no service CIDR and holding none of this
// node's addresses; and at most one CIDR per family, since the endpoints'
// IPAM takes one per family and another node would route a second one
// nowhere. The error names every CIDR refused and why.
func (r Rules) CheckOwn(cidrs []netip.Prefix, nodeAddrs []netip.Addr) error {
	var errs []string
	var have4, have6 netip.Prefix
	for _, c := range cidrs {
		if !c.IsValid() {
			errs = append(errs, fmt.Sprintf("%v (%s: not a prefix)", c, ReasonMalformed))
			continue
		}
		c = c.Masked()
		is4 := c.Addr().Is4()
		reason, detail := r.own(c, nil, nodeAddrs)
		if reason == "" {
			longest := MaxPrefixIPv6
			if is4 {
				longest = MaxPrefixIPv4
			}
			if c.Bits() > longest {
				reason, detail = ReasonTooLong, fmt.Sprintf("longer than /%d: no room for the router address and pods", longest)
			}
		}
		first := &have6
		if is4 {
			first = &have4
		}
		if reason == "" && first.IsValid() {
			reason, detail = ReasonFamilyTwice, fmt.Sprintf("a second pod CIDR of its family beside %s (one per family)", first)
		}
		if reason != "" {
			errs = append(errs, Rejection{CIDR: c.String(), Reason: reason, Detail: detail}.String())
			continue
		}
		*first = c
	}
	if len(errs) > 0 {
		return fmt.Errorf("this node's pod CIDRs refused: %s", strings.Join(errs, "; "))
	}
	return nil
}
