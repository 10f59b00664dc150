package policy

import (
	"fmt"
	"net/netip"
	"sort"
	"sync"

	"github.com/tendril-net/tendril/pkg/labels"
	"github.com/tendril-net/tendril/pkg/policy/api"
)

// StoredRule is a rule in the repository.
type StoredRule struct {
	// ID is the rule's cookie in the datapath's verdict events.
	ID   uint32
	Rule *api.Rule
	// Namespace is set for namespaced policies: the rule selects only
	// endpoints of that namespace, and its peers default to it.
	Namespace string
	// Source names where the rule came from (api, k8s NetworkPolicy ns/name,
	// TendrilNetworkPolicy ns/name).
	Source string
}

// Repository holds the rules. Every change bumps the revision.
//
// Listeners are called after a change is complete and the lock released,
// once per revision and in revision order: a change takes its revision
// under the lock, and its listeners wait, outside the lock, for those of
// the previous revision to return. Listeners may read the repository (it
// may be at a later revision by then) but must not change it, and must be
// quick: the change's caller waits for them.
type Repository struct {
	mu        sync.RWMutex
	rules     []StoredRule
	revision  uint64
	nextID    uint32
	listeners []func(revision uint64)

	// notifyMu guards notified, the last revision whose listeners have
	// returned; notifyDone signals when it moves.
	notifyMu   sync.Mutex
	notifyDone *sync.Cond
	notified   uint64

	// allowLocalhost: see SetAllowLocalhost.
	allowLocalhost bool
}

// NewRepository returns an empty repository at revision 1.
func NewRepository() *Repository {
	r := &Repository{revision: 1, nextID: 1, notified: 1}
	r.notifyDone = sync.NewCond(&r.notifyMu)
	return r
}

// Subscribe calls fn after each change, with the change's revision (see
// Repository for the order and what fn may do).
func (r *Repository) Subscribe(fn func(revision uint64)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.listeners = append(r.listeners, fn)
}

// change runs fn under the write lock; when fn reports a change, the
// revision is bumped and the listeners are called after the lock is
// released, in revision order. It returns the revision after fn.
func (r *Repository) change(fn func() (changed bool)) uint64 {
	r.mu.Lock()
	if !fn() {
		rev := r.revision
		r.mu.Unlock()
		return rev
	}
	r.revision++
	rev := r.revision
	listeners := append(([]func(uint64))(nil), r.listeners...)
	r.mu.Unlock()
	r.notify(rev, listeners)
	return rev
}

// notify calls the listeners of revision rev once those of every earlier
// revision have returned.
func (r *Repository) notify(rev uint64, listeners []func(uint64)) {
	r.notifyMu.Lock()
	for r.notified != rev-1 {
		r.notifyDone.Wait()
	}
	r.notifyMu.Unlock()
	// Until notified moves on, only this revision's turn is open: its
	// listeners run with no lock held, so they may read the repository.
	for _, fn := range listeners {
		fn(rev)
	}
	r.notifyMu.Lock()
	r.notified = rev
	r.notifyDone.Broadcast()
	r.notifyMu.Unlock()
}

// Add validates and adds rules; with replace, rules carrying the same label
// set as an added rule are removed first. Nothing changes when a rule is
// invalid.
func (r *Repository) Add(rules api.Rules, namespace, source string, replace bool) (uint64, error) {
	for i, rule := range rules {
		if err := validateRule(rule, namespace); err != nil {
			return 0, fmt.Errorf("rule %d: %w", i, err)
		}
	}
	return r.change(func() bool {
		if replace {
			keys := map[string]bool{}
			for _, rule := range rules {
				keys[rule.Labels.Key()] = true
			}
			r.removeLocked(func(s StoredRule) bool { return keys[s.Rule.Labels.Key()] })
		}
		r.appendLocked(rules, namespace, source)
		return true
	}), nil
}

// validateRule checks a rule and that it may live in namespace (host
// policies only cluster-wide).
func validateRule(rule *api.Rule, namespace string) error {
	if rule == nil {
		return fmt.Errorf("rule is nil")
	}
	if err := rule.Validate(); err != nil {
		return err
	}
	return rule.ValidateScope(namespace)
}

// ReplaceSource replaces every rule of a source (a Kubernetes object) with
// rules; no rules deletes them.
func (r *Repository) ReplaceSource(source, namespace string, rules api.Rules) (uint64, error) {
	for i, rule := range rules {
		if err := validateRule(rule, namespace); err != nil {
			return 0, fmt.Errorf("%s rule %d: %w", source, i, err)
		}
	}
	return r.change(func() bool {
		r.removeLocked(func(s StoredRule) bool { return s.Source == source })
		r.appendLocked(rules, namespace, source)
		return true
	}), nil
}

