package agentpolicy

import (
	"fmt"
	"net/netip"

	"github.com/tendril-net/tendril/pkg/datapath/maps"
	"github.com/tendril-net/tendril/pkg/endpoint"
	"github.com/tendril-net/tendril/pkg/identity"
	"github.com/tendril-net/tendril/pkg/option"
)

// The datapath checks policy once per flow and endpoint, when the flow is
// new (bpf/lib/policy.h, admit); a conntrack entry that names the
// endpoint lets every later packet through without a look at the policy
// map. Ending a flow revokes the endpoint's admission in its entry
// (maps.CTMap.Revoke): every later packet of the flow at the endpoint
// meets the new policy, and the flow is never admitted again. (Deleting
// the entry would not do: a packet of the other direction that the
// endpoint's policy lets through, a retransmission, would start the flow
// afresh with the endpoint as its initiator, and its peer's packets would
// be replies.) Which flows a change ends is --policy-revoke-established
// (option.Revoke*).

// revokeKind says what an endpoint's realized policy took away since its
// established flows were last checked.
type revokeKind uint8

const (
	// revokeDenied: an enforced deny entry landed.
	revokeDenied revokeKind = 1 << iota
	// revokeAllowGone: an enforced allow went away, or enforcement of a
	// direction began (everything not allowed is denied from then on).
	revokeAllowGone
)

func revokeFlags(w writeResult) revokeKind {
	var k revokeKind
	if w.denied {
		k |= revokeDenied
	}
	if w.revoked {
		k |= revokeAllowGone
	}
	return k
}

// needsWalk reports whether, under mode, what was taken away (pending)
// may have ended some established flows.
func needsWalk(mode string, pending revokeKind) bool {
	switch mode {
	case option.RevokeDeny:
		return pending&revokeDenied != 0
	case option.RevokeAll:
		return pending != 0
	}
	return false
}

// RevokeEstablished ends ep's established flows that the policy it now
// enforces no longer admits, as --policy-revoke-established says: it runs
// after the policy map entries and the endpoint's enforcement flags are
// written (the realizer calls it last), so a flow ended here meets the
// new policy on its next packet. It returns how many flows were ended;
// on error the walk is repeated by the next call.
func (p *Module) RevokeEstablished(ep *endpoint.Endpoint) (int, error) {
	p.mu.Lock()
	pending := p.revoke[ep.ID]
	was := p.enforced[ep.ID]
	now := [2]bool{ep.EnforceIngress, ep.EnforceEgress}
	p.enforced[ep.ID] = now
	if (now[0] && !was[0]) || (now[1] && !was[1]) {
		pending |= revokeAllowGone
	}
	p.revoke[ep.ID] = pending
	p.mu.Unlock()
	if !needsWalk(p.revokeMode, pending) {
		return 0, nil
	}
	if p.dp == nil || p.dp.Maps() == nil {
		return 0, nil
	}
	m := p.dp.Maps()
	ended, err := revokeFlows(endpointSide(ep), p.revokeMode, flowChecker{pm: m.PolicyMap(), ipc: m.IPCacheMap(), cidr: m.PolicyCIDRMap()}, m.CTMap())
	if err != nil {
		return ended, fmt.Errorf("end the established flows of endpoint %d its policy revokes: %w", ep.ID, err)
	}
	p.mu.Lock()
	// Only what was pending when the walk began is done: a change
	// realized meanwhile keeps its own mark.
	p.revoke[ep.ID] &^= pending
	p.mu.Unlock()
	if ended > 0 {
		p.log.Info("Ended established flows the policy no longer admits", "endpoint", ep.ID, "flows", ended, "mode", p.revokeMode)
	}
	return ended, nil
}

// flowTable is the conntrack table as the revocation walks it.
type flowTable interface {
	Iterate(fn func(maps.CTEntry) bool) error
	Revoke(e maps.CTEntry, id uint16) (bool, error)
}

// flowChecker decides a flow as the datapath decides a new one: the
// peer's identity from the ipcache, the in-cluster CIDR identity of its
// address when a rule names a prefix holding it, the endpoint's policy
// map entries for both, deny first.
type flowChecker struct {
	pm   *maps.PolicyMap
	ipc  maps.IPCacheMap
	cidr maps.PolicyCIDRMap
}

