package policy

import (
	"strings"
	"testing"

	"github.com/tendril-net/tendril/pkg/identity"
	"github.com/tendril-net/tendril/pkg/policy/api"
)

// node1 is a node's labels as the host firewall resolves them.
var node1 = []string{"k8s:kubernetes.io/hostname=node1", "k8s:role=worker"}

// hostDefaults are the ports the host firewall keeps open by default in
// these tests: the kubelet's and the API server's.
var hostDefaults = []AlwaysAllowPort{{Ingress, 6, 10250}, {Ingress, 6, 6443}, {Egress, 6, 6443}}

func TestHostPolicySelectsOnlyTheHost(t *testing.T) {
	repo := NewRepository()
	doc := `[{"nodeSelector":{"matchLabels":{"role":"worker"}},"ingress":[{"fromEntities":["cluster"]}],
	          "labels":[{"key":"name","value":"host-fw"}]}]`
	if _, err := repo.Add(mustRules(t, doc), "", "api", false); err != nil {
		t.Fatal(err)
	}
	// A pod carrying the node's labels is no host: the rule never
	// selects an endpoint.
	pod := repo.Resolve(Endpoint{Labels: append([]string{NamespaceLabel + "=x"}, node1...)}, universe())
	if pod.EnforceIngress || len(pod.Rules) != 0 {
		t.Fatalf("a host policy selected a pod: %+v", pod)
	}
	host := repo.Resolve(Endpoint{Labels: node1, Host: true}, universe())
	if !host.EnforceIngress || host.EnforceEgress || len(host.Rules) != 1 {
		t.Fatalf("host: want ingress enforced by the one rule, got %+v", host)
	}
	if ok, _ := host.MapState.Allowed(Ingress, identity.World, 6, 30080); ok {
		t.Error("world reaches the node's port 30080 under a cluster-only host policy")
	}
	if ok, _ := host.MapState.Allowed(Ingress, xb.ID, 6, 30080); !ok {
		t.Error("a cluster pod is denied under a host policy allowing the cluster")
	}
	// Another node's labels: not selected.
	other := repo.Resolve(Endpoint{Labels: []string{"k8s:role=control-plane"}, Host: true}, universe())
	if other.EnforceIngress {
		t.Errorf("a host policy selected a node without its labels: %+v", other)
	}
	// An endpoint policy never selects the host, not even an empty
	// endpointSelector (which selects every pod).
	repo2 := NewRepository()
	if _, err := repo2.Add(mustRules(t, `[{"endpointSelector":{},"ingress":[{}]}]`), "", "api", false); err != nil {
		t.Fatal(err)
	}
	if res := repo2.Resolve(Endpoint{Labels: node1, Host: true}, universe()); res.EnforceIngress {
		t.Errorf("an endpoint policy selected the host: %+v", res)
	}
}

func TestHostPolicyAlwaysAllowedPorts(t *testing.T) {
	repo := NewRepository()
	// Ingress enforced, only port 22 named: the kubelet and API server
	// ports stay open to anyone; a port the rule names loses its default.
	doc := `[{"nodeSelector":{},"ingress":[{"fromEntities":["cluster"],"toPorts":[{"ports":[{"port":"6443","protocol":"TCP"}]}]}]}]`
	if _, err := repo.Add(mustRules(t, doc), "", "api", false); err != nil {
		t.Fatal(err)
	}
	res := repo.Resolve(Endpoint{Labels: node1, Host: true, AlwaysAllow: hostDefaults}, universe())
	if ok, _ := res.MapState.Allowed(Ingress, identity.World, 6, 10250); !ok {
		t.Error("the kubelet port is closed by a host policy that does not name it")
	}
	if ok, _ := res.MapState.Allowed(Ingress, identity.World, 6, 6443); ok {
		t.Error("the API server port stays open to the world although a rule names it (for the cluster only)")
	}
	if ok, _ := res.MapState.Allowed(Ingress, xb.ID, 6, 6443); !ok {
		t.Error("the rule naming the API server port does not allow the cluster")
	}
	if ok, _ := res.MapState.Allowed(Ingress, identity.World, 17, 10250); ok {
		t.Error("UDP 10250 is open: only TCP is a default")
	}
	// Egress is not enforced: its defaults add nothing.
	if res.EnforceEgress {
		t.Error("egress enforced without egress rules")
	}
	for k := range res.MapState {
		if k.Direction == Egress {
			t.Errorf("egress default entry %+v without egress policy", k)
		}
	}
	// A deny rule wins over a default.
	repo2 := NewRepository()
	doc = `[{"nodeSelector":{},"ingress":[{"fromEntities":["all"]}],"ingressDeny":[{"fromEntities":["world"]}]}]`
	if _, err := repo2.Add(mustRules(t, doc), "", "api", false); err != nil {
		t.Fatal(err)
	}
	res = repo2.Resolve(Endpoint{Labels: node1, Host: true, AlwaysAllow: hostDefaults}, universe())
	if ok, _ := res.MapState.Allowed(Ingress, identity.World, 6, 10250); ok {
		t.Error("a deny of the world does not cover the kubelet port")
	}
}

