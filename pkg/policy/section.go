// Rule sections: an ingress or egress rule's content, direction-neutral,
// and what it selects: which peers (endpoints, entities, CIDRs) and which
// protocol/port keys (port ranges split into prefixes, named ports looked
// up).

package policy

import (
	"strings"

	"github.com/tendril-net/tendril/pkg/identity"
	"github.com/tendril-net/tendril/pkg/policy/api"
)

// section is ingress or egress rule content, direction-neutral.
type section struct {
	endpoints []api.EndpointSelector
	entities  []string
	cidrs     []string
	cidrSets  []api.CIDRRule
	fqdns     []api.FQDNSelector
	ports     []api.PortRule
	icmps     []api.ICMPRule
}

func ingressSection(r api.IngressRule) section {
	return section{r.FromEndpoints, r.FromEntities, r.FromCIDR, r.FromCIDRSet, nil, r.ToPorts, r.ICMPs}
}

func egressSection(r api.EgressRule) section {
	return section{r.ToEndpoints, r.ToEntities, r.ToCIDR, r.ToCIDRSet, r.ToFQDNs, r.ToPorts, r.ICMPs}
}

// hasPeers: toFQDNs count as peers, so a toFQDNs section with ports is
// never taken for an L4-only (any peer) one; it selects only the CIDR
// identities learned for its names.
func (s section) hasPeers() bool {
	return len(s.endpoints)+len(s.entities)+len(s.cidrs)+len(s.cidrSets)+len(s.fqdns) > 0
}

// fqdnMatches reports whether an FQDN selector selects peer p: a CIDR
// identity whose address DNS answered for a name the selector matches.
func fqdnMatches(f api.FQDNSelector, p Peer) bool {
	if !p.CIDR.IsValid() {
		return false
	}
	for _, n := range p.Names {
		if f.Matches(n) {
			return true
		}
	}
	return false
}

// entityMatches reports whether entity selects peer p.
func entityMatches(entity string, p Peer) bool {
	switch entity {
	case "all":
		return true
	case "world":
		// A CIDR identity is the world's, except the in-cluster one of a
		// prefix (a pod's or a node's address inside a rule's block).
		return p.ID == identity.World || p.ID == identity.WorldIPv4 || p.ID == identity.WorldIPv6 || (p.ID.IsLocal() && !p.ID.IsInClusterCIDR())
	case "cluster":
		return !p.ID.IsLocal() && p.ID != identity.World && p.ID != identity.WorldIPv4 && p.ID != identity.WorldIPv6
	}
	id, ok := identity.ReservedByName(entity)
	return ok && p.ID == id
}

// cidrMatches reports whether a CIDR selector (with exceptions) selects a
// CIDR identity's prefix.
func cidrMatches(cidr string, except []string, p Peer) bool {
	if !p.CIDR.IsValid() {
		return false
	}
	c, err := api.ParseCIDR(cidr)
	if err != nil || !c.Contains(p.CIDR.Addr()) || p.CIDR.Bits() < c.Bits() {
		return false
	}
	for _, e := range except {
		ep, err := api.ParseCIDR(e)
		if err == nil && ep.Contains(p.CIDR.Addr()) && p.CIDR.Bits() >= ep.Bits() {
			return false
		}
	}
	return true
}

// peerMatches reports whether the section's peers select p; "all" (the
// wildcard) is reported by wildcard instead.
func (s section) peerMatches(p Peer, ns string) bool {
	return s.peerMatchesSet(p, newLabelSet(p.Labels), ns)
}

func (s section) peerMatchesSet(p Peer, set labelSet, ns string) bool {
	for _, e := range s.entities {
		if e != "all" && entityMatches(e, p) {
			return true
		}
	}
	for _, c := range s.cidrs {
		if cidrMatches(c, nil, p) {
			return true
		}
	}
	for _, c := range s.cidrSets {
		if cidrMatches(c.CIDR, c.Except, p) {
			return true
		}
	}
	for _, f := range s.fqdns {
		if fqdnMatches(f, p) {
			return true
		}
	}
	if p.ID.IsLocal() {
		return false
	}
	for _, sel := range s.endpoints {
		sel := withNamespace(sel, ns)
		if p.ID.IsReserved() && !selectorNamesReserved(sel) {
			continue
		}
		if matchesSet(&sel, set) {
			return true
		}
	}
	return false
}

