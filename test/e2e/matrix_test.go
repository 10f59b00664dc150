package e2e_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	networkingv1client "k8s.io/client-go/kubernetes/typed/networking/v1"

	"github.com/tendril-net/tendril/pkg/lab/workload"
)

// matrixPods are the upstream netpol suite's model: namespaces x, y, z,
// pods a, b, c in each, spread over both nodes so most pairs cross nodes.
var (
	matrixNS   = []string{"x", "y", "z"}
	matrixPods = []string{"a", "b", "c"}
)

type reach map[string]bool // "x/a->y/b" → connected

// probeManyEnv makes the test binary, started inside a pod by `tendril
// lab exec` (so in the pod's network namespace and cgroup, as `lab probe`
// runs), probe several TCP addresses at once: one process per source pod
// and measurement instead of one `lab probe` per pair, which on a
// loaded machine made a matrix of 72 probes take most of a minute.
const probeManyEnv = "TDR_E2E_PROBE_MANY"

// runProbeMany probes each address of spec (space-separated HOST:PORTs)
// as `lab probe` does (connect, ask, an answer within 1 s) and prints
// whether each answered, as a JSON array in their order.
func runProbeMany(spec string) int {
	addrs := strings.Fields(spec)
	answered := make([]bool, len(addrs))
	var wg sync.WaitGroup
	for i, addr := range addrs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := workload.ProbeFrom(context.Background(), nil, addr, false, time.Second)
			answered[i] = err == nil
		}()
	}
	wg.Wait()
	if err := json.NewEncoder(os.Stdout).Encode(answered); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	return 0
}

// measure probes every pod to every other pod's TCP port 80, from inside
// the pods of lab: each source pod's probes at once (runProbeMany), a
// few sources at a time.
func (e *env) measure(t *testing.T, lab string, ips map[string]string) reach {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	out := reach{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, 3)
	for _, from := range podNames() {
		var targets, addrs []string
		for _, to := range podNames() {
			if from != to { // a pod's traffic to itself never leaves it
				targets = append(targets, to)
				addrs = append(addrs, net.JoinHostPort(ips[to], "80"))
			}
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			cmd := exec.Command(tendrilBin, "lab", "--name", lab, "exec", "e2e"+from, "--", self)
			cmd.Env = append(os.Environ(), probeManyEnv+"="+strings.Join(addrs, " "))
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			var answered []bool
			if err := cmd.Run(); err != nil {
				t.Errorf("probes from %s: could not probe: %v\n%s", from, err, stderr.String())
			} else if err := json.Unmarshal(stdout.Bytes(), &answered); err != nil || len(answered) != len(targets) {
				t.Errorf("probes from %s: output %q (%v)", from, stdout.String(), err)
			}
			mu.Lock()
			defer mu.Unlock()
			for i, to := range targets {
				out[from+"->"+to] = i < len(answered) && answered[i]
			}
		}()
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

// reachabilityMatrix is the matrix on lab (e its env) over IPv4: the pods
// created in namespaces e2ex, e2ey, e2ez, the policies applied one after
// another. TestPrivilegedLabWireGuard runs it with encryption on.
func reachabilityMatrix(t *testing.T, e *env, lab string) {
	matrixSteps(t, e, lab, matrixPodsUp(t, e, false))
}

// matrixPodsUp creates the matrix's namespaces and pods, alternating over
// node1 and node2, and returns each pod's address of one family (IPv6:
// a dual-stack lab's second address, status.podIPs).
func matrixPodsUp(t *testing.T, e *env, ipv6 bool) map[string]string {
	t.Helper()
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
			pod := e.waitReady(t, "e2e"+ns, p)
			ips[ns+"/"+p] = pod.Status.PodIP
			if ipv6 {
				ips[ns+"/"+p] = podIPv6(t, pod).String()
			}
		}
	}
	return ips
}

// matrixSteps applies the policies one after another to the pods at ips
// (one family) and measures the matrix after each; it leaves no policy.
// The "block" of the CIDR cases is the pod CIDR a node has of the
// family (/24 of IPv4, /64 of IPv6), so its except and overlap cases
// mean the same in both.
func matrixSteps(t *testing.T, e *env, lab string, ips map[string]string) {
	block := 24
	if netip.MustParseAddr(ips["x/b"]).Is6() {
		block = 64
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
		{"should allow egress access to server in CIDR block (y/b's own /32 or /128)", func() error {
			return createEgressBlock(ctx, np, "e2ex", "allow-client-a-via-cidr-egress-rule", "a", hostCIDR(ips["y/b"]), nil)
		}, func(from, to string) bool { return from != "x/a" || to == "y/b" }},
		{"should enforce except clause while egress access to server in CIDR block (x/b's node's pod CIDR, /24 or /64, except x/b)", func() error {
			if err := np.NetworkPolicies("e2ex").Delete(ctx, "allow-client-a-via-cidr-egress-rule", metav1.DeleteOptions{}); err != nil {
				return err
			}
			return createEgressBlock(ctx, np, "e2ex", "deny-client-a-via-except-cidr-egress-rule", "a", blockCIDR(ips["x/b"], block), []string{hostCIDR(ips["x/b"])})
		}, func(from, to string) bool {
			return from != "x/a" || (to != "x/b" && netip.MustParsePrefix(blockCIDR(ips["x/b"], block)).Contains(netip.MustParseAddr(ips[to])))
		}},
		{"should ensure an IP overlapping both IPBlock.CIDR and IPBlock.Except is allowed", func() error {
			return createEgressBlock(ctx, np, "e2ex", "allow-client-a-via-cidr-egress-rule", "a", hostCIDR(ips["x/b"]), nil)
		}, func(from, to string) bool {
			return from != "x/a" || netip.MustParsePrefix(blockCIDR(ips["x/b"], block)).Contains(netip.MustParseAddr(ips[to]))
		}},
		{"ingress from an ipBlock (y/b's own /32 or /128) selects the pod", func() error {
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
			var wrong []string
			for k, w := range want {
				if got[k] != w {
					wrong = append(wrong, fmt.Sprintf("%s connected=%v, want %v", k, got[k], w))
				}
			}
			sort.Strings(wrong)
			return len(wrong) == 0, fmt.Errorf("matrix differs in %d cells: %s\n%s", len(wrong), strings.Join(wrong, "; "), table(got))
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
