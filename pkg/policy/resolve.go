// Resolution: an endpoint's labels and the repository's rules, over the
// universe of identities, become its map state, with the enforced and the
// audit view when an audited rule selects it. Resolve matches every
// selector itself; ResolveCached (selectorcache.go) goes through a cache.

package policy

import (
	"net/netip"
	"strings"

	"github.com/tendril-net/tendril/pkg/identity"
	"github.com/tendril-net/tendril/pkg/policy/api"
)

// Peer is a known identity: its labels, for a node-local CIDR identity its
// prefix, and the container ports its pods name.
type Peer struct {
	ID     identity.NumericIdentity
	Labels []string
	CIDR   netip.Prefix
	// NamedPorts are the named container ports of the identity's pods: an
	// egress rule's named port names the destination's port, so it is
	// resolved against the selected peers. Pods sharing an identity are
	// expected to name their ports alike (one workload); when they do not,
	// the agent passes the union and a name may open a port number on a
	// pod that gives it another name.
	NamedPorts map[string]NamedPort
	// Names are, for a CIDR identity, the DNS names the node's DNS proxy
	// saw answered with its address: what toFQDNs selectors match.
	Names []string
}

// Universe is every identity the policy can select.
type Universe []Peer

// ReservedPeers are the reserved identities with their labels.
func ReservedPeers() Universe {
	var u Universe
	for _, name := range []string{"host", "world", "unmanaged", "health", "init", "remote-node", "kube-apiserver", "ingress", "world-ipv4", "world-ipv6"} {
		id, _ := identity.ReservedByName(name)
		u = append(u, Peer{ID: id, Labels: []string{"reserved:" + name}})
	}
	return u
}

// Endpoint is what resolution needs of an endpoint.
type Endpoint struct {
	Labels []string
	// NamedPorts maps a container port name to its port and protocol.
	NamedPorts map[string]NamedPort
	// Host makes this the host endpoint (the node itself): Labels are
	// the node's, and only host policies (nodeSelector) select it.
	Host bool
	// AuditAll treats every rule selecting the endpoint as audited (the
	// host firewall's audit mode).
	AuditAll bool
	// AlwaysAllow are ports that stay open to any peer while a rule
	// selecting the endpoint enforces their direction, unless one of
	// those rules names the port (the host firewall's API server,
	// agent health and kubelet ports).
	AlwaysAllow []AlwaysAllowPort
}

// AlwaysAllowPort is one port of Endpoint.AlwaysAllow.
type AlwaysAllowPort struct {
	Direction uint8
	Proto     uint8
	Port      uint16
}

// NamedPort is a container port.
type NamedPort struct {
	Port  uint16
	Proto uint8
}

// Result is the resolved policy of one endpoint.
type Result struct {
	EnforceIngress bool
	EnforceEgress  bool
	MapState       MapState
	// Rules are the IDs of the rules selecting the endpoint.
	Rules []uint32
	// Revision is the repository revision resolved.
	Revision uint64
	// AuditIngress and AuditEgress: an audited rule selects the endpoint
	// in that direction. MapState then holds both views (see mergeAudit)
	// and AuditCookie names, per direction, the rule reported when the
	// audit view denies a flow no rule allows.
	AuditIngress, AuditEgress bool
	AuditCookie               [2]uint32
	// L7 holds the L7 rules of the MapState entries that name a proxy
	// (egress only): what the proxy enforces for flows the datapath
	// sent it by that entry.
	L7 L7Map
}

// l7Acc gathers the L7 rules of a resolution's allows and the keys also
// allowed without L7 rules.
type l7Acc struct {
	rules L7Map
	plain map[Key]bool
}

func namespaceOf(labels []string) string {
	for _, l := range labels {
		if v, ok := strings.CutPrefix(l, NamespaceLabel+"="); ok {
			return v
		}
	}
	return ""
}

// selects reports whether a stored rule selects an endpoint with the label
// set set in namespace ns (the set is built once per resolution, not per
// rule).
//
// A host policy selects only the host endpoint (by its node labels), an
// endpoint policy only the other endpoints.
func (s StoredRule) selects(set labelSet, ns string, host bool) bool {
	if host {
		return s.Namespace == "" && s.Rule.NodeSelector != nil && matchesSet(s.Rule.NodeSelector, set)
	}
	if s.Namespace != "" && ns != s.Namespace {
		return false
	}
	return s.Rule.EndpointSelector != nil && matchesSet(s.Rule.EndpointSelector, set)
}

// audited reports whether the rule counts as audited for ep.
func (s StoredRule) audited(ep Endpoint) bool { return s.Rule.Audited() || ep.AuditAll }

