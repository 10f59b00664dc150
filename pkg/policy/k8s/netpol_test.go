package k8s

import (
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

const (
	tcp  = corev1.ProtocolTCP
	udp  = corev1.ProtocolUDP
	sctp = corev1.ProtocolSCTP
)

// step changes the cluster (labels, pods), applies and deletes policies,
// then checks reachability.
type step struct {
	change func(c *cluster)
	apply  []string
	delete []string // namespace/name
	checks []check
}

// denyAllTo and friends are the common expectations.
func denyAllTo(pattern string) expect   { return expect{"*", pattern, false} }
func denyAllFrom(pattern string) expect { return expect{pattern, "*", false} }

// TestReachability runs the cases of the upstream e2e suite
// (test/e2e/network/netpol/network_policy.go, same names where they are
// upstream cases) and the further cases of Kubernetes' semantics, as full
// pod × pod reachability matrices through the real repository, allocator
// and resolution.
func TestReachability(t *testing.T) {
	tests := []struct {
		name  string
		steps []step
	}{
		{
			name: "should support a 'default-deny-ingress' policy",
			steps: []step{{
				apply: []string{`
metadata: {name: deny-ingress, namespace: x}
spec:
  podSelector: {}
  policyTypes: [Ingress]`},
				checks: []check{
					{proto: tcp, port: 80, expect: []expect{denyAllTo("x/*")}, probes: []probe{
						{"host", "x/a", true},         // the pod's node is always allowed
						{"remote-node", "x/a", false}, // other nodes are not
						{"8.8.8.8", "x/a", false},
						{"x/a", "8.8.8.8", true}, // egress is not isolated
					}},
					{proto: udp, port: 80, expect: []expect{denyAllTo("x/*")}},
					{proto: sctp, port: 80, expect: []expect{denyAllTo("x/*")}},
				},
			}},
		},
		{
			name: "should support a 'default-deny-all' policy",
			steps: []step{{
				apply: []string{`
metadata: {name: deny-all, namespace: x}
spec:
  podSelector: {}
  policyTypes: [Ingress, Egress]`},
				checks: []check{{proto: tcp, port: 80, expect: []expect{denyAllTo("x/*"), denyAllFrom("x/*")}, probes: []probe{
					{"x/a", "host", true}, {"host", "x/a", true}, {"x/a", "8.8.8.8", false}, {"x/a", "remote-node", false},
				}}},
			}},
		},
		{
			name: "should enforce policy to allow traffic from pods within server namespace based on PodSelector",
			steps: []step{{
				apply: []string{`
metadata: {name: x-a-allows-x-b, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress:
  - from: [{podSelector: {matchLabels: {pod: b}}}]`},
				// x/a's egress stays open: an ingress policy does not restrict egress.
				checks: []check{{proto: tcp, port: 80, expect: []expect{denyAllTo("x/a"), {"x/b", "x/a", true}}}},
			}},
		},
		{
			name: "should enforce policy to allow ingress traffic for a target",
			steps: []step{{
				apply: []string{`
metadata: {name: deny-all, namespace: x}
spec:
  podSelector: {}
  policyTypes: [Ingress]`, `
metadata: {name: allow-all-to-a, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress:
  - from: [{podSelector: {}, namespaceSelector: {}}]`},
				checks: []check{{proto: tcp, port: 80, expect: []expect{denyAllTo("x/*"), {"*", "x/a", true}}, probes: []probe{
					{"8.8.8.8", "x/a", false}, // pods of every namespace, not the world
				}}},
			}},
		},
		{
			name: "should enforce policy to allow ingress traffic from pods in all namespaces",
			steps: []step{{
				apply: []string{`
metadata: {name: allow-from-another-ns, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress:
  - from: [{namespaceSelector: {}}]`},
				checks: []check{{proto: tcp, port: 80, probes: []probe{{"8.8.8.8", "x/a", false}, {"host", "x/a", true}}}},
			}},
		},
		{
			name: "should enforce policy to allow traffic only from a different namespace, based on NamespaceSelector",
			steps: []step{{
				apply: []string{`
metadata: {name: allow-client-a-via-ns-selector, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress:
  - from: [{namespaceSelector: {matchLabels: {ns: "y"}}}]`},
				checks: []check{{proto: tcp, port: 80, expect: []expect{{"x/*", "x/a", false}, {"z/*", "x/a", false}}}},
			}},
		},
		{
			name: "should enforce policy based on PodSelector with MatchExpressions",
			steps: []step{{
				apply: []string{`
metadata: {name: x-a-allows-x-b, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress:
  - from: [{podSelector: {matchExpressions: [{key: pod, operator: In, values: [b]}]}}]`},
				checks: []check{{proto: tcp, port: 80, expect: []expect{denyAllTo("x/a"), {"x/b", "x/a", true}}}},
			}},
		},
		{
			name: "should enforce policy based on NamespaceSelector with MatchExpressions",
			steps: []step{{
				apply: []string{`
metadata: {name: allow-ns-y-match-selector, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress:
  - from: [{namespaceSelector: {matchExpressions: [{key: ns, operator: In, values: ["y"]}]}}]`},
				checks: []check{{proto: tcp, port: 80, expect: []expect{{"x/*", "x/a", false}, {"z/*", "x/a", false}}}},
			}},
		},
		{
			name: "namespaceSelector with Exists, and with DoesNotExist",
			steps: []step{{
				change: func(c *cluster) { c.labelNamespace("y", "team", "blue") },
				apply: []string{`
metadata: {name: from-team-namespaces, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress:
  - from: [{namespaceSelector: {matchExpressions: [{key: team, operator: Exists}]}}]`, `
metadata: {name: from-teamless-namespaces, namespace: x}
spec:
  podSelector: {matchLabels: {pod: b}}
  ingress:
  - from: [{namespaceSelector: {matchExpressions: [{key: team, operator: DoesNotExist}]}}]`},
				checks: []check{{proto: tcp, port: 80, expect: []expect{
					denyAllTo("x/a"), {"y/*", "x/a", true},
					{"y/*", "x/b", false},
				}, probes: []probe{{"8.8.8.8", "x/b", false}}}}, // DoesNotExist selects pods, not the world
			}},
		},
		{
			name: "should enforce policy based on PodSelector or NamespaceSelector",
			steps: []step{{
				apply: []string{`
metadata: {name: allow-ns-y-match-selector, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress:
  - from:
    - namespaceSelector: {matchExpressions: [{key: ns, operator: NotIn, values: [x]}]}
    - podSelector: {matchLabels: {pod: b}}`},
				checks: []check{{proto: tcp, port: 80, expect: []expect{{"x/c", "x/a", false}}, probes: []probe{
					{"8.8.8.8", "x/a", false}, // NotIn selects pods of other namespaces, not the world
				}}},
			}},
		},
		{
			name: "should enforce policy based on PodSelector and NamespaceSelector",
			steps: []step{{
				apply: []string{`
metadata: {name: allow-ns-y-podselector-and-nsselector, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress:
  - from:
    - namespaceSelector: {matchExpressions: [{key: ns, operator: NotIn, values: [x]}]}
      podSelector: {matchLabels: {pod: b}}`},
				checks: []check{{proto: tcp, port: 80, expect: []expect{denyAllTo("x/a"), {"y/b", "x/a", true}, {"z/b", "x/a", true}}}},
			}},
		},
		{
			name: "should enforce policy based on Multiple PodSelectors and NamespaceSelectors",
			steps: []step{{
				apply: []string{`
metadata: {name: allow-ns-y-z-pod-b-c, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress:
  - from:
    - namespaceSelector: {matchExpressions: [{key: ns, operator: NotIn, values: [x]}]}
      podSelector: {matchExpressions: [{key: pod, operator: In, values: [b, c]}]}`},
				checks: []check{{proto: tcp, port: 80, expect: []expect{{"x/*", "x/a", false}, {"*/a", "x/a", false}}}},
			}},
		},
		{
			name: "should enforce policy based on any PodSelectors",
			steps: []step{{
				apply: []string{`
metadata: {name: allow-ns-x-pod-b-c, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress:
  - from: [{podSelector: {matchLabels: {pod: b}}}, {podSelector: {matchLabels: {pod: c}}}]`},
				checks: []check{{proto: tcp, port: 80, expect: []expect{denyAllTo("x/a"), {"x/b", "x/a", true}, {"x/c", "x/a", true}}}},
			}},
		},
		{
			name: "should enforce policy to allow traffic only from a pod in a different namespace based on PodSelector and NamespaceSelector",
			steps: []step{{
				apply: []string{`
metadata: {name: allow-ns-y-pod-a-via-namespace-pod-selector, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress:
  - from: [{namespaceSelector: {matchLabels: {ns: "y"}}, podSelector: {matchLabels: {pod: a}}}]`},
				checks: []check{
					{proto: tcp, port: 80, expect: []expect{denyAllTo("x/a"), {"y/a", "x/a", true}}},
					{proto: udp, port: 80, expect: []expect{denyAllTo("x/a"), {"y/a", "x/a", true}}},
					{proto: sctp, port: 80, expect: []expect{denyAllTo("x/a"), {"y/a", "x/a", true}}},
				},
			}},
		},
		{
			name: "should enforce policy based on Ports",
			steps: []step{{
				apply: []string{`
metadata: {name: allow-client-a-via-ns-selector, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress:
  - from: [{namespaceSelector: {matchLabels: {ns: "y"}}}]
    ports: [{port: 81, protocol: TCP}]`},
				checks: []check{
					{proto: tcp, port: 81, expect: []expect{{"x/*", "x/a", false}, {"z/*", "x/a", false}}},
					{proto: tcp, port: 80, expect: []expect{denyAllTo("x/a")}},
					{proto: udp, port: 81, expect: []expect{denyAllTo("x/a")}},
				},
			}},
		},
		{
			name: "should enforce policy based on Ports (UDP)",
			steps: []step{{
				apply: []string{`
metadata: {name: allow-ingress-on-port-81-ns-x, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress:
  - from: [{namespaceSelector: {matchLabels: {ns: "y"}}}]
    ports: [{port: 81, protocol: UDP}]`},
				checks: []check{
					{proto: udp, port: 81, expect: []expect{{"x/*", "x/a", false}, {"z/*", "x/a", false}}},
					{proto: tcp, port: 81, expect: []expect{denyAllTo("x/a")}},
				},
			}},
		},
		{
			name: "should enforce policy based on Ports (SCTP)",
			steps: []step{{
				apply: []string{`
metadata: {name: allow-ingress-on-port-81-ns-x, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress:
  - from: [{namespaceSelector: {matchLabels: {ns: "y"}}}]
    ports: [{port: 81, protocol: SCTP}]`},
				checks: []check{
					{proto: sctp, port: 81, expect: []expect{{"x/*", "x/a", false}, {"z/*", "x/a", false}}},
					{proto: tcp, port: 81, expect: []expect{denyAllTo("x/a")}},
					{proto: udp, port: 81, expect: []expect{denyAllTo("x/a")}},
				},
			}},
		},
		{
			name: "should enforce multiple, stacked policies with overlapping podSelectors",
			steps: []step{
				{
					apply: []string{`
metadata: {name: allow-client-a-via-ns-selector, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress:
  - from: [{namespaceSelector: {matchLabels: {ns: "y"}}}]
    ports: [{port: 81, protocol: TCP}]`},
					checks: []check{
						{proto: tcp, port: 81, expect: []expect{{"x/*", "x/a", false}, {"z/*", "x/a", false}}},
						{proto: tcp, port: 80, expect: []expect{denyAllTo("x/a")}},
					},
				},
				{
					apply: []string{`
metadata: {name: allow-client-a-via-ns-selector-80, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress:
  - from: [{namespaceSelector: {matchLabels: {ns: "y"}}}]
    ports: [{port: 80, protocol: TCP}]`},
					checks: []check{
						{proto: tcp, port: 80, expect: []expect{{"x/*", "x/a", false}, {"z/*", "x/a", false}}},
						{proto: tcp, port: 81, expect: []expect{{"x/*", "x/a", false}, {"z/*", "x/a", false}}},
						{proto: tcp, port: 82, expect: []expect{denyAllTo("x/a")}},
					},
				},
			},
		},
		{
			name: "should support allow-all policy",
			steps: []step{{
				apply: []string{`
metadata: {name: allow-all, namespace: x}
spec:
  podSelector: {}
  ingress: [{}]`},
				checks: []check{
					{proto: tcp, port: 80, probes: []probe{{"8.8.8.8", "x/a", true}, {"remote-node", "x/b", true}}},
					{proto: tcp, port: 81},
					{proto: udp, port: 5353},
				},
			}},
		},
		{
			name: "should allow ingress access on one named port",
			steps: []step{{
				apply: []string{`
metadata: {name: allow-all, namespace: x}
spec:
  podSelector: {}
  ingress:
  - ports: [{port: serve-81-tcp}]`},
				checks: []check{
					{proto: tcp, port: 81, probes: []probe{{"8.8.8.8", "x/a", true}}},
					{proto: tcp, port: 80, expect: []expect{denyAllTo("x/*")}},
					{proto: udp, port: 81, expect: []expect{denyAllTo("x/*")}}, // the name is the TCP port's
				},
			}},
		},
		{
			name: "should allow ingress access from namespace on one named port",
			steps: []step{{
				apply: []string{`
metadata: {name: allow-client-a-via-ns-selector-80, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress:
  - from: [{namespaceSelector: {matchLabels: {ns: "y"}}}]
    ports: [{port: serve-80-tcp, protocol: TCP}]`},
				checks: []check{
					{proto: tcp, port: 80, expect: []expect{{"x/*", "x/a", false}, {"z/*", "x/a", false}}},
					{proto: tcp, port: 81, expect: []expect{denyAllTo("x/a")}},
				},
			}},
		},
		{
			name: "named port with a protocol other than the container port's selects nothing",
			steps: []step{{
				apply: []string{`
metadata: {name: udp-name-as-tcp, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress:
  - ports: [{port: serve-80-udp}]`}, // protocol defaults to TCP; the container port is UDP
				checks: []check{
					{proto: udp, port: 80, expect: []expect{denyAllTo("x/a")}},
					{proto: tcp, port: 80, expect: []expect{denyAllTo("x/a")}},
				},
			}},
		},
		{
			name: "should allow egress access on one named port",
			steps: []step{{
				apply: []string{`
metadata: {name: allow-egress, namespace: x}
spec:
  podSelector: {}
  policyTypes: [Egress]
  egress:
  - ports: [{port: serve-80-tcp}]`},
				checks: []check{
					// The name resolves against the destination pods' ports; the
					// world has no named ports.
					{proto: tcp, port: 80, probes: []probe{{"x/a", "8.8.8.8", false}}},
					{proto: tcp, port: 81, expect: []expect{denyAllFrom("x/*")}},
				},
			}},
		},
		{
			name: "should enforce updated policy",
			steps: []step{
				{
					apply: []string{`
metadata: {name: allow-all-mutate-to-deny-all, namespace: x}
spec:
  podSelector: {}
  policyTypes: [Ingress]
  ingress: [{}]`},
					checks: []check{{proto: tcp, port: 81}},
				},
				{
					apply: []string{`
metadata: {name: allow-all-mutate-to-deny-all, namespace: x}
spec:
  podSelector: {}
  policyTypes: [Ingress]
  ingress: []`},
					checks: []check{{proto: tcp, port: 81, expect: []expect{denyAllTo("x/*")}}},
				},
			},
		},
		{
			name: "should allow ingress access from updated namespace",
			steps: []step{
				{
					apply: []string{`
metadata: {name: allow-client-a-via-ns-selector, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress:
  - from: [{namespaceSelector: {matchLabels: {ns2: updated}}}]`},
					checks: []check{{proto: tcp, port: 80, expect: []expect{denyAllTo("x/a")}}},
				},
				{
					change: func(c *cluster) { c.labelNamespace("y", "ns2", "updated") },
					checks: []check{{proto: tcp, port: 80, expect: []expect{denyAllTo("x/a"), {"y/*", "x/a", true}}}},
				},
			},
		},
		{
			name: "should allow ingress access from updated pod",
			steps: []step{
				{
					apply: []string{`
metadata: {name: allow-client-a-via-pod-selector, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress:
  - from: [{podSelector: {matchLabels: {pod: b, pod2: updated}}}]`},
					checks: []check{{proto: tcp, port: 80, expect: []expect{denyAllTo("x/a")}}},
				},
				{
					change: func(c *cluster) { c.labelPod("x/b", "pod2", "updated") },
					checks: []check{{proto: tcp, port: 80, expect: []expect{denyAllTo("x/a"), {"x/b", "x/a", true}}}},
				},
			},
		},
		{
			name: "should deny ingress from pods on other namespaces",
			steps: []step{{
				apply: []string{`
metadata: {name: deny-empty-policy, namespace: x}
spec:
  podSelector: {}
  ingress:
  - from: [{podSelector: {}}]`},
				checks: []check{{proto: tcp, port: 80, expect: []expect{{"y/*", "x/*", false}, {"z/*", "x/*", false}}}},
			}},
		},
		{
			name: "should deny ingress access to updated pod",
			steps: []step{
				{
					apply: []string{`
metadata: {name: deny-ingress-via-label-selector, namespace: x}
spec:
  podSelector: {matchLabels: {target: isolated}}
  policyTypes: [Ingress]`},
					checks: []check{{proto: tcp, port: 80}},
				},
				{
					change: func(c *cluster) { c.labelPod("x/a", "target", "isolated") },
					checks: []check{{proto: tcp, port: 80, expect: []expect{denyAllTo("x/a")}}},
				},
			},
		},
		{
			name: "should deny egress from pods based on PodSelector",
			steps: []step{{
				apply: []string{`
metadata: {name: deny-egress-pod-a, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  policyTypes: [Egress]`},
				// x/a's ingress stays open: an egress policy does not restrict ingress.
				checks: []check{{proto: tcp, port: 80, expect: []expect{denyAllFrom("x/a")}}},
			}},
		},
		{
			name: "should deny egress from all pods in a namespace",
			steps: []step{{
				apply: []string{`
metadata: {name: deny-egress-ns-x, namespace: x}
spec:
  podSelector: {}
  policyTypes: [Egress]`},
				checks: []check{{proto: tcp, port: 80, expect: []expect{denyAllFrom("x/*")}}},
			}},
		},
		{
			name: "should work with Ingress, Egress specified together",
			steps: []step{{
				apply: []string{`
metadata: {name: allow-client-a-via-pod-selector, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  policyTypes: [Egress, Ingress]
  ingress:
  - from: [{podSelector: {matchLabels: {pod: b}}}]
  egress:
  - ports: [{port: 80}]`},
				checks: []check{
					{proto: tcp, port: 80, expect: []expect{denyAllTo("x/a"), {"x/b", "x/a", true}}},
					{proto: tcp, port: 81, expect: []expect{denyAllTo("x/a"), denyAllFrom("x/a"), {"x/b", "x/a", true}}},
				},
			}},
		},
		{
			name: "should support denying of egress traffic on the client side (even if the server explicitly allows this traffic)",
			steps: []step{{
				apply: []string{`
metadata: {name: allow-to-ns-y-pod-a, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  policyTypes: [Egress]
  egress:
  - to: [{namespaceSelector: {matchLabels: {ns: "y"}}, podSelector: {matchLabels: {pod: a}}}]`, `
metadata: {name: allow-from-xa-on-ya-match-selector, namespace: "y"}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress:
  - from: [{namespaceSelector: {matchLabels: {ns: x}}, podSelector: {matchLabels: {pod: a}}}]`, `
metadata: {name: allow-from-xa-on-yb-match-selector, namespace: "y"}
spec:
  podSelector: {matchLabels: {pod: b}}
  ingress:
  - from: [{namespaceSelector: {matchLabels: {ns: x}}, podSelector: {matchLabels: {pod: a}}}]`},
				checks: []check{{proto: tcp, port: 80, expect: []expect{
					denyAllFrom("x/a"), denyAllTo("y/a"), {"x/a", "y/a", true}, denyAllTo("y/b"),
				}}},
			}},
		},
		{
			name: "should enforce egress policy allowing traffic to a server in a different namespace based on PodSelector and NamespaceSelector",
			steps: []step{{
				apply: []string{`
metadata: {name: allow-to-ns-y-pod-a, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  policyTypes: [Egress]
  egress:
  - to: [{namespaceSelector: {matchLabels: {ns: "y"}}, podSelector: {matchLabels: {pod: a}}}]`},
				checks: []check{{proto: tcp, port: 80, expect: []expect{denyAllFrom("x/a"), {"x/a", "y/a", true}}}},
			}},
		},
		{
			name: "should enforce ingress policy allowing any port traffic to a server on a specific protocol",
			steps: []step{{
				apply: []string{`
metadata: {name: allow-ingress-by-proto, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress:
  - ports: [{protocol: TCP}]`},
				checks: []check{
					{proto: tcp, port: 80},
					{proto: tcp, port: 31337},
					{proto: udp, port: 80, expect: []expect{denyAllTo("x/a")}},
				},
			}},
		},
		{
			name: "should enforce multiple ingress policies with ingress allow-all policy taking precedence",
			steps: []step{
				{
					apply: []string{`
metadata: {name: allow-ingress-port-80, namespace: x}
spec:
  podSelector: {}
  ingress:
  - ports: [{port: 80}]`},
					checks: []check{{proto: tcp, port: 81, expect: []expect{denyAllTo("x/*")}}},
				},
				{
					apply: []string{`
metadata: {name: allow-ingress, namespace: x}
spec:
  podSelector: {}
  ingress: [{}]`},
					checks: []check{{proto: tcp, port: 81}},
				},
			},
		},
		{
			name: "should enforce multiple egress policies with egress allow-all policy taking precedence",
			steps: []step{
				{
					apply: []string{`
metadata: {name: allow-egress-port-80, namespace: x}
spec:
  podSelector: {}
  policyTypes: [Egress]
  egress:
  - ports: [{port: 80}]`},
					checks: []check{{proto: tcp, port: 81, expect: []expect{denyAllFrom("x/*")}}},
				},
				{
					apply: []string{`
metadata: {name: allow-egress, namespace: x}
spec:
  podSelector: {}
  policyTypes: [Egress]
  egress: [{}]`},
					checks: []check{{proto: tcp, port: 81, probes: []probe{{"x/a", "8.8.8.8", true}}}},
				},
			},
		},
		{
			name: "should stop enforcing policies after they are deleted",
			steps: []step{
				{
					apply: []string{`
metadata: {name: deny-all, namespace: x}
spec:
  podSelector: {}
  policyTypes: [Ingress, Egress]`},
					checks: []check{{proto: tcp, port: 80, expect: []expect{denyAllFrom("x/*"), denyAllTo("x/*")}}},
				},
				{
					delete: []string{"x/deny-all"},
					checks: []check{{proto: tcp, port: 80, probes: []probe{{"x/a", "8.8.8.8", true}, {"8.8.8.8", "x/a", true}}}},
				},
			},
		},
		{
			// As upstream: the ipBlock is the server pod's address (y/b is
			// 10.244.2.11), and it selects the pod.
			name: "should allow egress access to server in CIDR block",
			steps: []step{{
				apply: []string{`
metadata: {name: allow-client-a-via-cidr-egress-rule, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  policyTypes: [Egress]
  egress:
  - to: [{ipBlock: {cidr: 10.244.2.11/32}}]`},
				checks: []check{{proto: tcp, port: 80, expect: []expect{denyAllFrom("x/a"), {"x/a", "y/b", true}}, probes: []probe{
					{"x/a", "10.244.2.11", true}, {"x/a", "10.244.2.12", false},
				}}},
			}},
		},
		{
			// As upstream: the block is the server's /24 (namespace x's
			// pods here) with the server's own address excepted.
			name: "should enforce except clause while egress access to server in CIDR block",
			steps: []step{{
				apply: []string{`
metadata: {name: deny-client-a-via-except-cidr-egress-rule, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  policyTypes: [Egress]
  egress:
  - to: [{ipBlock: {cidr: 10.244.1.0/24, except: [10.244.1.11/32]}}]`}, // x/b excepted
				checks: []check{{proto: tcp, port: 80, expect: []expect{denyAllFrom("x/a"), {"x/a", "x/c", true}}}},
			}},
		},
		{
			name: "should ensure an IP overlapping both IPBlock.CIDR and IPBlock.Except is allowed",
			steps: []step{
				{
					apply: []string{`
metadata: {name: deny-client-a-via-except-cidr-egress-rule, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  policyTypes: [Egress]
  egress:
  - to: [{ipBlock: {cidr: 10.244.1.0/24, except: [10.244.1.11/32]}}]`},
					checks: []check{{proto: tcp, port: 80, expect: []expect{denyAllFrom("x/a"), {"x/a", "x/c", true}}}},
				},
				{
					apply: []string{`
metadata: {name: allow-client-a-via-cidr-egress-rule, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  policyTypes: [Egress]
  egress:
  - to: [{ipBlock: {cidr: 10.244.1.11/32}}]`},
					checks: []check{{proto: tcp, port: 80, expect: []expect{denyAllFrom("x/a"), {"x/a", "x/b", true}, {"x/a", "x/c", true}}}},
				},
			},
		},
		{
			name: "ingress from an ipBlock selects the pods whose addresses are in it",
			steps: []step{{
				apply: []string{`
metadata: {name: from-block, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  policyTypes: [Ingress]
  ingress:
  - from: [{ipBlock: {cidr: 10.244.2.0/24, except: [10.244.2.12/32]}}]`}, // y/a, y/b; y/c excepted
				checks: []check{{proto: tcp, port: 80, expect: []expect{denyAllTo("x/a"), {"y/a", "x/a", true}, {"y/b", "x/a", true}}, probes: []probe{
					{"203.0.113.1", "x/a", false},
				}}},
			}},
		},
		{
			name: "should allow egress access to server in CIDR block (external addresses)",
			steps: []step{{
				apply: []string{`
metadata: {name: allow-client-a-via-cidr-egress-rule, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  policyTypes: [Egress]
  egress:
  - to: [{ipBlock: {cidr: 203.0.113.0/24}}]`},
				checks: []check{{proto: tcp, port: 80, expect: []expect{denyAllFrom("x/a")}, probes: []probe{
					{"x/a", "203.0.113.10", true}, {"x/a", "198.51.100.10", false}, {"x/b", "198.51.100.10", true},
				}}},
			}},
		},
		{
			name: "should enforce except clause while egress access to server in CIDR block (external addresses)",
			steps: []step{{
				apply: []string{`
metadata: {name: allow-client-a-via-cidr-egress-rule, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  policyTypes: [Egress]
  egress:
  - to: [{ipBlock: {cidr: 203.0.113.0/24, except: [203.0.113.128/25]}}]`},
				checks: []check{{proto: tcp, port: 80, expect: []expect{denyAllFrom("x/a")}, probes: []probe{
					{"x/a", "203.0.113.10", true}, {"x/a", "203.0.113.200", false}, {"x/a", "203.0.114.1", false},
				}}},
			}},
		},
		{
			name: "should ensure an IP overlapping both IPBlock.CIDR and IPBlock.Except is allowed (by another policy)",
			steps: []step{
				{
					apply: []string{`
metadata: {name: allow-client-a-via-cidr-egress-rule, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  policyTypes: [Egress]
  egress:
  - to: [{ipBlock: {cidr: 203.0.113.0/24, except: [203.0.113.128/25]}}]`},
					checks: []check{{proto: tcp, port: 80, expect: []expect{denyAllFrom("x/a")}, probes: []probe{{"x/a", "203.0.113.200", false}}}},
				},
				{
					apply: []string{`
metadata: {name: allow-client-a-to-200, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  policyTypes: [Egress]
  egress:
  - to: [{ipBlock: {cidr: 203.0.113.200/32}}]`},
					checks: []check{{proto: tcp, port: 80, expect: []expect{denyAllFrom("x/a")}, probes: []probe{
						{"x/a", "203.0.113.200", true}, {"x/a", "203.0.113.201", false}, {"x/a", "203.0.113.10", true},
					}}},
				},
			},
		},
		{
			name: "should enforce policies to check ingress and egress policies can be controlled independently based on PodSelector",
			steps: []step{
				{
					apply: []string{`
metadata: {name: allow-egress-for-target, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  policyTypes: [Egress]
  egress: [{}]`},
					checks: []check{{proto: tcp, port: 80}},
				},
				{
					apply: []string{`
metadata: {name: deny-ingress-via-label-selector, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  policyTypes: [Ingress]`},
					checks: []check{{proto: tcp, port: 80, expect: []expect{denyAllTo("x/a")}}},
				},
			},
		},
		{
			name: "should not mistakenly treat 'protocol: SCTP' as 'protocol: TCP', even if the plugin doesn't support SCTP",
			steps: []step{{
				apply: []string{`
metadata: {name: deny-ingress, namespace: x}
spec:
  podSelector: {}
  policyTypes: [Ingress]`, `
metadata: {name: allow-only-sctp-ingress-on-port-81, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress:
  - ports: [{port: 81, protocol: SCTP}]`},
				checks: []check{
					{proto: tcp, port: 81, expect: []expect{denyAllTo("x/*")}},
					{proto: sctp, port: 81, expect: []expect{denyAllTo("x/*"), {"*", "x/a", true}}},
				},
			}},
		},
		{
			name: "should properly isolate pods that are selected by a policy allowing SCTP, even if the plugin doesn't support SCTP",
			steps: []step{{
				apply: []string{`
metadata: {name: allow-only-sctp-ingress-on-port-80, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress:
  - ports: [{port: 80, protocol: SCTP}]`},
				checks: []check{
					{proto: tcp, port: 81, expect: []expect{denyAllTo("x/a")}},
					{proto: sctp, port: 80},
				},
			}},
		},
		{
			name: "should not allow access by TCP when a policy specifies only UDP",
			steps: []step{{
				apply: []string{`
metadata: {name: allow-only-udp-ingress-on-port-81, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress:
  - ports: [{port: 81, protocol: UDP}]`},
				checks: []check{
					{proto: tcp, port: 81, expect: []expect{denyAllTo("x/a")}},
					{proto: udp, port: 81},
				},
			}},
		},
		{
			name: "should enforce policy to allow traffic based on NamespaceSelector with MatchLabels using default ns label",
			steps: []step{{
				apply: []string{`
metadata: {name: allow-client-a-via-ns-selector-for-immutable-ns-label, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress:
  - from: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: "y"}}}]`},
				checks: []check{{proto: tcp, port: 80, expect: []expect{{"x/*", "x/a", false}, {"z/*", "x/a", false}}}},
			}},
		},
		{
			name: "should enforce policy based on NamespaceSelector with MatchExpressions using default ns label",
			steps: []step{{
				apply: []string{`
metadata: {name: allow-ns-y-match-selector-for-immutable-ns-label, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  policyTypes: [Egress]
  egress:
  - to: [{namespaceSelector: {matchExpressions: [{key: kubernetes.io/metadata.name, operator: NotIn, values: ["y"]}]}}]`},
				checks: []check{{proto: tcp, port: 80, expect: []expect{{"x/a", "y/*", false}}, probes: []probe{{"x/a", "8.8.8.8", false}}}},
			}},
		},
		{
			name: "policyTypes absent with only egress rules isolates both directions",
			steps: []step{{
				apply: []string{`
metadata: {name: egress-dns-only, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  egress:
  - ports: [{port: 53, protocol: UDP}]`},
				checks: []check{
					{proto: tcp, port: 80, expect: []expect{denyAllTo("x/a"), denyAllFrom("x/a")}},
					{proto: udp, port: 53, expect: []expect{denyAllTo("x/a")}, probes: []probe{{"x/a", "8.8.8.8", true}}},
				},
			}},
		},
		{
			name: "policyTypes Egress only: ingress rules present are ignored",
			steps: []step{{
				apply: []string{`
metadata: {name: egress-only, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  policyTypes: [Egress]
  ingress:
  - from: [{podSelector: {matchLabels: {pod: b}}}]
  egress:
  - to: [{podSelector: {matchLabels: {pod: b}}}]`},
				checks: []check{{proto: tcp, port: 80, expect: []expect{denyAllFrom("x/a"), {"x/a", "x/b", true}}}},
			}},
		},
		{
			name: "policyTypes Ingress only: egress rules present are ignored",
			steps: []step{{
				apply: []string{`
metadata: {name: ingress-only, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  policyTypes: [Ingress]
  ingress: [{}]
  egress:
  - to: [{podSelector: {matchLabels: {pod: nobody}}}]`},
				checks: []check{{proto: tcp, port: 80, probes: []probe{{"x/a", "8.8.8.8", true}}}},
			}},
		},
		{
			name: "default deny egress with DNS allowed to kube-dns on port 53",
			steps: []step{{
				change: func(c *cluster) {
					c.addNamespace("kube-system", nil)
					c.addPod("kube-system", "coredns", map[string]string{"k8s-app": "kube-dns"}, "10.244.9.10", []corev1.ContainerPort{
						{Name: "dns", ContainerPort: 53, Protocol: corev1.ProtocolUDP}, {Name: "dns-tcp", ContainerPort: 53, Protocol: corev1.ProtocolTCP},
					})
				},
				apply: []string{`
metadata: {name: default-deny-egress, namespace: x}
spec:
  podSelector: {}
  policyTypes: [Egress]`, `
metadata: {name: allow-dns, namespace: x}
spec:
  podSelector: {}
  policyTypes: [Egress]
  egress:
  - to:
    - namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: kube-system}}
      podSelector: {matchLabels: {k8s-app: kube-dns}}
    ports: [{port: 53, protocol: UDP}, {port: 53, protocol: TCP}]`},
				checks: []check{
					{proto: udp, port: 53, expect: []expect{denyAllFrom("x/*"), {"x/*", "kube-system/coredns", true}}, probes: []probe{{"x/a", "8.8.8.8", false}}},
					{proto: tcp, port: 53, expect: []expect{denyAllFrom("x/*"), {"x/*", "kube-system/coredns", true}}},
					{proto: tcp, port: 80, expect: []expect{denyAllFrom("x/*")}},
				},
			}},
		},
		{
			name: "endPort ranges",
			steps: []step{{
				apply: []string{`
metadata: {name: ranges, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress:
  - ports: [{port: 80, endPort: 81}]`, `
metadata: {name: high-udp, namespace: x}
spec:
  podSelector: {matchLabels: {pod: b}}
  ingress:
  - ports: [{protocol: UDP, port: 1024, endPort: 65535}]`},
				checks: []check{
					{proto: tcp, port: 79, expect: []expect{denyAllTo("x/a"), denyAllTo("x/b")}},
					{proto: tcp, port: 80, expect: []expect{denyAllTo("x/b")}},
					{proto: tcp, port: 81, expect: []expect{denyAllTo("x/b")}},
					{proto: tcp, port: 82, expect: []expect{denyAllTo("x/a"), denyAllTo("x/b")}},
					{proto: udp, port: 80, expect: []expect{denyAllTo("x/a"), denyAllTo("x/b")}},
					{proto: udp, port: 1023, expect: []expect{denyAllTo("x/a"), denyAllTo("x/b")}},
					{proto: udp, port: 1024, expect: []expect{denyAllTo("x/a")}},
					{proto: udp, port: 40000, expect: []expect{denyAllTo("x/a")}},
					{proto: udp, port: 65535, expect: []expect{denyAllTo("x/a")}},
					{proto: tcp, port: 40000, expect: []expect{denyAllTo("x/a"), denyAllTo("x/b")}},
				},
			}},
		},
		{
			name: "from and ports present but empty match every source and every port",
			steps: []step{{
				apply: []string{`
metadata: {name: empty-lists, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  policyTypes: [Ingress, Egress]
  ingress:
  - {from: [], ports: []}
  egress:
  - {to: [], ports: [{port: 80}]}`},
				checks: []check{
					{proto: tcp, port: 80, probes: []probe{{"8.8.8.8", "x/a", true}, {"x/a", "8.8.8.8", true}}},
					{proto: udp, port: 9999, expect: []expect{denyAllFrom("x/a")}, probes: []probe{{"8.8.8.8", "x/a", true}}},
				},
			}},
		},
		{
			name: "IPv6 ipBlock with except",
			steps: []step{{
				apply: []string{`
metadata: {name: v6, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  policyTypes: [Egress]
  egress:
  - to: [{ipBlock: {cidr: "2001:db8::/32", except: ["2001:db8:ff::/48"]}}]`},
				checks: []check{{proto: tcp, port: 443, expect: []expect{denyAllFrom("x/a")}, probes: []probe{
					{"x/a", "2001:db8:1::1", true}, {"x/a", "2001:db8:ff::1", false}, {"x/a", "2001:db9::1", false}, {"x/a", "192.0.2.1", false},
				}}},
			}},
		},
		{
			name: "a policy in another namespace does not affect pods with the selected labels",
			steps: []step{{
				apply: []string{`
metadata: {name: deny-a, namespace: "y"}
spec:
  podSelector: {matchLabels: {pod: a}}
  policyTypes: [Ingress, Egress]`},
				checks: []check{{proto: tcp, port: 80, expect: []expect{denyAllTo("y/a"), denyAllFrom("y/a")}}},
			}},
		},
		{
			name: "egress to an ipBlock with except does not block pod-to-pod traffic the policy allows",
			steps: []step{{
				apply: []string{`
metadata: {name: world-and-pods, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  policyTypes: [Egress]
  egress:
  - to:
    - ipBlock: {cidr: 0.0.0.0/0, except: [10.0.0.0/8]}
    - namespaceSelector: {}`},
				checks: []check{{proto: tcp, port: 80, probes: []probe{
					{"x/a", "8.8.8.8", true}, {"x/a", "10.1.2.3", false}, {"x/a", "10.244.2.11", true}, // 10.244.2.11 is y/b
				}}},
			}},
		},
		{
			name: "egress to 0.0.0.0/0 allows pods too; an except takes them out",
			steps: []step{
				{
					apply: []string{`
metadata: {name: world-only, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  policyTypes: [Egress]
  egress:
  - to: [{ipBlock: {cidr: 0.0.0.0/0}}]`},
					// An ipBlock selects every address in it, pods' included.
					checks: []check{{proto: tcp, port: 80, probes: []probe{{"x/a", "8.8.8.8", true}, {"x/a", "10.1.2.3", true}, {"x/a", "10.244.2.11", true}}}},
				},
				{
					// An except in one policy is no deny: another policy's
					// allow of pods stands.
					apply: []string{`
metadata: {name: world-only, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  policyTypes: [Egress]
  egress:
  - to: [{ipBlock: {cidr: 0.0.0.0/0, except: [10.0.0.0/8]}}]`, `
metadata: {name: pods-of-x, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  policyTypes: [Egress]
  egress:
  - to: [{podSelector: {}}]`},
					checks: []check{{proto: tcp, port: 80, expect: []expect{denyAllFrom("x/a"), {"x/a", "x/*", true}}, probes: []probe{
						{"x/a", "8.8.8.8", true}, {"x/a", "10.1.2.3", false},
					}}},
				},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newCluster(t)
			for i, st := range tt.steps {
				if st.change != nil {
					st.change(c)
				}
				c.apply(st.apply...)
				for _, key := range st.delete {
					ns, name, _ := strings.Cut(key, "/")
					if _, n := Delete(c.repo, ns, name); n == 0 {
						t.Fatalf("step %d: delete %s removed no rule", i+1, key)
					}
				}
				snap := c.snapshot()
				for _, ck := range st.checks {
					snap.verify(t, fmt.Sprintf("step %d", i+1), ck)
				}
			}
		})
	}
}
