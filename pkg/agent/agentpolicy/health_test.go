package agentpolicy

import (
	"testing"

	"github.com/tendril-net/tendril/pkg/endpoint"
	"github.com/tendril-net/tendril/pkg/option"
)

// TestHealthEndpointNotEnforced: the node's health endpoint (its one label
// reserved:health, no pod) answers the other nodes' probes under every
// enforcement mode; a pod carrying the same label is enforced as any pod.
func TestHealthEndpointNotEnforced(t *testing.T) {
	m := newTestModule(t)
	m.runtime = option.NewRuntime(option.RuntimeValues{PolicyEnforcement: option.EnforcementAlways})
	health := &endpoint.Endpoint{ID: 7, Labels: []string{"reserved:health"}}
	if !IsHealthEndpoint(health) {
		t.Fatal("the health endpoint is not recognized")
	}
	if in, eg := m.Enforcement(health); in || eg {
		t.Fatalf("health endpoint enforced (ingress %v, egress %v) with enforcement always", in, eg)
	}
	pod := &endpoint.Endpoint{ID: 8, Labels: []string{"reserved:health"}, PodNamespace: "default", PodName: "p"}
	if IsHealthEndpoint(pod) {
		t.Fatal("a pod labelled reserved:health counts as the health endpoint")
	}
	if in, eg := m.Enforcement(pod); !in || !eg {
		t.Fatalf("pod not enforced (ingress %v, egress %v) with enforcement always", in, eg)
	}
}
