package policy

import (
	"fmt"
	"maps"
	"net/netip"
	"sort"
	"strings"
	"sync"

	"github.com/tendril-net/tendril/pkg/identity"
	"github.com/tendril-net/tendril/pkg/policy/api"
)

// Directions.
const (
	Ingress uint8 = 0
	Egress  uint8 = 1
)

// Key is one map-state key: identity 0 is any identity; Proto 0 any
// protocol (and port); PrefixLen is how many leading bits of Port count
// (16 exact, 0 any port). It mirrors the BPF policy map key.
type Key struct {
	Identity  identity.NumericIdentity
	Direction uint8
	Proto     uint8
	Port      uint16
	PrefixLen uint8
}

// Entry is allow or deny, with the cookie of the rule behind it.
type Entry struct {
	Deny bool
	// Views is, for an endpoint under audited policy (see mergeAudit),
	// what each view has at the key: 0 for a shared entry. One byte, so an
	// entry stays 8 bytes (map states are large and built often).
	Views  ViewFlags
	Cookie uint32
}

// ViewFlags say what the enforced and the audit view of an audited
// endpoint have at a key; the values are the datapath's POLICY_F_*.
type ViewFlags uint8

// View flags.
const (
	// EnforcedNone: the enforced view has no entry here.
	EnforcedNone ViewFlags = 0x01
	// AuditDeny: the audit view denies here.
	AuditDeny ViewFlags = 0x02
	// AuditNone: the audit view has no entry here.
	AuditNone ViewFlags = 0x04
)

// Has reports whether every flag of f is set.
func (v ViewFlags) Has(f ViewFlags) bool { return v&f == f }

// MapState is an endpoint's desired policy map content.
type MapState map[Key]Entry

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
func (s StoredRule) selects(set labelSet, ns string) bool {
	if s.Namespace != "" && ns != s.Namespace {
		return false
	}
	return s.Rule.EndpointSelector != nil && matchesSet(s.Rule.EndpointSelector, set)
}

// section is ingress or egress rule content, direction-neutral.
type section struct {
	endpoints []api.EndpointSelector
	entities  []string
	cidrs     []string
	cidrSets  []api.CIDRRule
	ports     []api.PortRule
	icmps     []api.ICMPRule
}

func ingressSection(r api.IngressRule) section {
	return section{r.FromEndpoints, r.FromEntities, r.FromCIDR, r.FromCIDRSet, r.ToPorts, r.ICMPs}
}

func egressSection(r api.EgressRule) section {
	return section{r.ToEndpoints, r.ToEntities, r.ToCIDR, r.ToCIDRSet, r.ToPorts, r.ICMPs}
}

