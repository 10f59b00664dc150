package ui

import (
	"strings"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

func TestPolicyViewOfBackend(t *testing.T) {
	flows := demoFlows(t, time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC), 3)
	v, err := BuildPolicyView(flows, "demo/backend")
	if err != nil {
		t.Fatal(err)
	}
	if v.Labels["app"] != "backend" || len(v.Labels) != 1 {
		t.Errorf("labels %v", v.Labels)
	}
	if len(v.Policies) != 1 || v.Policies[0].Name != "demo/allow-frontend" ||
		v.Policies[0].Verdicts["FORWARDED"] != 3 || v.Policies[0].Verdicts["DROPPED"] != 6 {
		t.Errorf("policies %+v", v.Policies)
	}
	// The suggestion admits what was forwarded (the frontend, and other's
	// egress trace seen before the drop is not a connection that reached
	// the backend), not the drops.
	docs := strings.Split(v.Suggested, "\n---\n")
	if len(docs) != 2 {
		t.Fatalf("suggested:\n%s", v.Suggested)
	}
	var np networkingv1.NetworkPolicy
	if err := utilyaml.Unmarshal([]byte(docs[1]), &np); err != nil {
		t.Fatalf("suggested policy does not parse: %v\n%s", err, docs[1])
	}
	if np.Namespace != "demo" || np.Spec.PodSelector.MatchLabels["app"] != "backend" {
		t.Errorf("suggested policy selects %v in %q", np.Spec.PodSelector, np.Namespace)
	}
	var from []string
	for _, r := range np.Spec.Ingress {
		for _, p := range r.From {
			if p.PodSelector != nil {
				from = append(from, p.PodSelector.MatchLabels["app"])
			}
		}
	}
	if strings.Join(from, ",") != "frontend" {
		t.Errorf("suggested ingress from %v, want the frontend only:\n%s", from, docs[1])
	}

	if _, err := BuildPolicyView(flows, "demo/nosuch"); err == nil {
		t.Error("a workload without flows: no error")
	}
	if _, err := BuildPolicyView(flows, "backend"); err == nil || !strings.Contains(err.Error(), "namespace/name") {
		t.Errorf("a workload without namespace: %v", err)
	}
}
