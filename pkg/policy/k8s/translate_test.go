package k8s

import (
	"encoding/json"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tendril-net/tendril/pkg/identity"
	"github.com/tendril-net/tendril/pkg/labels"
	"github.com/tendril-net/tendril/pkg/policy"
	"github.com/tendril-net/tendril/pkg/policy/api"
)

// TestTranslateShape pins the mapping documented in docs/policy.md; the
// semantics are TestReachability's.
func TestTranslateShape(t *testing.T) {
	np := mustPolicy(t, `
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
  - {}`)
	rules, err := Translate(np)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := json.Marshal(rules)
	want := `[{"endpointSelector":{"matchLabels":{"k8s:app":"web","k8s:io.kubernetes.pod.namespace":"shop"},"matchExpressions":[{"key":"k8s:tier","operator":"NotIn","values":["canary"]}]},` +
		`"ingress":[{"fromEndpoints":[{"matchLabels":{"k8s:app":"lb","k8s:io.kubernetes.pod.namespace":"shop"}},` +
		`{"matchLabels":{"k8s:app":"prom","k8s:io.cilium.k8s.namespace.labels.team":"ops"},"matchExpressions":[{"key":"k8s:io.kubernetes.pod.namespace","operator":"Exists"}]}],` +
		`"fromCIDRSet":[{"cidr":"192.0.2.0/24","except":["192.0.2.128/25"]}],` +
		`"toPorts":[{"ports":[{"port":"8080","protocol":"TCP"},{"port":"metrics","protocol":"TCP"},{"port":"9000","endPort":9100,"protocol":"UDP"}]}]},` +
		`{"fromEntities":["host"]}],` +
		`"egress":[{"toEntities":["all"]},{"toEntities":["host"]}],` +
		`"labels":[{"source":"k8s","key":"io.cilium.k8s.policy.derived-from","value":"NetworkPolicy"},{"source":"k8s","key":"io.cilium.k8s.policy.name","value":"web"},` +
		`{"source":"k8s","key":"io.cilium.k8s.policy.namespace","value":"shop"},{"source":"k8s","key":"io.cilium.k8s.policy.uid","value":"0b7c"}],` +
		`"description":"NetworkPolicy shop/web"}]`
	if string(got) != want {
		t.Fatalf("translation:\n got %s\nwant %s", got, want)
	}
	// What the repository serves back (`policy get`) parses as rules.
	if _, err := api.ParseRules(got); err != nil {
		t.Fatalf("translated rules do not parse back: %v", err)
	}
}