func (s section) hasPeers() bool {
	return len(s.endpoints)+len(s.entities)+len(s.cidrs)+len(s.cidrSets) > 0
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
						out = append(out, portKey{proto, np.Port, 16})
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
					out = append(out, portKey{proto, 0, 0})
					continue
				}
				for _, r := range portRangePrefixes(from, to) {
					out = append(out, portKey{proto, r.port, r.prefixLen})
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
			out = append(out, portKey{proto, uint16(f.Type.Value), 16})
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

// covers reports whether (proto, port prefix) a contains b.
func (a Key) covers(b Key) bool {
	if a.Identity != b.Identity || a.Direction != b.Direction {
		return false
	}
	if a.Proto == 0 {
		return true
	}
	if a.Proto != b.Proto || b.PrefixLen < a.PrefixLen {
		return false
	}
	if a.PrefixLen == 0 {
		return true
	}
	mask := ^uint16(0) << (16 - a.PrefixLen)
	return a.Port&mask == b.Port&mask
}

// Resolve computes an endpoint's policy from the repository's rules over
// the universe of identities.
func (r *Repository) Resolve(ep Endpoint, universe Universe) Result {
	return r.resolveViews(ep, universe, nil)
}

// SelectorCache remembers which identities each peer selector selects for
// one repository revision, so resolving many endpoints matches every
// selector against every identity once. When only the universe changes
// (identities come and go), the cache is updated incrementally: only the
// added and changed identities are matched against the cached selectors.
type SelectorCache struct {
	mu       sync.Mutex
	revision uint64
	version  uint64
	sets     []labelSet
	universe Universe
	// index finds a universe entry by identity (egress named ports need
	// the selected peers' ports).
	index    map[identity.NumericIdentity]int
	selected map[selectorKey]*cachedSelection
}

type selectorKey struct {
	rule uint32
	dir  uint8
	deny bool
	idx  int
}

// cachedSelection is what a selector selects, with what it takes to match
// a new identity against it. ids is replaced, never changed in place:
// callers may hold the old slice.
type cachedSelection struct {
	sec section
	ns  string
	ids []identity.NumericIdentity
}

// NewSelectorCache returns an empty cache.
func NewSelectorCache() *SelectorCache { return &SelectorCache{} }

// ResolveCached is Resolve through a selector cache; version must change
// whenever the universe does.
func (r *Repository) ResolveCached(ep Endpoint, universe Universe, version uint64, c *SelectorCache) Result {
	rev := r.Revision()
	c.mu.Lock()
	switch {
	case c.selected == nil || c.revision != rev:
		c.reset(rev, version, universe)
	case c.version != version:
		c.update(version, universe)
	}
	c.mu.Unlock()
	return r.resolveViews(ep, universe, c)
}

// reset drops every cached selection.
func (c *SelectorCache) reset(rev, version uint64, universe Universe) {
	c.revision, c.version, c.universe = rev, version, universe
	c.sets = make([]labelSet, len(universe))
	c.index = make(map[identity.NumericIdentity]int, len(universe))
	for i, p := range universe {
		c.sets[i] = newLabelSet(p.Labels)
		c.index[p.ID] = i
	}
	c.selected = map[selectorKey]*cachedSelection{}
}

// update moves the cache to a new universe: identities that vanished or
// whose labels (or CIDR) changed leave every selection, added and changed
// ones are matched against every cached selector. When most of the
// universe changed, starting over is cheaper.
func (c *SelectorCache) update(version uint64, universe Universe) {
	sets := make([]labelSet, len(universe))
	var fresh []int // universe positions to match
	gone := map[identity.NumericIdentity]bool{}
	// A new universe is mostly the old one in the same order (the agent
	// builds it from the identities each time): a peer is looked for at
	// its old position first, and the index is the old one cloned and
	// patched where peers moved or came, far cheaper than built again.
	var patch []int // positions of peers that moved or are new
	for i, p := range universe {
		oi, ok := i, i < len(c.universe) && c.universe[i].ID == p.ID
		if !ok {
			oi, ok = c.index[p.ID]
			patch = append(patch, i)
		}
		if ok && samePeer(c.universe[oi], p) {
			sets[i] = c.sets[oi]
			continue
		}
		sets[i] = newLabelSet(p.Labels)
		fresh = append(fresh, i)
		if ok {
			gone[p.ID] = true // changed: leaves, then is matched again
		}
	}
	var index map[identity.NumericIdentity]int
	if len(patch) <= len(universe)/8 {
		index = maps.Clone(c.index)
		for _, i := range patch {
			index[universe[i].ID] = i
		}
		// An identity is still there when its position holds it;
		// otherwise it left the universe, and the clone still names it.
		for id, i := range index {
			if i >= len(universe) || universe[i].ID != id {
				gone[id] = true
				delete(index, id)
			}
		}
	} else {
		index = make(map[identity.NumericIdentity]int, len(universe))
		for i, p := range universe {
			index[p.ID] = i
		}
		for id := range c.index {
			if _, ok := index[id]; !ok {
				gone[id] = true
			}
		}
	}
	if len(fresh)+len(gone) > len(universe)/4+8 {
		c.reset(c.revision, version, universe)
		return
	}
	c.version, c.universe, c.sets, c.index = version, universe, sets, index
	if len(fresh) == 0 && len(gone) == 0 {
		return
	}
	for _, sel := range c.selected {
		var ids []identity.NumericIdentity
		changed := false
		if len(gone) > 0 {
			ids = make([]identity.NumericIdentity, 0, len(sel.ids))
			for _, id := range sel.ids {
				if gone[id] {
					changed = true
					continue
				}
				ids = append(ids, id)
			}
		} else {
			ids = sel.ids
		}
		for _, i := range fresh {
			if sel.sec.peerMatchesSet(universe[i], sets[i], sel.ns) {
				if !changed {
					ids = append(append([]identity.NumericIdentity(nil), ids...), universe[i].ID)
					changed = true
					continue
				}
				ids = append(ids, universe[i].ID)
			}
		}
		if changed {
			sel.ids = ids
		}
	}
}

// samePeer reports whether a peer still selects alike: same labels, same
// CIDR. Named ports do not change selection.
func samePeer(a, b Peer) bool {
	if a.CIDR != b.CIDR || len(a.Labels) != len(b.Labels) {
		return false
	}
	for i := range a.Labels {
		if a.Labels[i] != b.Labels[i] {
			return false
		}
	}
	return true
}

func (c *SelectorCache) lookup(k selectorKey, s section, ns string) []identity.NumericIdentity {
	c.mu.Lock()
	sel, ok := c.selected[k]
	c.mu.Unlock()
	if ok {
		return sel.ids
	}
	ids := []identity.NumericIdentity{}
	c.mu.Lock()
	universe, sets := c.universe, c.sets
	c.mu.Unlock()
	for i, p := range universe {
		if s.peerMatchesSet(p, sets[i], ns) {
			ids = append(ids, p.ID)
		}
	}
	c.mu.Lock()
	c.selected[k] = &cachedSelection{sec: s, ns: ns, ids: ids}
	c.mu.Unlock()
	return ids
}

// peers returns the universe entries of ids.
func (c *SelectorCache) peers(ids []identity.NumericIdentity) []Peer {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]Peer, 0, len(ids))
	for _, id := range ids {
		if i, ok := c.index[id]; ok {
			out = append(out, c.universe[i])
		}
	}
	return out
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
		if !s.Rule.Audited() {
			continue
		}
		if !haveSet {
			epSet, epNS, haveSet = newLabelSet(ep.Labels), namespaceOf(ep.Labels), true
		}
		if !s.selects(epSet, epNS) {
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

// AuditCookieProto is the protocol of the key holding an audited
// endpoint's audit cookie (maps.PolicyAuditCookieProto).
const AuditCookieProto = 255

// mergeAudit folds the audit view a into the enforced view e, for the
// directions audited: one table whose entries say what each view has at
// their key, so the datapath's one longest-prefix lookup per trie answers
// both. Every key of either view is kept; at each, a view's verdict is its
// entry at the longest of its own keys covering it (what its own lookup
// would find for any packet whose longest key in the union is this one).
func mergeAudit(e, a MapState, audited [2]bool) MapState {
	out := MapState{}
	// A key covers only keys of its own direction and identity: each view
	// is indexed by those, so finding the covering keys walks one group,
	// not the whole map state.
	type group struct {
		dir uint8
		id  identity.NumericIdentity
	}
	index := func(m MapState) map[group][]Key {
		g := map[group][]Key{}
		for k := range m {
			if audited[k.Direction] {
				g[group{k.Direction, k.Identity}] = append(g[group{k.Direction, k.Identity}], k)
			}
		}
		return g
	}
	eIdx, aIdx := index(e), index(a)
	longest := func(m MapState, idx map[group][]Key, k Key) (Entry, bool) {
		if v, ok := m[k]; ok {
			return v, true
		}
		var best Entry
		bestLen, found := -1, false
		for _, mk := range idx[group{k.Direction, k.Identity}] {
			if !mk.covers(k) {
				continue
			}
			l := 0
			if mk.Proto != 0 {
				l = 16 + int(mk.PrefixLen)
			}
			if l > bestLen {
				best, bestLen, found = m[mk], l, true
			}
		}
		return best, found
	}
	for k, v := range e {
		if !audited[k.Direction] {
			out[k] = v
		}
	}
	keys := map[Key]bool{}
	for k := range e {
		if audited[k.Direction] {
			keys[k] = true
		}
	}
	for k := range a {
		if audited[k.Direction] {
			keys[k] = true
		}
	}
	for k := range keys {
		ev, eok := longest(e, eIdx, k)
		av, aok := longest(a, aIdx, k)
		ent := Entry{Deny: ev.Deny, Cookie: ev.Cookie}
		if !eok {
			ent.Views |= EnforcedNone
		}
		if !aok {
			ent.Views |= AuditNone
		}
		if aok && av.Deny {
			ent.Views |= AuditDeny
		}
		// The cookie the datapath reports: the audit view's deny rule when
		// only it denies (an AUDIT event), else the enforced view's entry.
		if (aok && av.Deny && !(eok && ev.Deny)) || !eok {
			ent.Cookie = av.Cookie
		}
		out[k] = ent
	}
	return out
}

func (r *Repository) resolve(ep Endpoint, rules []StoredRule, rev uint64, universe Universe, cache *SelectorCache, withAudited bool) Result {
	res := Result{MapState: MapState{}, Revision: rev}
	var ingressRules, egressRules, ingressDefaultDeny, egressDefaultDeny bool
	epSet, epNS := newLabelSet(ep.Labels), namespaceOf(ep.Labels)
	for _, s := range rules {
		if (!withAudited && s.Rule.Audited()) || !s.selects(epSet, epNS) {
			continue
		}
		res.Rules = append(res.Rules, s.ID)
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
			res.MapState.add(ingressSection(in), Ingress, false, s, ep, universe, cache, i)
		}
		for i, in := range rule.IngressDeny {
			res.MapState.add(ingressSection(in), Ingress, true, s, ep, universe, cache, i)
		}
		for i, eg := range rule.Egress {
			res.MapState.add(egressSection(eg), Egress, false, s, ep, universe, cache, i)
		}
		for i, eg := range rule.EgressDeny {
			res.MapState.add(egressSection(eg), Egress, true, s, ep, universe, cache, i)
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
	res.MapState.pruneCoveredAllows()
	return res
}

func (m MapState) merge(k Key, e Entry) {
	if cur, ok := m[k]; ok && (cur.Deny || !e.Deny) {
		return // deny wins; an allow does not replace an allow
	}
	m[k] = e
}

func (m MapState) add(s section, dir uint8, deny bool, rule StoredRule, ep Endpoint, universe Universe, cache *SelectorCache, idx int) {
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
		m.merge(Key{Identity: id, Direction: dir, Proto: pk.proto, Port: pk.port, PrefixLen: pk.prefixLen}, Entry{Deny: deny, Cookie: rule.ID})
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

// pruneCoveredAllows removes allows that a deny of the same identity covers:
// the datapath takes the longest prefix per identity, so such an allow
// would otherwise win over the broader deny.
func (m MapState) pruneCoveredAllows() {
	var denies []Key
	for k, e := range m {
		if e.Deny {
			denies = append(denies, k)
		}
	}
	for k, e := range m {
		if e.Deny {
			continue
		}
		for _, d := range denies {
			if d.covers(k) {
				delete(m, k)
				break
			}
		}
	}
}

// Diff returns the entries to write and the keys to delete to turn cur into
// want.
func Diff(cur, want MapState) (upserts MapState, deletes []Key) {
	upserts = MapState{}
	for k, e := range want {
		if c, ok := cur[k]; !ok || c != e {
			upserts[k] = e
		}
	}
	for k := range cur {
		if _, ok := want[k]; !ok {
			deletes = append(deletes, k)
		}
	}
	sort.Slice(deletes, func(i, j int) bool { return fmt.Sprint(deletes[i]) < fmt.Sprint(deletes[j]) })
	return upserts, deletes
}

// Allowed evaluates the map state for one packet the way the datapath does:
// the longest match for the identity and for any identity; deny wins.
func (m MapState) Allowed(dir uint8, id identity.NumericIdentity, proto uint8, port uint16) (allowed bool, cookie uint32) {
	v, cookie := m.verdict(dir, id, proto, port)
	return v == verdictAllow, cookie
}

// AllowedWithCIDR is the datapath's verdict for a peer in the cluster (a
// pod or a node) with identity id whose address lies in a prefix a rule
// names, cidrID being that prefix's in-cluster identity (0: no rule names
// a prefix holding the address): the entries of both decide, a deny in
// either wins, else an allow in either (bpf/lib/policy.h).
func (m MapState) AllowedWithCIDR(dir uint8, id, cidrID identity.NumericIdentity, proto uint8, port uint16) (allowed bool, cookie uint32) {
	v, cookie := m.verdict(dir, id, proto, port)
	if v == verdictDeny || cidrID == 0 {
		return v == verdictAllow, cookie
	}
	cv, ccookie := m.verdict(dir, cidrID, proto, port)
	if cv == verdictDeny || (cv == verdictAllow && v != verdictAllow) {
		return cv == verdictAllow, ccookie
	}
	return v == verdictAllow, cookie
}

// AuditAllowed evaluates the audit view of an audited endpoint's map
// state for one packet, as the datapath does (entries the audit view has
// no part in are skipped; an entry without audit flags is shared).
func (m MapState) AuditAllowed(dir uint8, id identity.NumericIdentity, proto uint8, port uint16) (allowed bool, cookie uint32) {
	audit := MapState{}
	for k, e := range m {
		if e.Views.Has(AuditNone) {
			continue
		}
		audit[k] = Entry{Deny: e.Views.Has(AuditDeny) || (e.Deny && !e.Views.Has(EnforcedNone)), Cookie: e.Cookie}
	}
	return audit.Allowed(dir, id, proto, port)
}

type verdict int

const (
	verdictNone verdict = iota // no entry: denied where enforced
	verdictAllow
	verdictDeny
)

func (m MapState) verdict(dir uint8, id identity.NumericIdentity, proto uint8, port uint16) (verdict, uint32) {
	lookup := func(id identity.NumericIdentity) (Entry, bool) {
		var best Entry
		bestLen := -1
		for k, e := range m {
			if k.Identity != id || k.Direction != dir || e.Views.Has(EnforcedNone) {
				continue // (an entry only the audit view has)
			}
			l := 0
			if k.Proto != 0 {
				if k.Proto != proto {
					continue
				}
				if k.PrefixLen > 0 {
					mask := ^uint16(0) << (16 - k.PrefixLen)
					if k.Port&mask != port&mask {
						continue
					}
				}
				l = 16 + int(k.PrefixLen)
			}
			if l > bestLen {
				best, bestLen = e, l
			}
		}
		return best, bestLen >= 0
	}
	exact, okE := lookup(id)
	any, okA := lookup(0)
	if (okE && exact.Deny) || (okA && any.Deny) {
		if okE && exact.Deny {
			return verdictDeny, exact.Cookie
		}
		return verdictDeny, any.Cookie
	}
	if okE {
		return verdictAllow, exact.Cookie
	}
	if okA {
		return verdictAllow, any.Cookie
	}
	return verdictNone, 0
}
