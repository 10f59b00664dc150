package api

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/tendril-net/tendril/pkg/labels"
)

// LabelArray is the labels of a rule, in the CiliumNetworkPolicy form: a
// JSON list of {"key", "value", "source"} objects (a missing source is
// unspec). It also reads the string form "source:key=value" (or
// "key=value", source unspec) that rules were stored in before, element by
// element, so that older policy files and documents still load; it always
// writes objects.
type LabelArray []labels.Label

// UnmarshalJSON reads a list of label objects and/or label strings.
func (a *LabelArray) UnmarshalJSON(data []byte) error {
	var raw []json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		return fmt.Errorf("labels: want a list of {\"key\", \"value\", \"source\"} objects: %w", err)
	}
	if raw == nil {
		*a = nil
		return nil
	}
	out := make(LabelArray, 0, len(raw))
	for i, r := range raw {
		l, err := decodeLabel(r)
		if err != nil {
			return fmt.Errorf("labels[%d]: %w", i, err)
		}
		out = append(out, l)
	}
	*a = out
	return nil
}

// decodeLabel reads one label object, or one label string.
func decodeLabel(data json.RawMessage) (labels.Label, error) {
	data = bytes.TrimSpace(data)
	if len(data) > 0 && data[0] == '"' {
		var s string
		if err := json.Unmarshal(data, &s); err != nil {
			return labels.Label{}, err
		}
		return parseLabel(s, labels.SourceUnspec)
	}
	var l labels.Label
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&l); err != nil {
		return labels.Label{}, fmt.Errorf("want a {\"key\", \"value\", \"source\"} object or a \"source:key=value\" string: %w", err)
	}
	if l.Source == "" {
		l.Source = labels.SourceUnspec
	}
	return labels.New(l.Source, l.Key, l.Value)
}

// parseLabel reads the string form [source:]key[=value]. Without a source
// the label gets def. A prefix that is not a source pkg/labels knows stays
// part of the key, as it was when labels were plain strings.
func parseLabel(s, def string) (labels.Label, error) {
	l, err := labels.Parse(s)
	if err != nil {
		key, value, _ := strings.Cut(s, "=")
		prefix, _, hasPrefix := strings.Cut(key, ":")
		if !hasPrefix || labels.IsKnownSource(prefix) {
			return labels.Label{}, err
		}
		return labels.New(def, key, value)
	}
	if l.Source == labels.SourceUnspec && !strings.HasPrefix(s, labels.SourceUnspec+":") {
		l.Source = def
	}
	return l, nil
}

// ParseLabels reads labels in the string form; without a source a label is
// unspec.
func ParseLabels(ss []string) (LabelArray, error) {
	out := make(LabelArray, 0, len(ss))
	for _, s := range ss {
		l, err := parseLabel(s, labels.SourceUnspec)
		if err != nil {
			return nil, err
		}
		out = append(out, l)
	}
	return out, nil
}

// ParseSelectLabels reads the labels that select rules (the Labels body of
// GET and DELETE /v1/policy, as `cilium-dbg policy delete` sends them):
// "source:key=value" matches that source only, "key=value" any source.
func ParseSelectLabels(ss []string) ([]labels.Label, error) {
	out := make([]labels.Label, 0, len(ss))
	for _, s := range ss {
		l, err := parseLabel(s, labels.SourceAny)
		if err != nil {
			return nil, err
		}
		out = append(out, l)
	}
	return out, nil
}

// Has reports whether a label of a matches sel (labels.Label.Matches: a
// selector of source any matches every source).
func (a LabelArray) Has(sel labels.Label) bool {
	return slices.ContainsFunc(a, func(l labels.Label) bool { return l.Matches(sel) })
}

// HasAll reports whether a has a match for every label of sels; no sels
// match every rule.
func (a LabelArray) HasAll(sels []labels.Label) bool {
	for _, sel := range sels {
		if !a.Has(sel) {
			return false
		}
	}
	return true
}

// Strings returns the labels' string forms, in order.
func (a LabelArray) Strings() []string {
	out := make([]string, len(a))
	for i, l := range a {
		out[i] = l.String()
	}
	return out
}

// Key is the same string for the same set of labels, whatever their order
// or repetitions: how an import with replace finds the rules it replaces.
func (a LabelArray) Key() string {
	s := a.Strings()
	sort.Strings(s)
	return strings.Join(slices.Compact(s), ";")
}
