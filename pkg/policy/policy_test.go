package policy

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/tendril-net/tendril/pkg/identity"
	"github.com/tendril-net/tendril/pkg/policy/api"
)

// A small cluster: namespaces x and y with pods a, b; identities as the
// agent would allocate them.
var (
	xa  = Peer{ID: 1000, Labels: []string{"k8s:app=a", NamespaceLabel + "=x"}}
	xb  = Peer{ID: 1001, Labels: []string{"k8s:app=b", NamespaceLabel + "=x"}}
	ya  = Peer{ID: 1002, Labels: []string{"k8s:app=a", NamespaceLabel + "=y"}}
	c8  = Peer{ID: identity.LocalScope | 1, Labels: []string{"cidr:10.0.0.0/8"}, CIDR: netip.MustParsePrefix("10.0.0.0/8")}
	c24 = Peer{ID: identity.LocalScope | 2, Labels: []string{"cidr:10.1.2.0/24"}, CIDR: netip.MustParsePrefix("10.1.2.0/24")}
)

func universe() Universe {
	return append(ReservedPeers(), xa, xb, ya, c8, c24)
}

func mustRules(t *testing.T, doc string) api.Rules {
	t.Helper()
	rules, err := api.ParseRules([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	return rules
}
func TestInvalidRulesRejectedWhole(t *testing.T) {
	tests := []struct{ doc, want string }{
		{`[{"ingress":[{}]}]`, "endpointSelector is required"},
		{`[{"endpointSelector":{},"ingress":[{"fromEntities":["everyone"]}]}]`, "unknown entity"},
		{`[{"endpointSelector":{},"egress":[{"toPorts":[{"ports":[{"port":"70000"}]}]}]}]`, "out of range"},
		{`[{"endpointSelector":{},"egress":[{"toPorts":[{"ports":[{"port":"80","protocol":"ICMP"}]}]}]}]`, "protocol"},
		{`[{"endpointSelector":{},"egress":[{"toCIDRSet":[{"cidr":"10.0.0.0/8","except":["11.0.0.0/16"]}]}]}]`, "not inside"},
		{`[{"endpointSelector":{},"egress":[{"toCIDR":["10.0.0.1/8"]}]}]`, "host bits"},
		{`[{"endpointSelector":{"matchExpressions":[{"key":"a","operator":"Near"}]}}]`, "operator"},
		{`[{"endpointSelector":{},"bogus":1}]`, "unknown field"},
		{`[{"endpointSelector":{}}, {"endpointSelector":{},"egress":[{"toPorts":[{"ports":[{"port":"80","endPort":70}]}]}]}]`, "endPort"},
		{`[{"endpointSelector":{},"ingressDeny":[{"toPorts":[{"ports":[{"port":"http"}]}]}]}]`, "named ports are not allowed in deny"},
		{``, "empty"},
		{`[]`, "no rules"},
	}
	for _, tt := range tests {
		_, err := api.ParseRules([]byte(tt.doc))
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: err %v, want %q", tt.doc, err, tt.want)
		}
	}
	// The repository refuses the whole batch when one rule is bad.
	repo := NewRepository()
	good := &api.Rule{EndpointSelector: &api.EndpointSelector{}}
	bad := &api.Rule{}
	if _, err := repo.Add(api.Rules{good, bad}, "", "t", false); err == nil {
		t.Fatal("bad batch accepted")
	}
	if rules, rev := repo.Rules(nil); len(rules) != 0 || rev != 1 {
		t.Fatalf("bad batch changed the repository: %d rules, revision %d", len(rules), rev)
	}
}

func TestRepositoryRevisionsAndDiff(t *testing.T) {
	repo := NewRepository()
	var seen []uint64
	repo.Subscribe(func(rev uint64) { seen = append(seen, rev) })
	r1 := mustRules(t, `[{"endpointSelector":{},"labels":["team=a"],"ingress":[{"fromEntities":["host"]}]}]`)
	r2 := mustRules(t, `[{"endpointSelector":{},"labels":["team=a"],"ingress":[{"fromEntities":["world"]}]}]`)
	if rev, _ := repo.Add(r1, "", "api", false); rev != 2 {
		t.Fatalf("rev %d", rev)
	}
	before := repo.Resolve(Endpoint{Labels: xa.Labels}, universe())
	if rev, _ := repo.Add(r2, "", "api", true); rev != 3 {
		t.Fatalf("rev %d", rev)
	}
	if rules, _ := repo.Rules(nil); len(rules) != 1 {
		t.Fatalf("replace kept %d rules", len(rules))
	}
	after := repo.Resolve(Endpoint{Labels: xa.Labels}, universe())
	up, del := Diff(before.MapState, after.MapState)
	// world selects world, world-ipv4, world-ipv6 and both CIDR identities.
	if len(up) != 5 || len(del) != 1 {
		t.Fatalf("diff: %d upserts, %d deletes", len(up), len(del))
	}
	if _, n := repo.DeleteByLabels(mustSelect(t, "team=a")); n != 1 {
		t.Fatalf("deleted %d", n)
	}
	if len(seen) != 3 {
		t.Fatalf("listeners saw %v", seen)
	}
}

func FuzzParseRules(f *testing.F) {
	f.Add([]byte(`[{"endpointSelector":{},"ingress":[{"fromEndpoints":[{"matchLabels":{"app":"b"}}],"toPorts":[{"ports":[{"port":"80","endPort":90,"protocol":"TCP"}]}]}]}]`))
	f.Add([]byte(`{"endpointSelector":{"matchExpressions":[{"key":"a","operator":"In","values":["x"]}]},"egressDeny":[{"toCIDRSet":[{"cidr":"10.0.0.0/8","except":["10.1.0.0/16"]}]}]}`))
	f.Add([]byte(`[{"endpointSelector":{},"ingress":[{"icmps":[{"fields":[{"type":"EchoRequest","family":"IPv6"}]}]}]}]`))
	f.Fuzz(func(t *testing.T, data []byte) {
		rules, err := api.ParseRules(data)
		if err != nil {
			return
		}
		// Whatever parses must resolve without panicking.
		repo := NewRepository()
		if _, err := repo.Add(rules, "x", "fuzz", false); err != nil {
			t.Fatalf("parsed rules refused by the repository: %v", err)
		}
		res := repo.Resolve(Endpoint{Labels: xa.Labels}, universe())
		_, _ = res.MapState.Allowed(Ingress, xb.ID, 6, 80)
	})
}

func TestTrace(t *testing.T) {
	repo := NewRepository()
	if _, err := repo.Add(mustRules(t, `[{"endpointSelector":{"matchLabels":{"app":"a"}},"ingress":[{"fromEndpoints":[{"matchLabels":{"app":"b"}}],"toPorts":[{"ports":[{"port":"80","protocol":"TCP"}]}]}]}]`), "x", "t", false); err != nil {
		t.Fatal(err)
	}
	ok := repo.Trace(xb.Labels, xa.Labels, 6, 80, universe())
	if !ok.Allowed || !ok.Ingress.Enforced || ok.Ingress.Cookie != 1 || ok.Egress.Enforced {
		t.Fatalf("b→a:80 = %+v", ok)
	}
	denied := repo.Trace(xb.Labels, xa.Labels, 6, 81, universe())
	if denied.Allowed || !strings.Contains(strings.Join(denied.Lines, "\n"), "DENIED") {
		t.Fatalf("b→a:81 = %+v", denied)
	}
	// A source with labels no identity has yet is traced by its labels.
	newcomer := repo.Trace([]string{"k8s:app=b", NamespaceLabel + "=x", "k8s:tier=new"}, xa.Labels, 6, 80, universe())
	if !newcomer.Allowed {
		t.Fatalf("new b-labelled source = %+v", newcomer)
	}
}

func TestReplaceByLabels(t *testing.T) {
	repo := NewRepository()
	mine := mustRules(t, `[{"endpointSelector":{},"labels":["owner=np","name=a"],"ingress":[{}]},{"endpointSelector":{},"labels":["owner=np","name=a","part=2"],"egress":[{}]}]`)
	other := mustRules(t, `[{"endpointSelector":{},"labels":["owner=np","name=b"],"ingress":[{}]}]`)
	if _, err := repo.Add(append(mine, other...), "x", "test", false); err != nil {
		t.Fatal(err)
	}
	var revs []uint64
	repo.Subscribe(func(rev uint64) { revs = append(revs, rev) })
	next := mustRules(t, `[{"endpointSelector":{},"labels":["owner=np","name=a"],"ingress":[{"fromEntities":["all"]}]}]`)
	if _, err := repo.ReplaceByLabels(mustSelect(t, "owner=np", "name=a"), next, "x", "test"); err != nil {
		t.Fatal(err)
	}
	rules, _ := repo.Rules(nil)
	if len(rules) != 2 || len(revs) != 1 {
		t.Fatalf("after replace: %d rules, %d revisions", len(rules), len(revs))
	}
	if got, _ := repo.Rules(mustSelect(t, "name=b")); len(got) != 1 {
		t.Fatal("replace removed another object's rule")
	}
	if _, err := repo.ReplaceByLabels(nil, next, "x", "test"); err == nil {
		t.Fatal("replace with no labels accepted")
	}
	if _, err := repo.ReplaceByLabels(mustSelect(t, "name=a"), api.Rules{{}}, "x", "test"); err == nil {
		t.Fatal("invalid rule accepted")
	}
	if got, _ := repo.Rules(mustSelect(t, "name=a")); len(got) != 1 {
		t.Fatal("a refused replace changed the repository")
	}
}

func TestTraceNamesTheDecidingRule(t *testing.T) {
	repo := NewRepository()
	allow := mustRules(t, `[{"endpointSelector":{"matchLabels":{"app":"a"}},"labels":["k8s:io.cilium.k8s.policy.name=allow-b"],"ingress":[{"fromEndpoints":[{"matchLabels":{"app":"b"}}]}]}]`)
	if _, err := repo.Add(allow, "x", "k8s NetworkPolicy x/allow-b", false); err != nil {
		t.Fatal(err)
	}
	ok := strings.Join(repo.Trace(xb.Labels, xa.Labels, 6, 80, universe()).Lines, "\n")
	if !strings.Contains(ok, "allowed by rule 1 (k8s NetworkPolicy x/allow-b) [k8s:io.cilium.k8s.policy.name=allow-b]") {
		t.Fatalf("trace does not name the allowing rule:\n%s", ok)
	}
	denied := strings.Join(repo.Trace(ya.Labels, xa.Labels, 6, 80, universe()).Lines, "\n")
	if !strings.Contains(denied, "denied by default deny") || !strings.Contains(denied, "selected by rule 1 (k8s NetworkPolicy x/allow-b)") {
		t.Fatalf("trace does not explain the default deny:\n%s", denied)
	}
}

// TestWithNamespaceMatchesTheExactKey: only the namespace key itself (with
// the k8s source, any source, or none) lifts a namespaced rule's peer
// selector out of the rule's namespace; a key that merely ends in it, or
// has another source, is a label like any other.
func TestWithNamespaceMatchesTheExactKey(t *testing.T) {
	for key, names := range map[string]bool{
		"k8s:io.kubernetes.pod.namespace":      true,
		"any:io.kubernetes.pod.namespace":      true,
		"io.kubernetes.pod.namespace":          true,
		"k8s:evil.io.kubernetes.pod.namespace": false,
		"evilio.kubernetes.pod.namespace":      false,
		"unspec:io.kubernetes.pod.namespace":   false,
		"reserved:io.kubernetes.pod.namespace": false,
	} {
		for _, sel := range []api.EndpointSelector{
			{MatchLabels: map[string]string{key: "z"}},
			{MatchExpressions: []api.Requirement{{Key: key, Operator: "In", Values: []string{"z"}}}},
		} {
			out := withNamespace(sel, "x")
			_, restricted := out.MatchLabels[NamespaceLabel]
			if restricted == names && key != NamespaceLabel {
				t.Errorf("withNamespace(%+v): restricted to x = %v, want %v", sel, restricted, !names)
			}
			if key == NamespaceLabel && out.MatchLabels[NamespaceLabel] == "x" {
				t.Errorf("withNamespace(%+v) overrode the selector's own namespace", sel)
			}
		}
	}
}
