package k8s

import (
	"encoding/json"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"
	"sigs.k8s.io/yaml"

	"github.com/tendril-net/tendril/pkg/policy"
	"github.com/tendril-net/tendril/pkg/policy/api"
)

// FuzzTranslate: a NetworkPolicy of any content (a tenant writes it) is
// translated whole or rejected whole; what translates validates, survives
// a round trip through the policy API's JSON, and the repository takes
// and resolves it.
func FuzzTranslate(f *testing.F) {
	for _, s := range []string{`
metadata: {name: web, namespace: shop, uid: 0b7c}
spec:
  podSelector:
    matchLabels: {app: web}
    matchExpressions: [{key: tier, operator: NotIn, values: [canary]}]
  policyTypes: [Ingress, Egress]
  ingress:
  - from:
    - podSelector: {matchLabels: {app: lb}}
    - namespaceSelector: {matchLabels: {team: ops}}
      podSelector: {matchLabels: {app: prom}}
    - ipBlock: {cidr: 192.0.2.7/24, except: [192.0.2.128/25]}
    ports: [{port: 8080}, {port: metrics, protocol: TCP}, {protocol: UDP, port: 9000, endPort: 9100}]
  egress:
  - {}`, `
metadata: {name: deny, namespace: x}
spec: {podSelector: {}, policyTypes: [Ingress]}`, `
metadata: {name: dns, namespace: x}
spec:
  podSelector: {}
  egress: [{to: [{namespaceSelector: {}}], ports: [{port: 53, protocol: UDP}, {port: 53, protocol: SCTP}]}]`, `
metadata: {name: bad, namespace: x}
spec:
  podSelector: {matchExpressions: [{key: a, operator: Exists, values: [x]}]}
  ingress: [{from: [{ipBlock: {cidr: 10.0.0.0/8, except: [192.168.0.0/16]}}], ports: [{port: 70000}]}]`,
	} {
		j, err := yaml.YAMLToJSON([]byte(s))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(j)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var np networkingv1.NetworkPolicy
		if json.Unmarshal(data, &np) != nil {
			return
		}
		rules, err := Translate(&np)
		if err != nil {
			if rules != nil {
				t.Fatalf("rejected policy returned %d rules", len(rules))
			}
			return
		}
		for i, r := range rules {
			if err := r.Validate(); err != nil {
				t.Fatalf("translated rule %d does not validate: %v", i, err)
			}
		}
		enc, err := json.Marshal(rules)
		if err != nil {
			t.Fatalf("translated rules do not encode: %v", err)
		}
		if _, err := api.ParseRules(enc); err != nil {
			t.Fatalf("translated rules refused by the policy API: %v\n%s", err, enc)
		}
		repo := policy.NewRepository()
		if _, err := repo.Add(rules, "k8s", "fuzz", false); err != nil {
			t.Fatalf("translated rules refused by the repository: %v", err)
		}
		_ = repo.Resolve(policy.Endpoint{Labels: []string{"k8s:app=web", policy.NamespaceLabel + "=" + np.Namespace}}, nil)
	})
}
