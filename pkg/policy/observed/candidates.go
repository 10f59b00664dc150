package observed

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	networkingv1 "k8s.io/api/networking/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	v1alpha1 "github.com/tendril-net/tendril/pkg/k8s/apis/tendril.io/v1alpha1"
	"github.com/tendril-net/tendril/pkg/labels"
	"github.com/tendril-net/tendril/pkg/policy/api"
	policyk8s "github.com/tendril-net/tendril/pkg/policy/k8s"
)

// ParseCandidates reads candidate policies (NetworkPolicy,
// TendrilNetworkPolicy, TendrilClusterwideNetworkPolicy) from YAML or JSON
// documents, as `tendril policy whatif -f` and the UI's what-if take them.
func ParseCandidates(data []byte) ([]Candidate, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var out []Candidate
	for i := 0; ; i++ {
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			return nil, fmt.Errorf("document %d: %w", i+1, err)
		}
		if len(bytes.TrimSpace(raw)) == 0 || string(bytes.TrimSpace(raw)) == "null" {
			continue
		}
		var meta struct{ Kind string }
		if err := json.Unmarshal(raw, &meta); err != nil {
			return nil, fmt.Errorf("document %d: %w", i+1, err)
		}
		c, err := candidate(meta.Kind, raw)
		if err != nil {
			return nil, fmt.Errorf("document %d (%s): %w", i+1, meta.Kind, err)
		}
		out = append(out, c)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no policy in the file")
	}
	return out, nil
}

func candidate(kind string, raw []byte) (Candidate, error) {
	key := func(derived, ns, name string) api.LabelArray {
		l := api.LabelArray{{Source: labels.SourceK8s, Key: policyk8s.KeyPolicyDerivedFrom, Value: derived}, {Source: labels.SourceK8s, Key: policyk8s.KeyPolicyName, Value: name}}
		if ns != "" {
			l = append(l, labels.Label{Source: labels.SourceK8s, Key: policyk8s.KeyPolicyNamespace, Value: ns})
		}
		return l
	}
	switch kind {
	case "NetworkPolicy":
		var np networkingv1.NetworkPolicy
		if err := json.Unmarshal(raw, &np); err != nil {
			return Candidate{}, err
		}
		if np.Namespace == "" {
			np.Namespace = "default"
		}
		rules, err := policyk8s.Translate(&np)
		if err != nil {
			return Candidate{}, err
		}
		return Candidate{Match: policyk8s.KeyLabels(np.Namespace, np.Name), Namespace: np.Namespace, Source: policyk8s.Source(np.Namespace, np.Name), Rules: rules}, nil
	case "TendrilNetworkPolicy", "TendrilClusterwideNetworkPolicy":
		var obj v1alpha1.TendrilNetworkPolicy
		if err := json.Unmarshal(raw, &obj); err != nil {
			return Candidate{}, err
		}
		ns := obj.Namespace
		if kind == "TendrilNetworkPolicy" && ns == "" {
			ns = "default"
		}
		if kind == "TendrilClusterwideNetworkPolicy" {
			ns = ""
		}
		var rules api.Rules
		if obj.Spec != nil {
			rules = append(rules, obj.Spec)
		}
		rules = append(rules, obj.Specs...)
		if len(rules) == 0 {
			return Candidate{}, fmt.Errorf("%s %s has neither spec nor specs", kind, obj.Name)
		}
		return Candidate{Match: key(kind, ns, obj.Name), Namespace: ns, Source: kind + "/" + ns + "/" + obj.Name, Rules: rules}, nil
	}
	return Candidate{}, fmt.Errorf("kind %q: want NetworkPolicy, TendrilNetworkPolicy or TendrilClusterwideNetworkPolicy", kind)
}