// Resolve computes an endpoint's policy from the repository's rules over
// the universe of identities.
func (r *Repository) Resolve(ep Endpoint, universe Universe) Result {
	return r.resolveViews(ep, universe, nil)
}

// resolveViews resolves the enforced view (audited rules left out) and,
// when an audited rule selects the endpoint, the audit view (every rule),
// folded into one map state.
func (r *Repository) resolveViews(ep Endpoint, universe Universe, cache *SelectorCache) Result {
	rules, rev := r.Rules(nil)
	var audited [2]bool
	var auditCookie [2]uint32
	// The endpoint's label set only when an audited rule exists: most
	// resolutions have none and must not pay for a second set.
	var epSet labelSet
	var epNS string
	haveSet := false
	for _, s := range rules {
		if !s.audited(ep) {
			continue
		}
		if !haveSet {
			epSet, epNS, haveSet = newLabelSet(ep.Labels), namespaceOf(ep.Labels), true
		}
		if !s.selects(epSet, epNS, ep.Host) {
			continue
		}
		for dir, has := range [2]bool{len(s.Rule.Ingress)+len(s.Rule.IngressDeny) > 0, len(s.Rule.Egress)+len(s.Rule.EgressDeny) > 0} {
			if has && !audited[dir] {
				audited[dir], auditCookie[dir] = true, s.ID
			}
		}
	}
	res := r.resolve(ep, rules, rev, universe, cache, false)
	if !audited[Ingress] && !audited[Egress] {
		return res
	}
	all := r.resolve(ep, rules, rev, universe, cache, true)
	res.Rules = all.Rules
	res.MapState = mergeAudit(res.MapState, all.MapState, audited)
	res.AuditIngress, res.AuditEgress, res.AuditCookie = audited[Ingress], audited[Egress], auditCookie
	for dir := range audited {
		if audited[dir] {
			res.MapState[Key{Direction: uint8(dir), Proto: AuditCookieProto}] = Entry{Cookie: auditCookie[dir], Views: EnforcedNone | AuditNone}
		}
	}
	return res
}

func (r *Repository) resolve(ep Endpoint, rules []StoredRule, rev uint64, universe Universe, cache *SelectorCache, withAudited bool) Result {
	res := Result{MapState: MapState{}, Revision: rev}
	acc := &l7Acc{rules: L7Map{}, plain: map[Key]bool{}}
	var ingressRules, egressRules, ingressDefaultDeny, egressDefaultDeny bool
	epSet, epNS := newLabelSet(ep.Labels), namespaceOf(ep.Labels)
	var selected []*api.Rule
	for _, s := range rules {
		if (!withAudited && s.audited(ep)) || !s.selects(epSet, epNS, ep.Host) {
			continue
		}
		res.Rules = append(res.Rules, s.ID)
		selected = append(selected, s.Rule)
		rule := s.Rule
		dd := rule.EnableDefaultDeny
		if len(rule.Ingress)+len(rule.IngressDeny) > 0 {
			ingressRules = true
			if dd == nil || dd.Ingress == nil || *dd.Ingress {
				ingressDefaultDeny = true
			}
		}
		if len(rule.Egress)+len(rule.EgressDeny) > 0 {
			egressRules = true
			if dd == nil || dd.Egress == nil || *dd.Egress {
				egressDefaultDeny = true
			}
		}
		for i, in := range rule.Ingress {
			res.MapState.add(ingressSection(in), Ingress, false, s, ep, universe, cache, i, acc)
		}
		for i, in := range rule.IngressDeny {
			res.MapState.add(ingressSection(in), Ingress, true, s, ep, universe, cache, i, acc)
		}
		for i, eg := range rule.Egress {
			res.MapState.add(egressSection(eg), Egress, false, s, ep, universe, cache, i, acc)
		}
		for i, eg := range rule.EgressDeny {
			res.MapState.add(egressSection(eg), Egress, true, s, ep, universe, cache, i, acc)
		}
	}
	res.EnforceIngress, res.EnforceEgress = ingressRules, egressRules
	// Rules that opt out of default deny enforce only their denies.
	if ingressRules && !ingressDefaultDeny {
		res.MapState.merge(Key{Direction: Ingress}, Entry{})
	}
	if egressRules && !egressDefaultDeny {
		res.MapState.merge(Key{Direction: Egress}, Entry{})
	}
	if ingressRules && r.localhostAllowed() {
		// An entry of its own, so a deny from host (longer prefix, or
		// the same key: deny wins) still applies.
		res.MapState.merge(Key{Identity: identity.Host, Direction: Ingress}, Entry{})
	}
	for _, ap := range ep.AlwaysAllow {
		enforced := ingressRules
		if ap.Direction == Egress {
			enforced = egressRules
		}
		if enforced && !namesPort(selected, ap) {
			// Any identity, no rule's cookie: a deny of a rule (longer
			// prefix, or the same key) still wins.
			res.MapState.merge(Key{Direction: ap.Direction, Proto: ap.Proto, Port: ap.Port, PrefixLen: 16}, Entry{})
		}
	}
	res.MapState.pruneCoveredAllows()
	res.MapState.resolveL7(acc.rules, acc.plain)
	if len(acc.rules) > 0 {
		res.L7 = acc.rules
	}
	return res
}