// ReplaceByLabels atomically removes every rule carrying all of match and
// adds rules (one revision): what a changed Kubernetes object needs, so no
// resolution sees the object's old rules gone and its new ones missing.
// match must not be empty (that would replace every rule).
func (r *Repository) ReplaceByLabels(match []labels.Label, rules api.Rules, namespace, source string) (uint64, error) {
	if len(match) == 0 {
		return 0, fmt.Errorf("replace rules of %s: no labels to match", source)
	}
	for i, rule := range rules {
		if err := validateRule(rule, namespace); err != nil {
			return 0, fmt.Errorf("%s rule %d: %w", source, i, err)
		}
	}
	return r.change(func() bool {
		r.removeLocked(func(s StoredRule) bool { return s.Rule.Labels.HasAll(match) })
		r.appendLocked(rules, namespace, source)
		return true
	}), nil
}

// Import validates rules and, in one revision, removes the rules they
// replace and adds them: with replaceSame, every rule carrying the label
// set of an added rule; with replaceMatching (when not empty), every rule
// carrying all of those labels. What PUT /v1/policy with replace or
// replace-with-labels needs: a delete and an add as two revisions would let
// an endpoint selected only by the old rules be resolved (and the policy
// file be written) with neither. Nothing changes when a rule is invalid.
func (r *Repository) Import(rules api.Rules, namespace, source string, replaceSame bool, replaceMatching []labels.Label) (uint64, error) {
	for i, rule := range rules {
		if err := validateRule(rule, namespace); err != nil {
			return 0, fmt.Errorf("rule %d: %w", i, err)
		}
	}
	same := map[string]bool{}
	if replaceSame {
		for _, rule := range rules {
			same[rule.Labels.Key()] = true
		}
	}
	return r.change(func() bool {
		r.removeLocked(func(s StoredRule) bool {
			return same[s.Rule.Labels.Key()] || (len(replaceMatching) > 0 && s.Rule.Labels.HasAll(replaceMatching))
		})
		r.appendLocked(rules, namespace, source)
		return true
	}), nil
}

// DeleteByLabels removes the rules that have a match for every label of
// sel (all rules when sel is empty; see api.LabelArray.HasAll) and returns
// how many went.
func (r *Repository) DeleteByLabels(sel []labels.Label) (uint64, int) {
	n := 0
	rev := r.change(func() bool {
		n = r.removeLocked(func(s StoredRule) bool { return s.Rule.Labels.HasAll(sel) })
		return n > 0
	})
	return rev, n
}

// removeLocked drops the rules for which drop is true and returns how many
// went; r.mu must be held for writing.
func (r *Repository) removeLocked(drop func(StoredRule) bool) int {
	kept := r.rules[:0:0]
	for _, s := range r.rules {
		if !drop(s) {
			kept = append(kept, s)
		}
	}
	n := len(r.rules) - len(kept)
	r.rules = kept
	return n
}

// appendLocked stores rules with fresh IDs; r.mu must be held for writing.
func (r *Repository) appendLocked(rules api.Rules, namespace, source string) {
	for _, rule := range rules {
		r.rules = append(r.rules, StoredRule{ID: r.nextID, Rule: rule, Namespace: namespace, Source: source})
		r.nextID++
	}
}

// Rules returns the rules (only those with a match for every label of sel,
// when given) and the revision.
func (r *Repository) Rules(sel []labels.Label) ([]StoredRule, uint64) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	var out []StoredRule
	for _, s := range r.rules {
		if s.Rule.Labels.HasAll(sel) {
			out = append(out, s)
		}
	}
	return out, r.revision
}

// Revision returns the current revision.
func (r *Repository) Revision() uint64 {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.revision
}

// CIDRPrefixes returns every prefix the rules' CIDR selectors need in the
// ipcache (CIDRs and their exceptions), so the agent can give each a
// node-local identity.
func (r *Repository) CIDRPrefixes() []netip.Prefix {
	r.mu.RLock()
	defer r.mu.RUnlock()
	seen := map[netip.Prefix]bool{}
	add := func(s string) {
		if p, err := api.ParseCIDR(s); err == nil {
			seen[p] = true
		}
	}
	for _, s := range r.rules {
		for _, in := range append(append([]api.IngressRule(nil), s.Rule.Ingress...), s.Rule.IngressDeny...) {
			for _, c := range in.FromCIDR {
				add(c)
			}
			for _, c := range in.FromCIDRSet {
				add(c.CIDR)
				for _, e := range c.Except {
					add(e)
				}
			}
		}
		for _, eg := range append(append([]api.EgressRule(nil), s.Rule.Egress...), s.Rule.EgressDeny...) {
			for _, c := range eg.ToCIDR {
				add(c)
			}
			for _, c := range eg.ToCIDRSet {
				add(c.CIDR)
				for _, e := range c.Except {
					add(e)
				}
			}
		}
	}
	out := make([]netip.Prefix, 0, len(seen))
	for p := range seen {
		out = append(out, p)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].String() < out[j].String() })
	return out
}

// SetAllowLocalhost makes every endpoint under ingress policy admit its
// own node (identity host) on every port, unless a deny rule covers the
// flow (Cilium's --allow-localhost=always): the kubelet's probes come from
// the node. Set it before the first resolution.
func (r *Repository) SetAllowLocalhost(allow bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.allowLocalhost = allow
}