func TestInvalidPoliciesRejectedWhole(t *testing.T) {
	tests := []struct{ name, spec, want string }{
		{"bad CIDR", `{podSelector: {}, ingress: [{from: [{ipBlock: {cidr: 10.0.0.0/33}}]}]}`, "spec.ingress[0].from[0].ipBlock.cidr"},
		{"not a CIDR", `{podSelector: {}, egress: [{to: [{ipBlock: {cidr: example.com}}]}]}`, "spec.egress[0].to[0].ipBlock.cidr"},
		{"except outside the CIDR", `{podSelector: {}, egress: [{to: [{ipBlock: {cidr: 10.0.0.0/8, except: [11.0.0.0/16]}}]}]}`, "strict subset"},
		{"except equal to the CIDR", `{podSelector: {}, egress: [{to: [{ipBlock: {cidr: 10.0.0.0/8, except: [10.0.0.0/8]}}]}]}`, "spec.egress[0].to[0].ipBlock.except[0]"},
		{"except of the other family", `{podSelector: {}, egress: [{to: [{ipBlock: {cidr: 0.0.0.0/0, except: ["::/1"]}}]}]}`, "strict subset"},
		{"bad except", `{podSelector: {}, egress: [{to: [{ipBlock: {cidr: 10.0.0.0/8, except: [10.1]}}]}]}`, "except[0]"},
		{"bad selector operator", `{podSelector: {matchExpressions: [{key: app, operator: Near, values: [a]}]}}`, "spec.podSelector.matchExpressions[0].operator"},
		{"In without values", `{podSelector: {}, ingress: [{from: [{podSelector: {matchExpressions: [{key: app, operator: In}]}}]}]}`, "spec.ingress[0].from[0].podSelector.matchExpressions[0].values"},
		{"Exists with values", `{podSelector: {}, ingress: [{from: [{namespaceSelector: {matchExpressions: [{key: team, operator: Exists, values: [a]}]}}]}]}`, "spec.ingress[0].from[0].namespaceSelector.matchExpressions[0].values"},
		{"bad label key", `{podSelector: {matchLabels: {"bad key!": a}}}`, "spec.podSelector.matchLabels"},
		{"bad selector inside a namespace peer", `{podSelector: {}, ingress: [{from: [{namespaceSelector: {}, podSelector: {matchExpressions: [{key: a, operator: Like}]}}]}]}`, "spec.ingress[0].from[0].podSelector.matchExpressions[0].operator"},
		{"port 0", `{podSelector: {}, ingress: [{ports: [{port: 0}]}]}`, "spec.ingress[0].ports[0].port"},
		{"port out of range", `{podSelector: {}, ingress: [{ports: [{port: 70000}]}]}`, "spec.ingress[0].ports[0].port"},
		{"endPort without port", `{podSelector: {}, ingress: [{ports: [{endPort: 90}]}]}`, "spec.ingress[0].ports[0].endPort"},
		{"endPort below port", `{podSelector: {}, ingress: [{ports: [{port: 80, endPort: 79}]}]}`, "must be greater than or equal to port 80"},
		{"endPort out of range", `{podSelector: {}, ingress: [{ports: [{port: 80, endPort: 65536}]}]}`, "spec.ingress[0].ports[0].endPort"},
		{"endPort after a named port", `{podSelector: {}, ingress: [{ports: [{port: http, endPort: 90}]}]}`, "when port is a name"},
		{"invalid port name", `{podSelector: {}, ingress: [{ports: [{port: Serve_80}]}]}`, "spec.ingress[0].ports[0].port"},
		{"digits as a port name", `{podSelector: {}, ingress: [{ports: [{port: "80"}]}]}`, "spec.ingress[0].ports[0].port"},
		{"unsupported protocol", `{podSelector: {}, ingress: [{ports: [{port: 80, protocol: ICMP}]}]}`, "spec.ingress[0].ports[0].protocol"},
		{"unknown policyType", `{podSelector: {}, policyTypes: [Both]}`, "spec.policyTypes[0]"},
		{"ipBlock with a selector in one peer", `{podSelector: {}, ingress: [{from: [{ipBlock: {cidr: 10.0.0.0/8}, podSelector: {}}]}]}`, "may not specify both ipBlock and another peer"},
		{"empty peer", `{podSelector: {}, ingress: [{from: [{}]}]}`, "spec.ingress[0].from[0]: Required value"},
		{"reserved pod label key", `{podSelector: {matchLabels: {io.kubernetes.pod.namespace: kube-system}}}`, "reserved by the agent"},
		{"reserved key in a peer", `{podSelector: {}, ingress: [{from: [{podSelector: {matchExpressions: [{key: io.cilium.k8s.namespace.labels.team, operator: Exists}]}}]}]}`, "reserved by the agent"},
		// A direction the policy does not isolate is ignored, but still
		// has to be valid (the API server refuses it too).
		{"invalid rule in an ignored direction", `{podSelector: {}, policyTypes: [Ingress], egress: [{ports: [{port: 0}]}]}`, "spec.egress[0].ports[0].port"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			repo := policy.NewRepository()
			np := mustPolicy(t, "metadata: {name: p, namespace: x}\nspec: "+tt.spec)
			_, err := Apply(repo, np)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err %v, want it to contain %q", err, tt.want)
			}
			if !strings.Contains(err.Error(), "NetworkPolicy x/p") {
				t.Fatalf("err %v does not name the policy", err)
			}
			if rules, rev := repo.Rules(nil); len(rules) != 0 || rev != 1 {
				t.Fatalf("refused policy changed the repository: %d rules, revision %d", len(rules), rev)
			}
		})
	}
	for _, tt := range []struct{ doc, want string }{
		{"metadata: {name: p}\nspec: {podSelector: {}}", "metadata.namespace: required"},
		{"metadata: {namespace: x}\nspec: {podSelector: {}}", "metadata.name: required"},
	} {
		if _, err := Translate(mustPolicy(t, tt.doc)); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%q: err %v, want %q", tt.doc, err, tt.want)
		}
	}
	if _, err := Translate(nil); err == nil {
		t.Error("nil policy accepted")
	}
}

// A refused update leaves the previous version enforced.
func TestRefusedUpdateKeepsPreviousRules(t *testing.T) {
	c := newCluster(t)
	c.apply(`
metadata: {name: p, namespace: x}
spec: {podSelector: {}, policyTypes: [Ingress]}`)
	if _, err := Apply(c.repo, mustPolicy(t, "metadata: {name: p, namespace: x}\nspec: {podSelector: {}, ingress: [{ports: [{port: 0}]}]}")); err == nil {
		t.Fatal("invalid update accepted")
	}
	c.snapshot().verify(t, "after refused update", check{proto: tcp, port: 80, expect: []expect{denyAllTo("x/*")}})
}

