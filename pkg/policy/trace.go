package policy

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/tendril-net/tendril/pkg/identity"
	"github.com/tendril-net/tendril/pkg/policy/api"
)

// TraceResult explains the verdict for one flow.
type TraceResult struct {
	Allowed bool         `json:"allowed"`
	Egress  TraceVerdict `json:"egress"`
	Ingress TraceVerdict `json:"ingress"`
	Lines   []string     `json:"lines"`
}

// TraceVerdict is one direction's part of a trace.
type TraceVerdict struct {
	Enforced bool     `json:"enforced"`
	Allowed  bool     `json:"allowed"`
	Rules    []uint32 `json:"rules"`
	// Cookie is the rule whose entry decided (0: default deny or no
	// enforcement).
	Cookie uint32 `json:"cookie"`
	// L7 are the application-level rules on the traced port for this
	// peer, by rule: what the DNS or HTTP proxy checks after the L4
	// verdict.
	L7 []TraceL7 `json:"l7,omitempty"`
}

// TraceL7 is one rule's L7 rules on a traced port.
type TraceL7 struct {
	Rule uint32 `json:"rule"`
	// DNS are the names (matchName) and patterns (matchPattern) that may
	// be looked up.
	DNS []string `json:"dns,omitempty"`
	// HTTP are the allowed requests, each "METHOD PATH" and its host and
	// headers when set.
	HTTP []string `json:"http,omitempty"`
}

// traceIdentity stands for a traced endpoint that has no identity yet.
const traceIdentity identity.NumericIdentity = 0xfffffe

// peerFor finds the identity of labels in the universe (a reserved entity
// label, or an identity with exactly these labels), else a placeholder.
func peerFor(labels []string, universe Universe) Peer {
	key := strings.Join(sortedCopy(labels), ";")
	for _, p := range universe {
		if strings.Join(sortedCopy(p.Labels), ";") == key {
			return p
		}
	}
	return Peer{ID: traceIdentity, Labels: labels}
}

func sortedCopy(in []string) []string {
	out := append([]string(nil), in...)
	for i := 1; i < len(out); i++ {
		for j := i; j > 0 && out[j] < out[j-1]; j-- {
			out[j], out[j-1] = out[j-1], out[j]
		}
	}
	return out
}

// Trace explains whether src may send dst a packet of proto to port:
// src's egress policy, then dst's ingress policy, as the datapath applies
// them (enforcement per the default mode).
func (r *Repository) Trace(src, dst []string, proto uint8, port uint16, universe Universe) TraceResult {
	srcPeer, dstPeer := peerFor(src, universe), peerFor(dst, universe)
	u := append(Universe{}, universe...)
	if srcPeer.ID == traceIdentity {
		u = append(u, srcPeer)
	}
	if dstPeer.ID == traceIdentity {
		dstPeer.ID = traceIdentity - 1
		u = append(u, dstPeer)
	}
	var res TraceResult
	line := func(format string, args ...any) { res.Lines = append(res.Lines, fmt.Sprintf(format, args...)) }
	line("Tracing %s → %s, protocol %d port %d", strings.Join(src, ","), strings.Join(dst, ","), proto, port)
	stored, _ := r.Rules(nil)
	byID := make(map[uint32]StoredRule, len(stored))
	for _, s := range stored {
		byID[s.ID] = s
	}

	eg := r.Resolve(Endpoint{Labels: src, NamedPorts: srcPeer.NamedPorts}, u)
	res.Egress = TraceVerdict{Enforced: eg.EnforceEgress, Rules: eg.Rules, Allowed: true}
	if eg.EnforceEgress {
		res.Egress.Allowed, res.Egress.Cookie = eg.MapState.Allowed(Egress, dstPeer.ID, proto, port)
		res.Egress.L7 = traceL7(eg.Rules, byID, true, dstPeer, proto, port)
		line("Egress of the source: selected by %s", describeRules(eg.Rules, byID))
		line("Egress of the source: %s", decision(res.Egress, byID))
	} else {
		line("Egress of the source: no rule selects it in this direction: allowed")
	}
	in := r.Resolve(Endpoint{Labels: dst, NamedPorts: dstPeer.NamedPorts}, u)
	res.Ingress = TraceVerdict{Enforced: in.EnforceIngress, Rules: in.Rules, Allowed: true}
	if in.EnforceIngress {
		res.Ingress.Allowed, res.Ingress.Cookie = in.MapState.Allowed(Ingress, srcPeer.ID, proto, port)
		res.Ingress.L7 = traceL7(in.Rules, byID, false, srcPeer, proto, port)
		line("Ingress of the destination: selected by %s", describeRules(in.Rules, byID))
		line("Ingress of the destination: %s", decision(res.Ingress, byID))
	} else {
		line("Ingress of the destination: no rule selects it in this direction: allowed")
	}
	res.Allowed = res.Egress.Allowed && res.Ingress.Allowed
	line("Final verdict: %s", strings.ToUpper(verdictWord(res.Allowed)))
	return res
}

