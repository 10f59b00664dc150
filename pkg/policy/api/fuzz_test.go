package api

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"sigs.k8s.io/yaml"
)

// FuzzPolicyDocument: a policy document of any content, as JSON or as the
// YAML `tendril policy import` converts to JSON, is accepted whole or
// rejected whole; what is accepted encodes, parses again, and encodes the
// same (nothing of a rule is lost or changed on the way through the API
// and the policy file).
func FuzzPolicyDocument(f *testing.F) {
	files, _ := filepath.Glob("../../../examples/policies/*.json")
	for _, file := range files {
		if data, err := os.ReadFile(file); err == nil {
			f.Add(data)
		}
	}
	for _, s := range []string{
		`[{"endpointSelector":{},"ingress":[{"fromEndpoints":[{"matchLabels":{"app":"b"}}],"toPorts":[{"ports":[{"port":"80","endPort":90,"protocol":"TCP"}]}]}]}]`,
		`{"endpointSelector":{"matchExpressions":[{"key":"a","operator":"In","values":["x"]}]},"egressDeny":[{"toCIDRSet":[{"cidr":"10.0.0.0/8","except":["10.1.0.0/16"]}]}]}`,
		`[{"endpointSelector":{},"ingress":[{"icmps":[{"fields":[{"type":"EchoRequest","family":"IPv6"}]}]}]}]`,
		"endpointSelector:\n  matchLabels: {app: web}\ningress:\n- fromEntities: [world]\n  toPorts:\n  - ports: [{port: \"443\", protocol: TCP}]\n",
		"- endpointSelector: {}\n  egress:\n  - toCIDR: [192.0.2.0/24]\n",
		`[{"endpointSelector":{},"ingress":[{}]}] ]`,
		`[null]`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if j, err := yaml.YAMLToJSON(data); err == nil {
			checkDocument(t, j)
		}
		checkDocument(t, data)
	})
}

func checkDocument(t *testing.T, data []byte) {
	t.Helper()
	rules, err := ParseRules(data)
	if err != nil {
		if rules != nil {
			t.Fatalf("rejected document returned %d rules", len(rules))
		}
		return
	}
	first, err := json.Marshal(rules)
	if err != nil {
		t.Fatalf("accepted rules do not encode: %v", err)
	}
	again, err := ParseRules(first)
	if err != nil {
		t.Fatalf("accepted rules refused after a round trip: %v\n%s", err, first)
	}
	second, _ := json.Marshal(again)
	if !bytes.Equal(first, second) {
		t.Fatalf("rules change on a round trip:\n%s\n%s", first, second)
	}
}