// Apply replaces exactly the object's rules, Delete removes exactly them,
// and `policy get` (Rules by labels) finds them by the recorded labels.
func TestApplyReplaceDelete(t *testing.T) {
	repo := policy.NewRepository()
	must := func(doc string) {
		t.Helper()
		if _, err := Apply(repo, mustPolicy(t, doc)); err != nil {
			t.Fatal(err)
		}
	}
	must("metadata: {name: p, namespace: x, uid: one}\nspec: {podSelector: {}, policyTypes: [Ingress]}")
	must("metadata: {name: p, namespace: y, uid: two}\nspec: {podSelector: {}, policyTypes: [Ingress]}")
	// A CiliumNetworkPolicy of the same name and namespace is another
	// object: its rules carry another derived-from.
	cnp := &api.Rule{EndpointSelector: &api.EndpointSelector{}, Ingress: []api.IngressRule{{}}, Labels: api.LabelArray{
		{Source: labels.SourceK8s, Key: KeyPolicyName, Value: "p"}, {Source: labels.SourceK8s, Key: KeyPolicyNamespace, Value: "x"},
		{Source: labels.SourceK8s, Key: KeyPolicyDerivedFrom, Value: "CiliumNetworkPolicy"},
	}}
	if _, err := repo.Add(api.Rules{cnp}, "x", "k8s CiliumNetworkPolicy x/p", false); err != nil {
		t.Fatal(err)
	}
	rev := repo.Revision()
	// Deleted and created again under the same name: a new UID, same object.
	must("metadata: {name: p, namespace: x, uid: three}\nspec: {podSelector: {}, policyTypes: [Egress]}")
	if repo.Revision() != rev+1 {
		t.Fatalf("replace took %d revisions, want 1", repo.Revision()-rev)
	}
	mine, _ := repo.Rules(KeyLabels("x", "p"))
	if len(mine) != 1 || mine[0].Rule.Egress == nil || mine[0].Rule.Ingress != nil || mine[0].Source != "k8s NetworkPolicy x/p" || mine[0].Namespace != "x" {
		t.Fatalf("after replace: %+v", mine)
	}
	if byUID, _ := repo.Rules(mustSelect(t, LabelPolicyUID+"=three")); len(byUID) != 1 {
		t.Fatal("rule not found by its UID label")
	}
	if _, n := Delete(repo, "x", "p"); n != 1 {
		t.Fatalf("delete removed %d rules, want 1", n)
	}
	left, _ := repo.Rules(nil)
	if len(left) != 2 {
		t.Fatalf("delete left %d rules, want the other namespace's and the CNP's", len(left))
	}
	if _, n := Delete(repo, "x", "p"); n != 0 {
		t.Fatalf("second delete removed %d", n)
	}
}

// `policy trace` names the NetworkPolicy that allowed, and the ones whose
// isolation denied.
func TestTraceNamesNetworkPolicy(t *testing.T) {
	c := newCluster(t)
	c.apply(`
metadata: {name: x-a-allows-x-b, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress:
  - from: [{podSelector: {matchLabels: {pod: b}}}]`)
	s := c.snapshot()
	labelsOf := func(key string) []string {
		p := c.pod(key)
		return EndpointForPod(p, c.namespaces[p.Namespace]).Labels
	}
	ok := c.repo.Trace(labelsOf("x/b"), labelsOf("x/a"), api.ProtoTCP, 80, s.universe)
	text := strings.Join(ok.Lines, "\n")
	if !ok.Allowed || !strings.Contains(text, "allowed by rule 1 (k8s NetworkPolicy x/x-a-allows-x-b)") || !strings.Contains(text, LabelPolicyName+"=x-a-allows-x-b") {
		t.Fatalf("x/b → x/a:\n%s", text)
	}
	denied := c.repo.Trace(labelsOf("y/b"), labelsOf("x/a"), api.ProtoTCP, 80, s.universe)
	text = strings.Join(denied.Lines, "\n")
	if denied.Allowed || !strings.Contains(text, "denied by default deny") || !strings.Contains(text, "selected by rule 1 (k8s NetworkPolicy x/x-a-allows-x-b)") {
		t.Fatalf("y/b → x/a:\n%s", text)
	}
}

func TestEndpointLabels(t *testing.T) {
	got := EndpointLabels("shop", map[string]string{"team": "a", corev1.LabelMetadataName: "shop"}, map[string]string{
		"app": "web",
		// A pod cannot claim another namespace or its labels.
		"io.kubernetes.pod.namespace":         "kube-system",
		"io.cilium.k8s.namespace.labels.team": "ops",
		"io.cilium.k8s.policy.name":           "x",
		"example.com/role":                    "front",
	})
	want := []string{
		"k8s:app=web",
		"k8s:example.com/role=front",
		"k8s:io.cilium.k8s.namespace.labels.kubernetes.io/metadata.name=shop",
		"k8s:io.cilium.k8s.namespace.labels.team=a",
		"k8s:io.kubernetes.pod.namespace=shop",
	}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("labels:\n got %v\nwant %v", got, want)
	}
}