// namesPort reports whether one of rules names port ap in a section of its
// direction (allow or deny, as a number or inside a range): such a rule
// takes the port over from the always-allowed defaults.
func namesPort(rules []*api.Rule, ap AlwaysAllowPort) bool {
	match := func(ports []api.PortRule) bool {
		for _, pr := range ports {
			for _, pp := range pr.Ports {
				protos, from, to, err := pp.Parse()
				if err != nil || from == 0 {
					continue
				}
				if ap.Port < from || ap.Port > to {
					continue
				}
				for _, p := range protos {
					if p == ap.Proto {
						return true
					}
				}
			}
		}
		return false
	}
	for _, r := range rules {
		if ap.Direction == Ingress {
			for _, in := range append(append([]api.IngressRule(nil), r.Ingress...), r.IngressDeny...) {
				if match(in.ToPorts) {
					return true
				}
			}
			continue
		}
		for _, eg := range append(append([]api.EgressRule(nil), r.Egress...), r.EgressDeny...) {
			if match(eg.ToPorts) {
				return true
			}
		}
	}
	return false
}

func (r *Repository) localhostAllowed() bool {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.allowLocalhost
}

func (m MapState) add(s section, dir uint8, deny bool, rule StoredRule, ep Endpoint, universe Universe, cache *SelectorCache, idx int, acc *l7Acc) {
	// Named ports name the endpoint's own ports on ingress, the peer's on
	// egress: those resolve per selected peer below.
	peerNamed := dir == Egress && s.hasNamedPorts()
	var ids []identity.NumericIdentity
	var peers []Peer // the selected peers, when peerNamed
	wildcard := s.wildcard()
	switch {
	case wildcard:
		ids = []identity.NumericIdentity{0}
		if peerNamed {
			peers = universe
		}
	case cache != nil:
		ids = cache.lookup(selectorKey{rule: rule.ID, dir: dir, deny: deny, idx: idx}, s, rule.Namespace)
		if peerNamed {
			peers = cache.peers(ids)
		}
	default:
		for _, p := range universe {
			if s.peerMatches(p, rule.Namespace) {
				ids = append(ids, p.ID)
				if peerNamed {
					peers = append(peers, p)
				}
			}
		}
	}
	named := ep.NamedPorts
	if dir == Egress {
		named = nil
	}
	put := func(id identity.NumericIdentity, pk portKey) {
		k := Key{Identity: id, Direction: dir, Proto: pk.proto, Port: pk.port, PrefixLen: pk.prefixLen}
		e := Entry{Deny: deny, Cookie: rule.ID}
		switch {
		case pk.proxy == ProxyNone:
			if !deny {
				acc.plain[k] = true
			}
		case dir == Ingress && ep.Host:
			// The host endpoint's programs redirect nothing to the
			// proxies: the port is not opened at all (fail closed)
			// rather than opened to every request.
			return
		default:
			// Egress, or a pod's ingress: the pod programs send the
			// flow to the proxy (on ingress, bpf_lxc's from_pod of a
			// local source; any other path drops it, lib/lxc.h).
			e.Proxy = pk.proxy
			r := acc.rules[k]
			if r == nil {
				r = &L7Rules{}
				acc.rules[k] = r
			}
			r.DNS = append(r.DNS, pk.rules.DNS...)
			r.HTTP = append(r.HTTP, pk.rules.HTTP...)
		}
		m.merge(k, e)
	}
	ports := s.portKeys(named)
	for _, id := range ids {
		for _, pk := range ports {
			put(id, pk)
		}
	}
	if !peerNamed {
		return
	}
	// Each selected peer (every identity, for a wildcard section) gets its
	// own entries for the named ports: the number behind a name is the
	// peer's.
	for _, p := range peers {
		if len(p.NamedPorts) == 0 {
			continue
		}
		for _, pk := range s.namedPortKeys(p.NamedPorts) {
			put(p.ID, pk)
		}
	}
}