// verdict is the new-flow verdict of endpoint ep in direction dir for
// peer, proto and port: denied by a deny entry, and allowed.
func (c flowChecker) verdict(ep uint16, dir uint8, peer netip.Addr, proto uint8, port uint16) (deny, allowed bool, err error) {
	id := uint32(identity.World)
	info, ok, err := c.ipc.LookupAddr(peer)
	if err != nil {
		return false, false, err
	}
	if ok {
		id = info.Identity
	}
	ids := []uint32{id}
	if inClusterPeer(identity.NumericIdentity(id)) {
		cidrID, ok, err := c.cidr.LookupAddr(peer)
		if err != nil {
			return false, false, err
		}
		if ok && cidrID != 0 {
			ids = append(ids, cidrID)
		}
	}
	for _, id := range ids {
		v, found, err := c.pm.Decide(ep, dir, id, proto, port)
		if err != nil {
			return false, false, err
		}
		if found && v.Deny {
			return true, false, nil
		}
		allowed = allowed || found
	}
	return false, allowed, nil
}

// inClusterPeer is the datapath's in_cluster_peer (bpf/lib/ipcache.h): a
// pod's or a node's identity, not the world's or a CIDR's.
func inClusterPeer(id identity.NumericIdentity) bool {
	return !id.IsLocal() && id != identity.World && id != identity.WorldIPv4 && id != identity.WorldIPv6
}

// verdicter is flowChecker's decision, apart for tests.
type verdicter interface {
	verdict(ep uint16, dir uint8, peer netip.Addr, proto uint8, port uint16) (deny, allowed bool, err error)
}

// revokeSide is whose admissions a revocation walk ends: the ID that
// names its side in conntrack entries, the ID its policy map entries are
// under, and the directions it enforces. For a pod both IDs are its
// endpoint ID; for the node (the host firewall) conntrack names it
// maps.HostFirewallCTID and its policy is maps.HostEndpointID's.
type revokeSide struct {
	ctID, policyID  uint16
	ingress, egress bool
}

func endpointSide(ep *endpoint.Endpoint) revokeSide {
	return revokeSide{ctID: ep.ID, policyID: ep.ID, ingress: ep.EnforceIngress, egress: ep.EnforceEgress}
}

// revokeFlows revokes side's admission of the flows it admitted in a
// direction it enforces that its policy now denies (mode deny: by a deny
// entry; mode all: by a deny entry or for want of an allow): from their
// next packet on its policy checks them as new, and drops them.
func revokeFlows(side revokeSide, mode string, check verdicter, ct flowTable) (int, error) {
	var victims []maps.CTEntry
	var walkErr error
	err := ct.Iterate(func(e maps.CTEntry) bool {
		dir, ok := e.Origin(side.ctID)
		if !ok {
			return true
		}
		if (dir == maps.DirIngress && !side.ingress) || (dir == maps.DirEgress && !side.egress) {
			return true
		}
		peer := e.Dst
		if dir == maps.DirIngress {
			peer = e.Src
		}
		deny, allowed, err := check.verdict(side.policyID, dir, peer, e.Proto, flowPort(e))
		if err != nil {
			walkErr = err
			return false
		}
		if deny || (mode == option.RevokeAll && !allowed) {
			victims = append(victims, e)
		}
		return true
	})
	if err == nil {
		err = walkErr
	}
	if err != nil {
		return 0, err
	}
	ended := 0
	for _, e := range victims {
		ok, err := ct.Revoke(e, side.ctID)
		if err != nil {
			return ended, err
		}
		if ok {
			ended++
		}
	}
	return ended, nil
}

// flowPort is the port policy matched the flow's first packet on: the
// destination port, or for ICMP the type of the echo request (the entry
// keeps the echo identifier, not the type).
func flowPort(e maps.CTEntry) uint16 {
	switch e.Proto {
	case protoICMP:
		return 8
	case protoICMPv6:
		return 128
	}
	return e.DstPort
}

const (
	protoICMP   = 1
	protoICMPv6 = 58
)
