// Map state: an endpoint's desired policy map content (Key, Entry,
// MapState), how entries combine (deny wins, covered allows pruned, the
// enforced and audit views folded into one table), the diff against what
// the datapath holds, and the datapath's verdict for one packet.

package policy

import (
	"fmt"
	"sort"

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
	Views ViewFlags
	// Proxy is the node's proxy an allowed flow goes to (ProxyDNS on
	// egress, ProxyHTTP): the port has L7 rules, which Result.L7 holds.
	// 0: none.
	// In what was padding: the entry stays 8 bytes.
	Proxy  uint8
	Cookie uint32
}

// The node's proxies, as the datapath numbers them (PROXY_* in
// bpf/lib/enums.h).
const (
	ProxyNone uint8 = 0
	ProxyDNS  uint8 = 1
	ProxyHTTP uint8 = 2
)

// L7Rules are the L7 rules of the allows at one key with a proxy: the
// union of every section's, or, when an allow without L7 rules covers the
// key too, every name or request (the policies' union: an L4 allow of the
// peer and port lets everything through, the proxy only observes).
type L7Rules struct {
	DNS      []api.PortRuleDNS
	HTTP     []api.PortRuleHTTP
	AllowAll bool
}

// L7Map holds the L7 rules of an endpoint's entries that name a proxy.
type L7Map map[Key]*L7Rules

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

// Proxied reports, per direction, whether an allow of m names a proxy:
// ingress, the endpoint's flows from other nodes must be looked up for the
// ingress proxy (the datapath's EP_L7_INGRESS); egress, the replies of its
// flows from other nodes must be looked up for the HTTP proxy's upstream
// connection (EP2_L7_EGRESS). One pass over the map for both.
func (m MapState) Proxied() (ingress, egress bool) {
	for k, e := range m {
		if e.Deny || e.Proxy == ProxyNone {
			continue
		}
		if k.Direction == Ingress {
			ingress = true
		} else {
			egress = true
		}
		if ingress && egress {
			break
		}
	}
	return ingress, egress
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
		ent := Entry{Deny: ev.Deny, Cookie: ev.Cookie, Proxy: ev.Proxy}
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

func (m MapState) merge(k Key, e Entry) {
	if cur, ok := m[k]; ok && (cur.Deny || !e.Deny) {
		// Deny wins; an allow does not replace an allow, except that an
		// allow with a proxy and one without make one with the proxy
		// (its L7 rules then allow all: see resolveL7).
		if !cur.Deny && !e.Deny && cur.Proxy == ProxyNone && e.Proxy != ProxyNone {
			cur.Proxy = e.Proxy
			m[k] = cur
		}
		return
	}
	m[k] = e
}

// resolveL7 settles the L7 rules of the entries that name a proxy: an
// allow without a proxy at the same key or covering it (the same identity
// or any identity, a shorter port prefix) opens the port to everything,
// so the proxy allows every name or request there (it still observes);
// the rules of keys whose entry names no proxy (a deny won) are dropped.
func (m MapState) resolveL7(l7 L7Map, plain map[Key]bool) {
	for k, r := range l7 {
		e, ok := m[k]
		if !ok || e.Deny || e.Proxy == ProxyNone {
			delete(l7, k)
			continue
		}
		if plain[k] {
			r.AllowAll = true
			continue
		}
		for ck, ce := range m {
			if ck == k || ce.Deny || ce.Proxy != ProxyNone || ce.Views.Has(EnforcedNone) {
				continue
			}
			if ck.Identity != k.Identity && ck.Identity != 0 {
				continue
			}
			c := ck
			c.Identity = k.Identity
			if c.covers(k) {
				r.AllowAll = true
				break
			}
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
