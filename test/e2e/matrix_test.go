package e2e_test

import (
	"context"
	"fmt"
	"net/netip"
	"os/exec"
	"strings"
	"sync"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	networkingv1client "k8s.io/client-go/kubernetes/typed/networking/v1"
)

// matrixPods are the upstream netpol suite's model: namespaces x, y, z,
// pods a, b, c in each, spread over both nodes so most pairs cross nodes.
var (
	matrixNS   = []string{"x", "y", "z"}
	matrixPods = []string{"a", "b", "c"}
)

type reach map[string]bool // "x/a->y/b" → connected

// measure probes every pod to every other pod's TCP port 80, from inside
// the pods of lab, many at once.
func (e *env) measure(t *testing.T, lab string, ips map[string]string) reach {
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
				cmd := exec.Command(tendrilBin, "lab", "--name", lab, "probe", "e2e"+from, ips[to]+":80", "--timeout", "1s")
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
	reachabilityMatrix(t, labUp(t), labName)
}

// reachabilityMatrix is the matrix on lab (e its env): the pods created in
// namespaces e2ex, e2ey, e2ez, the policies applied one after another.
// TestPrivilegedLabWireGuard runs it with encryption on.
func reachabilityMatrix(t *testing.T, e *env, lab string) {
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
		// The upstream suite's CIDR cases as upstream writes them: blocks
		// built from pod addresses select those pods.
		{"should allow egress access to server in CIDR block (y/b's /32)", func() error {
			return createEgressBlock(ctx, np, "e2ex", "allow-client-a-via-cidr-egress-rule", "a", hostCIDR(ips["y/b"]), nil)
		}, func(from, to string) bool { return from != "x/a" || to == "y/b" }},
		{"should enforce except clause while egress access to server in CIDR block (x/b's /24 except x/b)", func() error {
			if err := np.NetworkPolicies("e2ex").Delete(ctx, "allow-client-a-via-cidr-egress-rule", metav1.DeleteOptions{}); err != nil {
				return err
			}
			return createEgressBlock(ctx, np, "e2ex", "deny-client-a-via-except-cidr-egress-rule", "a", blockCIDR(ips["x/b"], 24), []string{hostCIDR(ips["x/b"])})
		}, func(from, to string) bool {
			return from != "x/a" || (to != "x/b" && netip.MustParsePrefix(blockCIDR(ips["x/b"], 24)).Contains(netip.MustParseAddr(ips[to])))
		}},
		{"should ensure an IP overlapping both IPBlock.CIDR and IPBlock.Except is allowed", func() error {
			return createEgressBlock(ctx, np, "e2ex", "allow-client-a-via-cidr-egress-rule", "a", hostCIDR(ips["x/b"]), nil)
		}, func(from, to string) bool {
			return from != "x/a" || netip.MustParsePrefix(blockCIDR(ips["x/b"], 24)).Contains(netip.MustParseAddr(ips[to]))
		}},
		{"ingress from an ipBlock (y/b's /32) selects the pod", func() error {
			for _, name := range []string{"allow-client-a-via-cidr-egress-rule", "deny-client-a-via-except-cidr-egress-rule"} {
				if err := np.NetworkPolicies("e2ex").Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
					return err
				}
			}
			_, err := np.NetworkPolicies("e2ex").Create(ctx, &networkingv1.NetworkPolicy{
				ObjectMeta: metav1.ObjectMeta{Name: "a-from-block"},
				Spec: networkingv1.NetworkPolicySpec{
					PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"pod": "a"}},
					Ingress: []networkingv1.NetworkPolicyIngressRule{{
						From: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: hostCIDR(ips["y/b"])}}},
					}},
				},
			}, metav1.CreateOptions{})
			return err
		}, func(from, to string) bool { return to != "x/a" || from == "y/b" }},
		{"ipBlock policies deleted: everything connects again", func() error {
			return np.NetworkPolicies("e2ex").Delete(ctx, "a-from-block", metav1.DeleteOptions{})
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
			got = e.measure(t, lab, ips)
			return fmt.Sprint(got) == fmt.Sprint(want), fmt.Errorf("matrix differs")
		})
		t.Logf("%s:\n%s", s.name, table(got))
	}
}

// hostCIDR is an address's own block, as upstream builds it (/32, /128).
func hostCIDR(ip string) string {
	a := netip.MustParseAddr(ip)
	return netip.PrefixFrom(a, a.BitLen()).String()
}

// blockCIDR is the block of bits around an address.
func blockCIDR(ip string, bits int) string {
	return netip.PrefixFrom(netip.MustParseAddr(ip), bits).Masked().String()
}

// createEgressBlock creates a policy letting pods labelled pod=<pod> send
// only to an ipBlock (with excepts).
func createEgressBlock(ctx context.Context, np networkingv1client.NetworkingV1Interface, ns, name, pod, cidr string, except []string) error {
	_, err := np.NetworkPolicies(ns).Create(ctx, &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"pod": pod}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress},
			Egress: []networkingv1.NetworkPolicyEgressRule{{
				To: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: cidr, Except: except}}},
			}},
		},
	}, metav1.CreateOptions{})
	return err
}
