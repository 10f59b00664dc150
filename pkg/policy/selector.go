// Package policy is the policy engine: a repository of rules with
// revisions, selector matching against identity labels, and the resolution
// of an endpoint's identity to its map state (identity × direction ×
// protocol/port → allow or deny, deny winning), realized in the BPF policy
// map by the agent.
package policy

import (
	"strings"

	"github.com/tendril-net/tendril/pkg/labels"
	"github.com/tendril-net/tendril/pkg/policy/api"
)

// NamespaceLabel is the label carrying a pod's namespace.
const NamespaceLabel = "k8s:io.kubernetes.pod.namespace"

// NamespaceLabelsPrefix prefixes the labels of a pod's namespace on the
// pod's identity ("k8s:io.cilium.k8s.namespace.labels.team=a" for a
// namespace labelled team=a), as Cilium names them, so that a selector can
// select pods by their namespace's labels. A namespaced rule's peer
// selector using them still defaults to the rule's namespace unless it
// also names NamespaceLabel (Cilium's rule for namespaced policies);
// Kubernetes NetworkPolicy namespaceSelectors always name it.
const NamespaceLabelsPrefix = "k8s:io.cilium.k8s.namespace.labels."

// labelSet indexes "source:key=value" labels by key, with and without the
// source.
type labelSet struct {
	bySourceKey map[string]string // "k8s:app" → value
	byKey       map[string][]string
}

func newLabelSet(labels []string) labelSet {
	s := labelSet{bySourceKey: map[string]string{}, byKey: map[string][]string{}}
	for _, l := range labels {
		kv, value, _ := strings.Cut(l, "=")
		source, key, ok := strings.Cut(kv, ":")
		if !ok {
			source, key = "unspec", kv
		}
		s.bySourceKey[source+":"+key] = value
		s.byKey[key] = append(s.byKey[key], value)
	}
	return s
}

// values returns the values of a selector key: "k8s:app" matches only that
// source, "app" (or "any:app") any source.
func (s labelSet) values(selKey string) []string {
	source, key, ok := strings.Cut(selKey, ":")
	if ok && source != "any" {
		if v, found := s.bySourceKey[source+":"+key]; found {
			return []string{v}
		}
		return nil
	}
	if ok {
		selKey = key
	}
	return s.byKey[selKey]
}

// namesNamespace reports whether a selector key is the namespace label's:
// the key exactly, with the k8s source (NamespaceLabel), any source, or
// none, as values matches them. Only the k8s-sourced label is the pod's
// namespace (Kubernetes pods cannot set it, see policy/k8s); a key that
// merely ends in it, or has another source, is a label like any other and
// must not lift a namespaced rule's peer out of its namespace.
func namesNamespace(selKey string) bool {
	source, key, ok := strings.Cut(selKey, ":")
	if !ok {
		source, key = labels.SourceAny, selKey
	}
	return key == labels.KeyPodNamespace && (source == labels.SourceK8s || source == labels.SourceAny)
}

func contains(vs []string, v string) bool {
	for _, x := range vs {
		if x == v {
			return true
		}
	}
	return false
}

// Matches reports whether the selector selects a label set. An empty
// selector selects everything.
func Matches(sel *api.EndpointSelector, labels []string) bool {
	if sel == nil {
		return false
	}
	return matchesSet(sel, newLabelSet(labels))
}

func matchesSet(sel *api.EndpointSelector, s labelSet) bool {
	for k, v := range sel.MatchLabels {
		if !contains(s.values(k), v) {
			return false
		}
	}
	for _, req := range sel.MatchExpressions {
		vs := s.values(req.Key)
		switch req.Operator {
		case "In":
			ok := false
			for _, v := range req.Values {
				ok = ok || contains(vs, v)
			}
			if !ok {
				return false
			}
		case "NotIn":
			for _, v := range req.Values {
				if contains(vs, v) {
					return false
				}
			}
		case "Exists":
			if len(vs) == 0 {
				return false
			}
		case "DoesNotExist":
			if len(vs) != 0 {
				return false
			}
		default:
			return false
		}
	}
	return true
}

// withNamespace returns sel restricted to namespace ns unless it names a
// namespace itself (as a namespaced policy's peers default to its
// namespace).
func withNamespace(sel api.EndpointSelector, ns string) api.EndpointSelector {
	if ns == "" {
		return sel
	}
	for k := range sel.MatchLabels {
		if namesNamespace(k) {
			return sel
		}
	}
	for _, r := range sel.MatchExpressions {
		if namesNamespace(r.Key) {
			return sel
		}
	}
	out := api.EndpointSelector{MatchLabels: map[string]string{NamespaceLabel: ns}, MatchExpressions: sel.MatchExpressions}
	for k, v := range sel.MatchLabels {
		out.MatchLabels[k] = v
	}
	return out
}