// decision words one direction's verdict with the rule behind it, and the
// L7 rules the proxies apply on top of an L4 allow.
func decision(v TraceVerdict, byID map[uint32]StoredRule) string {
	var out string
	switch {
	case v.Cookie == 0 && v.Allowed:
		out = "allowed"
	case v.Cookie == 0:
		out = "denied by default deny (no selecting rule allows it)"
	default:
		out = fmt.Sprintf("%s by %s", verdictWord(v.Allowed), describeRule(v.Cookie, byID))
	}
	if len(v.L7) == 0 {
		return out
	}
	if v.Allowed {
		return out + ", L7: " + describeL7(v.L7)
	}
	if v.Cookie == 0 {
		// Not a deny rule: the port's only allow carries HTTP rules,
		// which the datapath opens only through the L7 proxy.
		return out + "; the port's L7 rules, " + describeL7(v.L7) + ", allow it only through the L7 proxy"
	}
	return out
}

// traceL7 collects, from the rules in ids, the L7 rules of the sections of
// one direction that select peer and cover proto/port.
func traceL7(ids []uint32, byID map[uint32]StoredRule, egress bool, peer Peer, proto uint8, port uint16) []TraceL7 {
	var out []TraceL7
	for _, id := range ids {
		s, ok := byID[id]
		if !ok {
			continue
		}
		var secs []section
		if egress {
			for _, e := range s.Rule.Egress {
				secs = append(secs, egressSection(e))
			}
		} else {
			for _, in := range s.Rule.Ingress {
				secs = append(secs, ingressSection(in))
			}
		}
		l7 := TraceL7{Rule: id}
		for _, sec := range secs {
			if !sec.wildcard() && !sec.peerMatches(peer, s.Namespace) {
				continue
			}
			for _, pr := range sec.ports {
				if pr.Rules == nil || !portRuleCovers(pr, proto, port) {
					continue
				}
				for _, d := range pr.Rules.DNS {
					name := d.MatchName
					if name == "" {
						name = d.MatchPattern
					}
					l7.DNS = append(l7.DNS, api.NormalizeName(name))
				}
				for _, h := range pr.Rules.HTTP {
					l7.HTTP = append(l7.HTTP, describeHTTP(h))
				}
			}
		}
		if len(l7.DNS)+len(l7.HTTP) > 0 {
			out = append(out, l7)
		}
	}
	return out
}

// portRuleCovers reports whether one of pr's numbered ports (L7 rules are
// never on named ports) covers proto/port.
func portRuleCovers(pr api.PortRule, proto uint8, port uint16) bool {
	for _, pp := range pr.Ports {
		protos, from, to, err := pp.Parse()
		if err != nil || !slices.Contains(protos, proto) {
			continue
		}
		if from == 0 || (port >= from && port <= max(from, to)) {
			return true
		}
	}
	return false
}

// describeHTTP words an HTTP rule as the request it allows: "GET
// /healthz", an unset method or path as "any".
func describeHTTP(h api.PortRuleHTTP) string {
	method, path := h.Method, h.Path
	if method == "" {
		method = "any method"
	}
	if path == "" {
		path = "any path"
	}
	out := method + " " + path
	if h.Host != "" {
		out += " host " + h.Host
	}
	for _, hd := range h.Headers {
		out += " header " + strconv.Quote(hd)
	}
	return out
}

// describeL7 words the L7 rules: "DNS names a.example, *.example (rule
// 3)", "HTTP GET /healthz or POST /api (rule 4)".
func describeL7(l7 []TraceL7) string {
	parts := make([]string, 0, len(l7))
	for _, r := range l7 {
		var kinds []string
		if len(r.DNS) > 0 {
			kinds = append(kinds, "DNS names "+strings.Join(r.DNS, ", "))
		}
		if len(r.HTTP) > 0 {
			kinds = append(kinds, "HTTP "+strings.Join(r.HTTP, " or "))
		}
		parts = append(parts, fmt.Sprintf("%s (rule %d)", strings.Join(kinds, "; "), r.Rule))
	}
	return strings.Join(parts, "; ")
}

// describeRules names rules by ID, source and labels, so a trace shows
// which policy object (a NetworkPolicy, an API import) decided.
func describeRules(ids []uint32, byID map[uint32]StoredRule) string {
	parts := make([]string, 0, len(ids))
	for _, id := range ids {
		parts = append(parts, describeRule(id, byID))
	}
	return strings.Join(parts, "; ")
}

func describeRule(id uint32, byID map[uint32]StoredRule) string {
	s, ok := byID[id]
	if !ok {
		return fmt.Sprintf("rule %d", id)
	}
	out := fmt.Sprintf("rule %d", id)
	if s.Source != "" {
		out += " (" + s.Source + ")"
	}
	if len(s.Rule.Labels) > 0 {
		out += " [" + strings.Join(sortedCopy(s.Rule.Labels.Strings()), " ") + "]"
	}
	return out
}

func verdictWord(allowed bool) string {
	if allowed {
		return "allowed"
	}
	return "denied"
}
