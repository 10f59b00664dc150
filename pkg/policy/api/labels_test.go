package api

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/tendril-net/tendril/pkg/labels"
)

func TestRuleLabelsReadBothForms(t *testing.T) {
	want := LabelArray{
		{Source: labels.SourceUnspec, Key: "team", Value: "blue"},
		{Source: labels.SourceK8s, Key: "io.cilium.k8s.policy.name", Value: "web"},
		{Source: labels.SourceUnspec, Key: "flag"},
	}
	for name, doc := range map[string]string{
		// What cilium-dbg sends, and CiliumNetworkPolicy specs hold.
		"objects": `[{"key":"team","value":"blue","source":"unspec"},{"key":"io.cilium.k8s.policy.name","value":"web","source":"k8s"},{"key":"flag","source":"unspec"}]`,
		// A missing source is unspec.
		"objects without source": `[{"key":"team","value":"blue"},{"key":"io.cilium.k8s.policy.name","value":"web","source":"k8s"},{"key":"flag"}]`,
		// The form Tendril stored rules in before.
		"strings": `["team=blue","k8s:io.cilium.k8s.policy.name=web","flag"]`,
		"mixed":   `["unspec:team=blue",{"key":"io.cilium.k8s.policy.name","value":"web","source":"k8s"},"flag"]`,
	} {
		t.Run(name, func(t *testing.T) {
			rules, err := ParseRules([]byte(`[{"endpointSelector":{},"labels":` + doc + `}]`))
			if err != nil {
				t.Fatal(err)
			}
			if got := rules[0].Labels; !reflect.DeepEqual(got, want) {
				t.Fatalf("labels = %#v, want %#v", got, want)
			}
			// Always written as objects, which read back the same.
			out, err := json.Marshal(rules[0].Labels)
			if err != nil {
				t.Fatal(err)
			}
			if wantJSON := `[{"source":"unspec","key":"team","value":"blue"},{"source":"k8s","key":"io.cilium.k8s.policy.name","value":"web"},{"source":"unspec","key":"flag"}]`; string(out) != wantJSON {
				t.Fatalf("written as %s, want %s", out, wantJSON)
			}
			var back LabelArray
			if err := json.Unmarshal(out, &back); err != nil || !reflect.DeepEqual(back, want) {
				t.Fatalf("read back %#v, %v", back, err)
			}
		})
	}
}

func TestRuleLabelsRefuseBadLabels(t *testing.T) {
	for doc, want := range map[string]string{
		`[{"value":"x","source":"k8s"}]`:               "empty key",
		`[{"key":"a","value":"x","origin":"k8s"}]`:     `unknown field "origin"`,
		`[{"key":"a","value":"x","source":"nowhere"}]`: `unknown source "nowhere"`,
		`[{"key":"a=b","source":"k8s"}]`:               "key contains '='",
		`[42]`:                                         "labels[0]",
		`["=x"]`:                                       "empty key",
		`{"key":"a"}`:                                  "want a list",
	} {
		_, err := ParseRules([]byte(`[{"endpointSelector":{},"labels":` + doc + `}]`))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("labels %s: error %v, want one saying %q", doc, err, want)
		}
	}
	// Rules built in code are checked too.
	r := Rule{EndpointSelector: &EndpointSelector{}, Labels: LabelArray{{Key: "no-source"}}}
	if err := r.Validate(); err == nil || !strings.Contains(err.Error(), "labels[0]") {
		t.Errorf("a label without source validated: %v", err)
	}
}

func TestSelectLabels(t *testing.T) {
	rule := LabelArray{
		{Source: labels.SourceUnspec, Key: "team", Value: "blue"},
		{Source: labels.SourceK8s, Key: "io.cilium.k8s.policy.name", Value: "web"},
		// Stored as a plain string with a prefix that is no source.
		{Source: labels.SourceUnspec, Key: "example.com:owner", Value: "me"},
	}
	for _, tt := range []struct {
		sel  []string
		want bool
	}{
		{nil, true},
		{[]string{"team=blue"}, true},        // no source: any
		{[]string{"unspec:team=blue"}, true}, // that source
		{[]string{"k8s:team=blue"}, false},   // another source
		{[]string{"any:team=blue"}, true},
		{[]string{"team=green"}, false},
		{[]string{"team"}, false}, // the value is part of the label
		{[]string{"team=blue", "k8s:io.cilium.k8s.policy.name=web"}, true},
		{[]string{"team=blue", "io.cilium.k8s.policy.name=other"}, false},
		{[]string{"example.com:owner=me"}, true},
	} {
		sel, err := ParseSelectLabels(tt.sel)
		if err != nil {
			t.Fatal(err)
		}
		if got := rule.HasAll(sel); got != tt.want {
			t.Errorf("select %v (%v): %v, want %v", tt.sel, sel, got, tt.want)
		}
	}
	if _, err := ParseSelectLabels([]string{"k8s:=x"}); err == nil {
		t.Error("a label without key parsed")
	}
	// Replace finds rules by their set of labels, whatever the order.
	a := LabelArray{{Source: "k8s", Key: "a", Value: "1"}, {Source: "unspec", Key: "b"}}
	b := LabelArray{{Source: "unspec", Key: "b"}, {Source: "k8s", Key: "a", Value: "1"}, {Source: "unspec", Key: "b"}}
	if a.Key() != b.Key() || a.Key() == (LabelArray{{Source: "unspec", Key: "a", Value: "1"}}).Key() {
		t.Errorf("keys %q, %q", a.Key(), b.Key())
	}
}
