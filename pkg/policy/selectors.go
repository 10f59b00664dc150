package policy

import (
	"encoding/json"
	"fmt"

	"github.com/tendril-net/tendril/pkg/identity"
	"github.com/tendril-net/tendril/pkg/policy/api"
)

// PeerSelector is one peer selector of a rule (an endpoint selector, an
// entity or a CIDR) in a form that can list what it selects.
type PeerSelector struct {
	String string
	sec    section
	ns     string
}

// Select lists the identities of universe the selector selects; "all" is
// identity 0.
func (p PeerSelector) Select(universe Universe) []identity.NumericIdentity {
	if p.sec.wildcard() {
		return []identity.NumericIdentity{0}
	}
	var out []identity.NumericIdentity
	for _, peer := range universe {
		if p.sec.peerMatches(peer, p.ns) {
			out = append(out, peer.ID)
		}
	}
	return out
}

// PeerSelectors returns every peer selector of a rule, one per selector.
func PeerSelectors(s StoredRule) []PeerSelector {
	var out []PeerSelector
	addSec := func(sec section) {
		for _, e := range sec.endpoints {
			sel := withNamespace(e, s.Namespace)
			b, _ := json.Marshal(sel)
			out = append(out, PeerSelector{String: "endpoints:" + string(b), sec: section{endpoints: []api.EndpointSelector{e}}, ns: s.Namespace})
		}
		for _, e := range sec.entities {
			out = append(out, PeerSelector{String: "entity:" + e, sec: section{entities: []string{e}}, ns: s.Namespace})
		}
		for _, c := range sec.cidrs {
			out = append(out, PeerSelector{String: "cidr:" + c, sec: section{cidrs: []string{c}}})
		}
		for _, c := range sec.cidrSets {
			out = append(out, PeerSelector{String: fmt.Sprintf("cidr:%s except %v", c.CIDR, c.Except), sec: section{cidrSets: []api.CIDRRule{c}}})
		}
		for _, f := range sec.fqdns {
			out = append(out, PeerSelector{String: "fqdn:" + f.String(), sec: section{fqdns: []api.FQDNSelector{f}}})
		}
	}
	for _, in := range append(append([]api.IngressRule(nil), s.Rule.Ingress...), s.Rule.IngressDeny...) {
		addSec(ingressSection(in))
	}
	for _, eg := range append(append([]api.EgressRule(nil), s.Rule.Egress...), s.Rule.EgressDeny...) {
		addSec(egressSection(eg))
	}
	return out
}
