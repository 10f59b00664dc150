package labels

import (
	"fmt"
	"iter"
	"slices"
	"strings"
)

// Labels is a set of labels with at most one value per source and key,
// sorted by string form, so that equal sets have equal string forms. The
// zero value is the empty set. A Labels is never modified after it is
// built: methods that change a set return a new one.
type Labels struct {
	list []Label
}

// FromLabels builds a set. The same label given twice counts once; two
// values for one source and key are an error, since an identity cannot
// carry both.
func FromLabels(ls ...Label) (Labels, error) {
	list := make([]Label, 0, len(ls))
	for _, l := range ls {
		if err := l.validate(); err != nil {
			return Labels{}, err
		}
		list = append(list, l)
	}
	return fromValid(list)
}

// fromValid sorts valid labels and checks them for conflicts; it owns list.
func fromValid(list []Label) (Labels, error) {
	slices.SortFunc(list, compareLabels)
	list = slices.Compact(list)
	for i := 1; i < len(list); i++ {
		if list[i].Source == list[i-1].Source && list[i].Key == list[i-1].Key {
			return Labels{}, fmt.Errorf("labels %q and %q: two values for one key", list[i-1], list[i])
		}
	}
	return Labels{list: list}, nil
}

// compareLabels orders labels by their string form: the order of the set's
// string and key forms (and of sort.Strings over them).
func compareLabels(a, b Label) int {
	return strings.Compare(a.String(), b.String())
}

// FromStrings parses each string with Parse and builds a set.
func FromStrings(ss []string) (Labels, error) {
	list := make([]Label, 0, len(ss))
	for _, s := range ss {
		l, err := Parse(s)
		if err != nil {
			return Labels{}, err
		}
		list = append(list, l)
	}
	return fromValid(list)
}

// ParseSet reads the String form of a set: labels separated by commas
// (spaces around them are ignored). The empty string is the empty set.
func ParseSet(s string) (Labels, error) {
	if strings.TrimSpace(s) == "" {
		return Labels{}, nil
	}
	parts := strings.Split(s, ",")
	for i := range parts {
		parts[i] = strings.TrimSpace(parts[i])
	}
	return FromStrings(parts)
}

// FromK8s converts a Kubernetes label map to k8s-source labels.
func FromK8s(m map[string]string) (Labels, error) {
	list := make([]Label, 0, len(m))
	for k, v := range m {
		l := Label{Source: SourceK8s, Key: k, Value: v}
		if err := l.validate(); err != nil {
			return Labels{}, fmt.Errorf("kubernetes label %q: %w", k, err)
		}
		list = append(list, l)
	}
	return fromValid(list)
}

// Pod is what a pod's identity labels are made of.
type Pod struct {
	Namespace      string
	ServiceAccount string
	// Cluster is the cluster name; empty leaves the label out.
	Cluster string
	// Labels are the pod's own labels.
	Labels map[string]string
	// NamespaceLabels are the labels of the pod's namespace.
	NamespaceLabels map[string]string
}

// PodLabels returns a pod's labels, all of source k8s: its own, its
// namespace's (prefixed with KeyNamespaceLabelsPrefix), its namespace, its
// service account and its cluster. The derived keys win over a pod label
// with the same key, so that a pod cannot claim another namespace.
func PodLabels(p Pod) (Labels, error) {
	byKey := make(map[string]string, len(p.Labels)+len(p.NamespaceLabels)+3)
	for k, v := range p.Labels {
		byKey[k] = v
	}
	for k, v := range p.NamespaceLabels {
		byKey[KeyNamespaceLabelsPrefix+k] = v
	}
	if p.Namespace != "" {
		byKey[KeyPodNamespace] = p.Namespace
	}
	if p.ServiceAccount != "" {
		byKey[KeyServiceAccount] = p.ServiceAccount
	}
	if p.Cluster != "" {
		byKey[KeyCluster] = p.Cluster
	}
	ls, err := FromK8s(byKey)
	if err != nil {
		return Labels{}, fmt.Errorf("pod labels in namespace %q: %w", p.Namespace, err)
	}
	return ls, nil
}

// Len is the number of labels.
func (s Labels) Len() int { return len(s.list) }

// All yields the labels in order.
func (s Labels) All() iter.Seq[Label] { return slices.Values(s.list) }

// Slice returns a copy of the labels in order.
func (s Labels) Slice() []Label { return slices.Clone(s.list) }

// Strings returns the labels' string forms in order.
func (s Labels) Strings() []string {
	out := make([]string, len(s.list))
	for i, l := range s.list {
		out[i] = l.String()
	}
	return out
}

// String is the labels' string forms joined by commas (ParseSet reads it
// back): "k8s:app=web,k8s:io.kubernetes.pod.namespace=default".
func (s Labels) String() string { return strings.Join(s.Strings(), ",") }

// Key is a stable map key for the set: the sorted string forms joined by
// ';', the same string identity.LabelsKey makes of s.Strings().
func (s Labels) Key() string { return strings.Join(s.Strings(), ";") }

// Equal reports whether both sets hold the same labels.
func (s Labels) Equal(o Labels) bool { return slices.Equal(s.list, o.list) }

// Has reports whether a label of the set matches sel (see Label.Matches:
// a selector of source any matches the key in any source).
func (s Labels) Has(sel Label) bool {
	return slices.ContainsFunc(s.list, func(l Label) bool { return l.Matches(sel) })
}

// Get returns the value of key in source; with SourceAny, the first one
// found in any source.
func (s Labels) Get(source, key string) (string, bool) {
	for _, l := range s.list {
		if l.Key == key && (source == SourceAny || l.Source == source) {
			return l.Value, true
		}
	}
	return "", false
}

// Merge returns s with o's labels added; o's value wins where both have the
// same source and key.
func (s Labels) Merge(o Labels) Labels {
	type sourceKey struct{ source, key string }
	inO := make(map[sourceKey]bool, len(o.list))
	list := make([]Label, 0, len(s.list)+len(o.list))
	for _, l := range o.list {
		inO[sourceKey{l.Source, l.Key}] = true
		list = append(list, l)
	}
	for _, l := range s.list {
		if !inO[sourceKey{l.Source, l.Key}] {
			list = append(list, l)
		}
	}
	out, err := fromValid(list)
	if err != nil {
		// Unreachable: both sets are valid and o's keys were taken out of s.
		panic(fmt.Sprintf("merge labels: %v", err))
	}
	return out
}

// filter returns the labels for which keep is true.
func (s Labels) filter(keep func(Label) bool) Labels {
	var list []Label
	for _, l := range s.list {
		if keep(l) {
			list = append(list, l)
		}
	}
	return Labels{list: list}
}
