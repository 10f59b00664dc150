package policy

import (
	"fmt"
	"strings"

	"github.com/tendril-net/tendril/pkg/identity"
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
		line("Egress of the source: selected by %s", describeRules(eg.Rules, byID))
		line("Egress of the source: %s", decision(res.Egress, byID))
	} else {
		line("Egress of the source: no rule selects it in this direction: allowed")
	}
	in := r.Resolve(Endpoint{Labels: dst, NamedPorts: dstPeer.NamedPorts}, u)
	res.Ingress = TraceVerdict{Enforced: in.EnforceIngress, Rules: in.Rules, Allowed: true}
	if in.EnforceIngress {
		res.Ingress.Allowed, res.Ingress.Cookie = in.MapState.Allowed(Ingress, srcPeer.ID, proto, port)
		line("Ingress of the destination: selected by %s", describeRules(in.Rules, byID))
		line("Ingress of the destination: %s", decision(res.Ingress, byID))
	} else {
		line("Ingress of the destination: no rule selects it in this direction: allowed")
	}
	res.Allowed = res.Egress.Allowed && res.Ingress.Allowed
	line("Final verdict: %s", strings.ToUpper(verdictWord(res.Allowed)))
	return res
}

// decision words one direction's verdict with the rule behind it.
func decision(v TraceVerdict, byID map[uint32]StoredRule) string {
	if v.Cookie == 0 {
		if v.Allowed {
			return "allowed"
		}
		return "denied by default deny (no selecting rule allows it)"
	}
	return fmt.Sprintf("%s by %s", verdictWord(v.Allowed), describeRule(v.Cookie, byID))
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
