// Package labels is the label model of identities: labels of the form
// source:key=value, sets of them with a stable string form and map key,
// conversion from Kubernetes label maps, and the filter that keeps only the
// identity-relevant labels of a workload.
package labels

import (
	"fmt"
	"strings"
)

// Sources say where a label comes from. A selector may use SourceAny to
// match a key from any source.
const (
	SourceK8s      = "k8s"
	SourceReserved = "reserved"
	SourceCIDR     = "cidr"
	SourceAny      = "any"
	SourceUnspec   = "unspec"
)

// IsKnownSource reports whether s is one of the sources above.
func IsKnownSource(s string) bool { return isKnownSource(s) }

// isKnownSource reports whether s is one of the sources above.
func isKnownSource(s string) bool {
	switch s {
	case SourceK8s, SourceReserved, SourceCIDR, SourceAny, SourceUnspec:
		return true
	}
	return false
}

// Keys that Tendril derives from a pod's context rather than its own labels.
const (
	// KeyPodNamespace carries the pod's namespace.
	KeyPodNamespace = "io.kubernetes.pod.namespace"
	// KeyNamespaceLabelsPrefix prefixes the labels of the pod's namespace.
	KeyNamespaceLabelsPrefix = "io.cilium.k8s.namespace.labels."
	// KeyServiceAccount carries the pod's service account.
	KeyServiceAccount = "io.cilium.k8s.policy.serviceaccount"
	// KeyCluster carries the name of the pod's cluster.
	KeyCluster = "io.cilium.k8s.policy.cluster"
)

// Label is one label. Value may be empty (reserved labels have none).
// Its JSON form is that of the labels of a CiliumNetworkPolicy rule:
// {"key": ..., "value": ..., "source": ...}.
type Label struct {
	// +optional
	Source string `json:"source"`
	Key    string `json:"key"`
	// +optional
	Value string `json:"value,omitempty"`
}

// New returns a label after checking it (see Parse for the rules).
func New(source, key, value string) (Label, error) {
	l := Label{Source: source, Key: key, Value: value}
	if err := l.validate(); err != nil {
		return Label{}, err
	}
	return l, nil
}

// validate enforces what keeps the string forms unambiguous: a known
// source, a non-empty key without '=', and no ',' or ';' anywhere, since
// those separate labels in the set forms (Kubernetes forbids all three in
// keys and values, so real labels never hit this).
func (l Label) validate() error {
	if !isKnownSource(l.Source) {
		return fmt.Errorf("label %q: unknown source %q", l.String(), l.Source)
	}
	if l.Key == "" {
		return fmt.Errorf("label %q: empty key", l.String())
	}
	if strings.Contains(l.Key, "=") {
		return fmt.Errorf("label %q: key contains '='", l.String())
	}
	if strings.ContainsAny(l.Key, ",;") || strings.ContainsAny(l.Value, ",;") {
		return fmt.Errorf("label %q: contains ',' or ';'", l.String())
	}
	return nil
}

// CheckString checks a label's string form as endpoints and identities
// carry it ("source:key=value", the form endpoint labels arrive in over the
// API): not empty, and without ',' or ';'. Those separate labels in a
// set's string form and in the key that names its identity (the kvstore
// master key's value, identity.LabelsKey): "k8s:app=a;k8s:role=admin" as
// one label would share the identity of the two labels app=a and
// role=admin, and read back as those two on every other node. Such labels
// are refused rather than escaped, so every key already written keeps its
// meaning.
func CheckString(s string) error {
	if s == "" {
		return fmt.Errorf("empty label")
	}
	if strings.ContainsAny(s, ",;") {
		return fmt.Errorf("label %q: contains ',' or ';', which separate labels", s)
	}
	return nil
}

// String is "source:key=value", or "source:key" without a value.
func (l Label) String() string {
	if l.Value == "" {
		return l.Source + ":" + l.Key
	}
	return l.Source + ":" + l.Key + "=" + l.Value
}

// Parse reads "source:key=value", "source:key", "key=value" or "key". The
// source is the text before the first ':' when that ':' comes before any
// '=' (so "app=a:b" is an unspec label with value "a:b", and a CIDR key such
// as "cidr:2001:db8::/32" keeps its colons); without one the source is
// unspec. The key ends at the first '='.
func Parse(s string) (Label, error) {
	source, rest := SourceUnspec, s
	colon, equals := strings.IndexByte(s, ':'), strings.IndexByte(s, '=')
	if colon >= 0 && (equals < 0 || colon < equals) {
		source, rest = s[:colon], s[colon+1:]
	}
	key, value, _ := strings.Cut(rest, "=")
	l := Label{Source: source, Key: key, Value: value}
	if err := l.validate(); err != nil {
		return Label{}, fmt.Errorf("parse label %q: %w", s, err)
	}
	return l, nil
}

// MustParse is Parse for constants in code and tests; it panics on error.
func MustParse(s string) Label {
	l, err := Parse(s)
	if err != nil {
		panic(err)
	}
	return l
}

// Matches reports whether l matches the selector label sel: same key and
// value, and the same source unless sel's source is any.
func (l Label) Matches(sel Label) bool {
	return l.Key == sel.Key && l.Value == sel.Value && (sel.Source == SourceAny || sel.Source == l.Source)
}
