package observed

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/tendril-net/tendril/pkg/identity"
	"github.com/tendril-net/tendril/pkg/policy"
	"github.com/tendril-net/tendril/pkg/policy/api"
)

// Change is a connection whose verdict the candidate policies change.
type Change struct {
	Connection
	// Before and After: whether the connection is admitted under the
	// current rules, and with the candidates.
	Before, After bool
}

// Evaluator decides connections with a rule set the way the datapath
// does: the source pod's egress and the destination pod's ingress, each
// where enforced, with pods' addresses inside a rule's CIDR carrying that
// prefix's in-cluster identity (exact ipBlock semantics), and traffic
// between a pod and its own node always admitted.
type Evaluator struct {
	repo     *policy.Repository
	universe policy.Universe
	cidrs    []policy.Peer // the world CIDR identities, one per prefix
	results  map[string]policy.Result
}

// NewEvaluator resolves with repo over the peers the connections name.
func NewEvaluator(repo *policy.Repository, conns []Connection) *Evaluator {
	e := &Evaluator{repo: repo, universe: policy.ReservedPeers(), results: map[string]policy.Result{}}
	seen := map[identity.NumericIdentity]bool{}
	for _, c := range conns {
		for _, p := range []Peer{c.Src, c.Dst} {
			if p.Kind != PeerPod || seen[p.Identity] {
				continue
			}
			seen[p.Identity] = true
			e.universe = append(e.universe, policy.Peer{ID: p.Identity, Labels: p.Labels})
		}
	}
	for i, pf := range repo.CIDRPrefixes() {
		id := identity.LocalScope | identity.NumericIdentity(i+1)
		p := policy.Peer{ID: id, Labels: []string{"cidr:" + pf.String()}, CIDR: pf}
		e.cidrs = append(e.cidrs, p)
		e.universe = append(e.universe, p, policy.Peer{ID: id | identity.InClusterCIDR, Labels: p.Labels, CIDR: pf})
	}
	return e
}

// longest is the identity of the longest rule prefix holding addr.
func (e *Evaluator) longest(addr netip.Addr) (identity.NumericIdentity, bool) {
	var best identity.NumericIdentity
	bits := -1
	for _, p := range e.cidrs {
		if p.CIDR.Contains(addr) && p.CIDR.Bits() > bits {
			best, bits = p.ID, p.CIDR.Bits()
		}
	}
	return best, bits >= 0
}

// peerIDs are the identities the datapath looks a peer up with: its own
// (a world address: its longest rule prefix's CIDR identity) and, for an
// in-cluster peer, the in-cluster identity of its longest rule prefix.
func (e *Evaluator) peerIDs(p Peer) (id, cidrID identity.NumericIdentity) {
	if p.Kind == PeerWorld {
		if c, ok := e.longest(p.IP.Unmap()); ok {
			return c, 0
		}
		return identity.World, 0
	}
	id = p.Identity
	if c, ok := e.longest(p.IP.Unmap()); ok {
		cidrID = c | identity.InClusterCIDR
	}
	return id, cidrID
}

func (e *Evaluator) resolve(p Peer) policy.Result {
	k := strings.Join(p.Labels, "\x00")
	if r, ok := e.results[k]; ok {
		return r
	}
	r := e.repo.Resolve(policy.Endpoint{Labels: p.Labels}, e.universe)
	e.results[k] = r
	return r
}

// Allowed reports whether c is admitted.
func (e *Evaluator) Allowed(c Connection) bool {
	if c.Src.Kind == PeerPod && c.Dst.Kind != PeerHost {
		if res := e.resolve(c.Src); res.EnforceEgress {
			id, cidr := e.peerIDs(c.Dst)
			if ok, _ := res.MapState.AllowedWithCIDR(policy.Egress, id, cidr, c.Proto, c.Port); !ok {
				return false
			}
		}
	}
	if c.Dst.Kind == PeerPod && c.Src.Kind != PeerHost {
		if res := e.resolve(c.Dst); res.EnforceIngress {
			id, cidr := e.peerIDs(c.Src)
			if ok, _ := res.MapState.AllowedWithCIDR(policy.Ingress, id, cidr, c.Proto, c.Port); !ok {
				return false
			}
		}
	}
	return true
}