func TestHostFirewallAuditModeDeniesNothing(t *testing.T) {
	repo := NewRepository()
	doc := `[{"nodeSelector":{},"ingress":[{"fromEntities":["cluster"]}]}]`
	if _, err := repo.Add(mustRules(t, doc), "", "api", false); err != nil {
		t.Fatal(err)
	}
	res := repo.Resolve(Endpoint{Labels: node1, Host: true, AuditAll: true}, universe())
	if res.EnforceIngress {
		t.Fatalf("audit mode enforces ingress: %+v", res)
	}
	if !res.AuditIngress || res.AuditCookie[Ingress] == 0 {
		t.Fatalf("audit mode does not audit ingress: %+v", res)
	}
	if ok, _ := res.MapState.AuditAllowed(Ingress, identity.World, 6, 30080); ok {
		t.Error("audit mode's audit view allows the world: nothing would be reported")
	}
	if ok, _ := res.MapState.AuditAllowed(Ingress, xb.ID, 6, 30080); !ok {
		t.Error("audit view denies the cluster")
	}
}

func TestHostPolicyValidation(t *testing.T) {
	for _, tt := range []struct{ name, doc, want string }{
		{"both selectors", `{"endpointSelector":{},"nodeSelector":{},"ingress":[{}]}`, "exclusive"},
		{"bad selector", `{"nodeSelector":{"matchExpressions":[{"key":"a","operator":"Bogus"}]},"ingress":[{}]}`, "nodeSelector.matchExpressions[0].operator"},
		{"L7", `{"nodeSelector":{},"ingress":[{"toPorts":[{"ports":[{"port":"80","protocol":"TCP"}],"rules":{"http":[{"method":"GET"}]}}]}]}`, "L7 rules are not allowed in host policies"},
		{"toFQDNs", `{"nodeSelector":{},"egress":[{"toFQDNs":[{"matchName":"example.com"}]}]}`, "toFQDNs: not allowed in host policies"},
		{"bad entity", `{"nodeSelector":{},"ingress":[{"fromEntities":["moon"]}]}`, "unknown entity"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := api.ParseRules([]byte(tt.doc))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want one with %q", err, tt.want)
			}
		})
	}
	// A namespaced policy cannot hold a host rule: the whole document is
	// rejected, and what was there stays.
	repo := NewRepository()
	if _, err := repo.Add(mustRules(t, `[{"endpointSelector":{},"ingress":[{}],"labels":[{"key":"keep"}]}]`), "", "api", false); err != nil {
		t.Fatal(err)
	}
	rules := mustRules(t, `[{"endpointSelector":{},"ingress":[{}]},{"nodeSelector":{},"ingress":[{}]}]`)
	rev := repo.Revision()
	if _, err := repo.ReplaceSource("TendrilNetworkPolicy x/p", "x", rules); err == nil || !strings.Contains(err.Error(), "must be cluster-wide") {
		t.Fatalf("a namespaced host policy: error %v, want one saying it must be cluster-wide", err)
	}
	if got, _ := repo.Rules(nil); len(got) != 1 || repo.Revision() != rev {
		t.Fatalf("a rejected document changed the repository: %d rules, revision %d (was %d)", len(got), repo.Revision(), rev)
	}
	if _, err := repo.ReplaceSource("TendrilClusterwideNetworkPolicy p", "", rules); err != nil {
		t.Fatalf("a cluster-wide host policy: %v", err)
	}
}