func selectorNamesReserved(sel api.EndpointSelector) bool {
	for k := range sel.MatchLabels {
		if strings.HasPrefix(k, "reserved:") {
			return true
		}
	}
	return false
}

// wildcard reports whether the section selects every peer.
func (s section) wildcard() bool {
	if !s.hasPeers() {
		// An L4-only section applies to every peer; an empty one ({}, the
		// policy language's default deny) to none.
		return len(s.ports)+len(s.icmps) > 0
	}
	for _, e := range s.entities {
		if e == "all" {
			return true
		}
	}
	return false
}

type portKey struct {
	proto     uint8
	port      uint16
	prefixLen uint8
	// proxy and rules: the port's L7 rules and the proxy that enforces
	// them (ProxyNone, nil: none).
	proxy uint8
	rules *api.L7Rules
}

// hasNamedPorts reports whether any of the section's ports is a name.
func (s section) hasNamedPorts() bool {
	for _, pr := range s.ports {
		for _, pp := range pr.Ports {
			if pp.NamedPort() != "" {
				return true
			}
		}
	}
	return false
}

// portKeys expands a section's ports; named ports resolve through named
// (unknown names select nothing).
func (s section) portKeys(named map[string]NamedPort) []portKey {
	return s.expandPorts(named, false)
}

// namedPortKeys expands only the section's named ports, through named.
func (s section) namedPortKeys(named map[string]NamedPort) []portKey {
	return s.expandPorts(named, true)
}

func (s section) expandPorts(named map[string]NamedPort, onlyNamed bool) []portKey {
	if len(s.ports) == 0 && len(s.icmps) == 0 {
		if onlyNamed {
			return nil
		}
		return []portKey{{}}
	}
	var out []portKey
	for _, pr := range s.ports {
		// A port with L7 rules goes to the node's proxy for them
		// (validation allows them only on single numbered ports).
		var proxy uint8
		if pr.Rules != nil {
			switch {
			case len(pr.Rules.HTTP) > 0:
				proxy = ProxyHTTP
			case len(pr.Rules.DNS) > 0:
				proxy = ProxyDNS
			}
		}
		if len(pr.Ports) == 0 && !onlyNamed {
			out = append(out, portKey{})
		}
		for _, pp := range pr.Ports {
			if name := pp.NamedPort(); name != "" {
				np, ok := named[name]
				if !ok {
					continue
				}
				protos, _, _, _ := pp.Parse()
				for _, proto := range protos {
					if proto == np.Proto {
						out = append(out, portKey{proto: proto, port: np.Port, prefixLen: 16})
					}
				}
				continue
			}
			if onlyNamed {
				continue
			}
			protos, from, to, err := pp.Parse()
			if err != nil {
				continue
			}
			for _, proto := range protos {
				if from == 0 {
					out = append(out, portKey{proto: proto})
					continue
				}
				for _, r := range portRangePrefixes(from, to) {
					pk := portKey{proto: proto, port: r.port, prefixLen: r.prefixLen}
					if proxy != ProxyNone {
						pk.proxy, pk.rules = proxy, pr.Rules
					}
					out = append(out, pk)
				}
			}
		}
	}
	if onlyNamed {
		return out
	}
	for _, ic := range s.icmps {
		for _, f := range ic.Fields {
			proto := api.ProtoICMP
			if f.Family == "IPv6" {
				proto = api.ProtoICMP6
			}
			out = append(out, portKey{proto: proto, port: uint16(f.Type.Value), prefixLen: 16})
		}
	}
	return out
}

type portPrefix struct {
	port      uint16
	prefixLen uint8
}

// portRangePrefixes splits [from, to] into aligned prefixes.
func portRangePrefixes(from, to uint16) []portPrefix {
	var out []portPrefix
	start, end := uint32(from), uint32(to)
	for start <= end {
		size, bits := uint32(1), uint8(0)
		for bits < 16 {
			next := size << 1
			if start%next != 0 || start+next-1 > end {
				break
			}
			size, bits = next, bits+1
		}
		out = append(out, portPrefix{uint16(start), 16 - bits})
		start += size
	}
	return out
}