// Candidate is a policy object to evaluate: its rules and how it is
// named, so that it replaces the current version of the same object.
type Candidate struct {
	// Match are the labels of the current rules it replaces (the object's
	// kind, namespace and name; empty: replaces nothing).
	Match     api.LabelArray
	Namespace string
	Source    string
	Rules     api.Rules
}

// Current are the rules a node enforces, as its API lists them: a rule
// derived from a namespaced object carries the namespace in a label.
func Current(rules api.Rules) (*policy.Repository, error) {
	repo := policy.NewRepository()
	bySource := map[string]api.Rules{}
	ns := map[string]string{}
	var order []string
	for _, r := range rules {
		src, rns := "api", ""
		for _, l := range r.Labels {
			if l.Key == "io.cilium.k8s.policy.namespace" {
				rns = l.Value
			}
		}
		if rns != "" {
			src = "k8s/" + rns
		}
		for _, l := range r.Labels {
			if l.Key == "io.cilium.k8s.policy.name" || l.Key == "io.cilium.k8s.policy.derived-from" {
				src += "/" + l.Value
			}
		}
		if _, ok := bySource[src]; !ok {
			order = append(order, src)
		}
		bySource[src] = append(bySource[src], r)
		ns[src] = rns
	}
	for _, src := range order {
		if _, err := repo.Add(bySource[src], ns[src], src, false); err != nil {
			return nil, fmt.Errorf("current rules of %s: %w", src, err)
		}
	}
	return repo, nil
}

// WhatIf adds the candidates to a copy of the current rules (each in place
// of the current version of its object) and returns the connections whose
// verdict changes, with both verdicts.
func WhatIf(current api.Rules, candidates []Candidate, conns []Connection) ([]Change, error) {
	before, err := Current(current)
	if err != nil {
		return nil, err
	}
	after, err := Current(current)
	if err != nil {
		return nil, err
	}
	for _, c := range candidates {
		if len(c.Match) > 0 {
			after.DeleteByLabels(c.Match)
		}
		if _, err := after.Add(c.Rules, c.Namespace, c.Source, false); err != nil {
			return nil, fmt.Errorf("candidate %s: %w", c.Source, err)
		}
	}
	eb, ea := NewEvaluator(before, conns), NewEvaluator(after, conns)
	var out []Change
	for _, c := range conns {
		b, a := eb.Allowed(c), ea.Allowed(c)
		if a != b {
			out = append(out, Change{Connection: c, Before: b, After: a})
		}
	}
	return out, nil
}

// Group is the changes between one source and one destination workload.
type Group struct {
	Src, Dst      string
	Before, After bool
	Ports         []string
	Connections   int
	Flows         int
}

// GroupChanges groups changes by source and destination workload and
// verdict change.
func GroupChanges(changes []Change) []Group {
	idx := map[string]int{}
	var out []Group
	for _, c := range changes {
		k := fmt.Sprintf("%s|%s|%v|%v", c.Src.Workload(), c.Dst.Workload(), c.Before, c.After)
		i, ok := idx[k]
		if !ok {
			i = len(out)
			idx[k] = i
			out = append(out, Group{Src: c.Src.Workload(), Dst: c.Dst.Workload(), Before: c.Before, After: c.After})
		}
		g := &out[i]
		port := fmt.Sprintf("%d/%s", c.Port, protoName(c.Proto))
		if !slices.Contains(g.Ports, port) {
			g.Ports = append(g.Ports, port)
		}
		g.Connections++
		g.Flows += c.Flows
	}
	return out
}
