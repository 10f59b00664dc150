package cli

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/cilium/cilium/api/v1/models"

	"github.com/tendril-net/tendril/pkg/endpoint"
)

// TestPolicyRevisionColumn renders endpoints as the agent's API models
// them: realized against desired revision, and the last regeneration error
// while the endpoint has one.
func TestPolicyRevisionColumn(t *testing.T) {
	now := time.Now()
	ok := &endpoint.Endpoint{ID: 1, State: endpoint.StateReady, PolicyRevision: 5, DesiredPolicyRevision: 5}
	ok.RecordRegeneration(nil, now)
	failing := &endpoint.Endpoint{ID: 2, State: endpoint.StateNotReady, PolicyRevision: 4, DesiredPolicyRevision: 5}
	failing.RecordRegeneration(errors.New("update policy map: map full"), now)
	recovered := failing.Clone()
	recovered.PolicyRevision = 5
	recovered.RecordRegeneration(nil, now)
	noPolicy := &endpoint.Endpoint{ID: 3, State: endpoint.StateReady}
	for _, c := range []struct {
		ep   *endpoint.Endpoint
		want string
	}{
		{ok, "5/5"},
		{failing, "4/5 (error: update policy map: map full)"},
		{recovered, "5/5"},
		{noPolicy, "-"},
	} {
		if got := policyRevisionColumn(c.ep.Model(nil)); got != c.want {
			t.Errorf("endpoint %d: column %q, want %q", c.ep.ID, got, c.want)
		}
	}
	var out bytes.Buffer
	printEndpointTable(&out, []*models.Endpoint{ok.Model(nil), failing.Model(nil)})
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 3 || !strings.Contains(lines[0], "POLICY REV") || !strings.HasSuffix(lines[2], "4/5 (error: update policy map: map full)") {
		t.Fatalf("table:\n%s", out.String())
	}
}

// TestEndpointTableNamesTheHealthEndpoint: the node's health endpoint (no
// pod, labelled reserved:health, as the agent's API models it) is named
// in the POD column; a pod's endpoint keeps its pod's name.
func TestEndpointTableNamesTheHealthEndpoint(t *testing.T) {
	health := &endpoint.Endpoint{ID: 1, State: endpoint.StateReady, Identity: 4, Labels: []string{healthEndpointLabel}}
	pod := &endpoint.Endpoint{ID: 2, State: endpoint.StateReady, Identity: 9119, PodName: "pod-1", PodNamespace: "default", Labels: []string{"k8s:app=x"}}
	var out bytes.Buffer
	printEndpointTable(&out, []*models.Endpoint{health.Model(nil), pod.Model(nil)})
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 3 || !strings.Contains(lines[1], "(health endpoint)") || strings.Contains(lines[2], "health") {
		t.Fatalf("table:\n%s", out.String())
	}
}