// A namespaceSelector selects pods only: an identity without a namespace
// (an endpoint outside Kubernetes) is not selected even by NotIn or
// DoesNotExist.
func TestNamespaceSelectorSelectsOnlyPods(t *testing.T) {
	repo := policy.NewRepository()
	if _, err := Apply(repo, mustPolicy(t, `
metadata: {name: p, namespace: x}
spec:
  podSelector: {}
  ingress:
  - from:
    - namespaceSelector: {matchExpressions: [{key: team, operator: DoesNotExist}]}
    - namespaceSelector: {matchExpressions: [{key: ns, operator: NotIn, values: [x]}]}`)); err != nil {
		t.Fatal(err)
	}
	pod := policy.Peer{ID: 300, Labels: EndpointLabels("y", map[string]string{"ns": "y"}, map[string]string{"app": "a"})}
	vm := policy.Peer{ID: 301, Labels: []string{"k8s:app=a"}}
	u := append(policy.ReservedPeers(), pod, vm)
	res := repo.Resolve(policy.Endpoint{Labels: EndpointLabels("x", nil, nil)}, u)
	if ok, _ := res.MapState.Allowed(policy.Ingress, pod.ID, api.ProtoTCP, 80); !ok {
		t.Error("pod of another namespace denied")
	}
	if ok, _ := res.MapState.Allowed(policy.Ingress, vm.ID, api.ProtoTCP, 80); ok {
		t.Error("identity without a namespace selected by a namespaceSelector")
	}
	if ok, _ := res.MapState.Allowed(policy.Ingress, identity.World, api.ProtoTCP, 80); ok {
		t.Error("world selected by a namespaceSelector")
	}
}

func TestPodNamedPorts(t *testing.T) {
	always := corev1.ContainerRestartPolicyAlways
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "x"}, Spec: corev1.PodSpec{
		InitContainers: []corev1.Container{
			{Name: "setup", Ports: []corev1.ContainerPort{{Name: "setup", ContainerPort: 1}}},
			{Name: "proxy", RestartPolicy: &always, Ports: []corev1.ContainerPort{{Name: "proxy", ContainerPort: 15001}}},
		},
		Containers: []corev1.Container{{Name: "app", Ports: []corev1.ContainerPort{
			{Name: "http", ContainerPort: 8080},
			{Name: "dns", ContainerPort: 53, Protocol: corev1.ProtocolUDP},
			{ContainerPort: 9000}, // unnamed
		}}},
	}}
	got := PodNamedPorts(pod)
	want := map[string]policy.NamedPort{
		"http":  {Port: 8080, Proto: api.ProtoTCP},
		"dns":   {Port: 53, Proto: api.ProtoUDP},
		"proxy": {Port: 15001, Proto: api.ProtoTCP},
	}
	if len(got) != len(want) {
		t.Fatalf("named ports %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Fatalf("named ports %v, want %v", got, want)
		}
	}
}

// Ports absent means every protocol, ICMP included; a ports list admits
// only its TCP, UDP or SCTP ports.
func TestICMPFollowsPorts(t *testing.T) {
	c := newCluster(t)
	c.apply(`
metadata: {name: from-b-any-traffic, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress:
  - from: [{podSelector: {matchLabels: {pod: b}}}]`, `
metadata: {name: from-c-tcp-80, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress:
  - from: [{podSelector: {matchLabels: {pod: c}}}]
    ports: [{port: 80}]`)
	s := c.snapshot()
	const echoRequest = 8
	if !s.allowed("x/b", "x/a", api.ProtoICMP, echoRequest) {
		t.Error("ICMP from x/b denied by a rule without ports")
	}
	if s.allowed("x/c", "x/a", api.ProtoICMP, echoRequest) {
		t.Error("ICMP from x/c allowed by a TCP-only rule")
	}
}

// mustSelect parses labels that select rules, as the API does.
func mustSelect(t testing.TB, ss ...string) []labels.Label {
	t.Helper()
	sel, err := api.ParseSelectLabels(ss)
	if err != nil {
		t.Fatal(err)
	}
	return sel
}

func TestTranslateEnforcementModeAnnotation(t *testing.T) {
	np := &networkingv1.NetworkPolicy{}
	np.Name, np.Namespace = "p", "x"
	np.Annotations = map[string]string{AnnotationEnforcementMode: "audit"}
	rules, err := Translate(np)
	if err != nil {
		t.Fatal(err)
	}
	if !rules[0].Audited() {
		t.Fatal("annotation audit did not make an audited rule")
	}
	np.Annotations[AnnotationEnforcementMode] = "dry-run"
	if _, err := Translate(np); err == nil || !strings.Contains(err.Error(), AnnotationEnforcementMode) {
		t.Fatalf("bad mode: %v", err)
	}
}
