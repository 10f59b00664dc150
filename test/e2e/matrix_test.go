package e2e_test

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// matrixPods are the upstream netpol suite's model: namespaces x, y, z,
// pods a, b, c in each, spread over both nodes so most pairs cross nodes.
var (
	matrixNS   = []string{"x", "y", "z"}
	matrixPods = []string{"a", "b", "c"}
)

type reach map[string]bool // "x/a->y/b" → connected

// measure probes every pod to every other pod's TCP port 80, from inside
// the pods, many at once.
func (e *env) measure(t *testing.T, ips map[string]string) reach {
	t.Helper()
	out := reach{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, 12)
	for _, from := range podNames() {
		for _, to := range podNames() {
			if from == to {
				continue // a pod's traffic to itself never leaves it
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				sem <- struct{}{}
				defer func() { <-sem }()
				cmd := exec.Command(tendrilBin, "lab", "--name", labName, "probe", "e2e"+from, ips[to]+":80", "--timeout", "1s")
				err := cmd.Run()
				code := cmd.ProcessState.ExitCode()
				if err != nil && code != 1 {
					t.Errorf("probe %s -> %s: could not probe (exit %d): %v", from, to, code, err)
				}
				mu.Lock()
				out[from+"->"+to] = code == 0
				mu.Unlock()
			}()
		}
	}
	wg.Wait()
	return out
}

func podNames() []string {
	var out []string
	for _, ns := range matrixNS {
		for _, p := range matrixPods {
			out = append(out, ns+"/"+p)
		}
	}
	return out
}

// table prints a matrix as the upstream suite does: rows are sources.
func table(r reach) string {
	var b strings.Builder
	b.WriteString("        ")
	for _, to := range podNames() {
		fmt.Fprintf(&b, "%-5s", to)
	}
	b.WriteString("\n")
	for _, from := range podNames() {
		fmt.Fprintf(&b, "%-8s", from)
		for _, to := range podNames() {
			switch {
			case from == to:
				b.WriteString("-    ")
			case r[from+"->"+to]:
				b.WriteString(".    ")
			default:
				b.WriteString("X    ")
			}
		}
		b.WriteString("\n")
	}
	return b.String()
}

// TestPrivilegedLabReachabilityMatrix applies Kubernetes NetworkPolicies
// one after another and compares the measured 9 × 9 reachability (real
// TCP through both nodes' datapaths) with the expected one after each.
func TestPrivilegedLabReachabilityMatrix(t *testing.T) {
	e := labUp(t)
	nodes := []string{"node1", "node2"}
	ips := map[string]string{}
	i := 0
	for _, ns := range matrixNS {
		e.createNamespace(t, "e2e"+ns)
		for _, p := range matrixPods {
			e.createPod(t, "e2e"+ns, p, nodes[i%2], map[string]string{"pod": p})
			i++
		}
	}
	for _, ns := range matrixNS {
		for _, p := range matrixPods {
			ips[ns+"/"+p] = e.waitReady(t, "e2e"+ns, p).Status.PodIP
		}
	}
	ctx := context.Background()
	np := e.cs.NetworkingV1()
	port80 := intstr.FromInt32(80)

	steps := []struct {
		name   string
		apply  func() error
		expect func(from, to string) bool
	}{
		{"no policy: everything connects", func() error { return nil }, func(string, string) bool { return true }},
		{"default deny ingress in x", func() error {
			_, err := np.NetworkPolicies("e2ex").Create(ctx, &networkingv1.NetworkPolicy{
				ObjectMeta: metav1.ObjectMeta{Name: "deny-all"},
				Spec:       networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}},
			}, metav1.CreateOptions{})
			return err
		}, func(from, to string) bool { return !strings.HasPrefix(to, "x/") }},
		{"x/a also admits namespace y on port 80", func() error {
			_, err := np.NetworkPolicies("e2ex").Create(ctx, &networkingv1.NetworkPolicy{
				ObjectMeta: metav1.ObjectMeta{Name: "a-from-y"},
				Spec: networkingv1.NetworkPolicySpec{
					PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"pod": "a"}},
					Ingress: []networkingv1.NetworkPolicyIngressRule{{
						From:  []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": "e2ey"}}}},
						Ports: []networkingv1.NetworkPolicyPort{{Port: &port80}},
					}},
				},
			}, metav1.CreateOptions{})
			return err
		}, func(from, to string) bool {
			return !strings.HasPrefix(to, "x/") || (to == "x/a" && strings.HasPrefix(from, "y/"))
		}},
		{"z/b may only talk to pods labelled pod=c (egress)", func() error {
			_, err := np.NetworkPolicies("e2ez").Create(ctx, &networkingv1.NetworkPolicy{
				ObjectMeta: metav1.ObjectMeta{Name: "b-egress"},
				Spec: networkingv1.NetworkPolicySpec{
					PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"pod": "b"}},
					PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress},
					Egress: []networkingv1.NetworkPolicyEgressRule{{
						To: []networkingv1.NetworkPolicyPeer{{
							NamespaceSelector: &metav1.LabelSelector{},
							PodSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{"pod": "c"}},
						}},
					}},
				},
			}, metav1.CreateOptions{})
			return err
		}, func(from, to string) bool {
			if from == "z/b" && !strings.HasSuffix(to, "/c") {
				return false
			}
			return !strings.HasPrefix(to, "x/") || (to == "x/a" && strings.HasPrefix(from, "y/"))
		}},
		{"policies deleted: everything connects again", func() error {
			for _, d := range [][2]string{{"e2ex", "deny-all"}, {"e2ex", "a-from-y"}, {"e2ez", "b-egress"}} {
				if err := np.NetworkPolicies(d[0]).Delete(ctx, d[1], metav1.DeleteOptions{}); err != nil {
					return err
				}
			}
			return nil
		}, func(string, string) bool { return true }},
	}
	for _, s := range steps {
		if err := s.apply(); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		want := reach{}
		for _, from := range podNames() {
			for _, to := range podNames() {
				if from != to {
					want[from+"->"+to] = s.expect(from, to)
				}
			}
		}
		// Policy takes a moment to reach both agents: measure until the
		// matrix settles on the expectation, or report the last one.
		var got reach
		eventually(t, s.name, func() (bool, error) {
			got = e.measure(t, ips)
			return fmt.Sprint(got) == fmt.Sprint(want), fmt.Errorf("matrix differs")
		})
		t.Logf("%s:\n%s", s.name, table(got))
	}
}
