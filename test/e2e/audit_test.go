package e2e_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	flowpb "github.com/cilium/cilium/api/v1/flow"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/tendril-net/tendril/pkg/hubble/hubbletest"
	v1alpha1 "github.com/tendril-net/tendril/pkg/k8s/apis/tendril.io/v1alpha1"
)

const auditPolicyYAML = `
metadata: {name: server-audit}
spec:
  endpointSelector: {matchLabels: {app: server}}
  enforcementMode: audit
  ingress:
  - fromEndpoints: [{matchLabels: {app: client1}}]
    toPorts: [{ports: [{port: "80", protocol: TCP}]}]
`

// TestPrivilegedLabAuditedPolicy: a TendrilNetworkPolicy in audit mode
// lets what it would deny pass; those connections show with AUDIT verdicts
// naming the policy in the stock hubble CLI (through the relay) and in
// tendril observe, and the node's count in the policy's status and in the
// metrics matches the connections made. Switching to enforce is one field.
func TestPrivilegedLabAuditedPolicy(t *testing.T) {
	e := labUp(t)
	ctx := context.Background()
	const ns = "e2e-audit"
	e.createNamespace(t, ns)
	e.createPod(t, ns, "server", "node1", map[string]string{"app": "server"})
	e.createPod(t, ns, "client1", "node2", map[string]string{"app": "client1"})
	e.createPod(t, ns, "client2", "node1", map[string]string{"app": "client2"})
	server := e.waitReady(t, ns, "server").Status.PodIP + ":80"
	e.waitReady(t, ns, "client1")
	e.waitReady(t, ns, "client2")

	pol := &v1alpha1.TendrilNetworkPolicy{}
	if err := yaml.UnmarshalStrict([]byte(auditPolicyYAML), pol); err != nil {
		t.Fatal(err)
	}
	tnp := e.k8.Tendril.TendrilV1alpha1().TendrilNetworkPolicies(ns)
	if _, err := tnp.Create(ctx, pol, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "node1 enforcing the audited policy", func() (bool, error) {
		p, err := tnp.Get(ctx, "server-audit", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return p.Status.Nodes["node1"].Enforcing, fmt.Errorf("%+v", p.Status.Nodes)
	})
	// What the policy would deny passes: client2 (node1, local) five
	// times; client1 is admitted by the policy (not audited).
	const audited = 5
	for i := 0; i < audited; i++ {
		if c := probe(t, ns+"/client2", server, false); c != 0 {
			t.Fatalf("client2 -> server under an audited policy: exit %d, want 0", c)
		}
	}
	for i := 0; i < 2; i++ {
		if c := probe(t, ns+"/client1", server, false); c != 0 {
			t.Fatalf("client1 -> server: exit %d, want 0", c)
		}
	}

	// The stock hubble CLI through the relay: AUDIT verdicts naming the
	// policy, from client2 only.
	bin := hubbletest.HubbleCLI(t)
	relay := "unix://" + e.st.RelaySocket()
	var flows []*flowpb.Flow
	eventually(t, "AUDIT flows in hubble observe", func() (bool, error) {
		flows = hubbletest.JSONFlows(t, hubbletest.RunCLI(t, bin, relay, "observe", "--last", "1000", "-o", "json", "--namespace", ns, "--verdict", "AUDIT"))
		return len(flows) == audited, fmt.Errorf("%d AUDIT flows, want %d", len(flows), audited)
	})
	for _, f := range flows {
		by := f.GetIngressDeniedBy()
		if f.GetSource().GetPodName() != "client2" || f.GetDestination().GetPodName() != "server" || len(by) != 1 ||
			by[0].GetName() != "server-audit" || by[0].GetNamespace() != ns {
			t.Errorf("AUDIT flow: %v", f)
		}
	}
	out := runTendril(t, "observe", "--server", relay, "--last", "100", "--verdict", "AUDIT", "--namespace", ns)
	if strings.Count(out, "AUDIT") < audited || !strings.Contains(out, "server-audit") {
		t.Errorf("tendril observe --verdict AUDIT:\n%s", out)
	}

	// The counts: node1's report in the policy's status, and its metric.
	eventually(t, "the audited connections in the policy's status", func() (bool, error) {
		p, err := tnp.Get(ctx, "server-audit", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		n := p.Status.Nodes["node1"].AuditedConnections
		return n == audited && p.Status.Nodes["node2"].AuditedConnections == 0, fmt.Errorf("%+v", p.Status.Nodes)
	})
	// ... and node1's metric, read over its API.
	var ms []struct {
		Name   string
		Labels map[string]string
		Value  float64
	}
	if err := json.Unmarshal([]byte(runTendril(t, "-H", "unix://"+e.st.Nodes[0].Socket, "metrics", "list", "--match", "audited", "-o", "json")), &ms); err != nil {
		t.Fatal(err)
	}
	var total float64
	for _, m := range ms {
		if m.Name == "tendril_policy_audited_connections_total" && m.Labels["name"] == "server-audit" && m.Labels["namespace"] == ns && m.Labels["kind"] == "TendrilNetworkPolicy" {
			total += m.Value
		}
	}
	if total != audited {
		t.Errorf("node1's tendril_policy_audited_connections_total for server-audit = %g, want %d (%+v)", total, audited, ms)
	}

	// One field to enforce: client2 is denied from then on, client1 not.
	p, err := tnp.Get(ctx, "server-audit", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p.Spec.EnforcementMode = "enforce"
	if _, err := tnp.Update(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "client2 denied once enforced", func() (bool, error) {
		c := probe(t, ns+"/client2", server, false)
		return c == 1, fmt.Errorf("exit %d", c)
	})
	if c := probe(t, ns+"/client1", server, false); c != 0 {
		t.Errorf("client1 -> server once enforced: exit %d, want 0", c)
	}
	if err := tnp.Delete(ctx, "server-audit", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
}
