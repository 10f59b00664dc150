// Package netpolmatrix is the x/y/z NetworkPolicy reachability matrix of
// the upstream netpol suite's model, on a Tendril lab: namespaces x, y, z
// with pods a, b, c spread over the nodes, Kubernetes NetworkPolicies
// applied one after another, and after each the measured 9 × 9
// reachability (real TCP from inside every pod to every other) compared
// with the expected. One matrix for every lab that runs it: test/e2e's
// (IPv4 and IPv6, native, tunnel, routed, WireGuard) and the real nodes of
// test/e2e/containerd, whose pods are containers.
package netpolmatrix

import (
	"bytes"
	"cmp"
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

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	networkingv1client "k8s.io/client-go/kubernetes/typed/networking/v1"

	"github.com/tendril-net/tendril/pkg/lab"
	"github.com/tendril-net/tendril/pkg/lab/workload"
)

// The model: namespaces x, y, z, pods a, b, c in each.
var (
	namespaces = []string{"x", "y", "z"}
	pods       = []string{"a", "b", "c"}
)

// Lab is what the matrix needs of a lab.
type Lab struct {
	// Name is the lab's name (tendril lab --name).
	Name string
	// Tendril is the tendril binary (lab exec).
	Tendril string
	// Clientset reaches the lab's API server.
	Clientset kubernetes.Interface
	// Nodes the pods alternate over.
	Nodes []string
	// Pod is the pod the lab's runtime runs as a matrix pod: ns/name on
	// node with labels, answering TCP on port 80.
	Pod func(ns, name, node string, labels map[string]string) *corev1.Pod
	// NamespacePrefix starts each namespace's name (default "e2e":
	// e2ex, e2ey, e2ez).
	NamespacePrefix string
}

func (l Lab) ns(short string) string { return cmp.Or(l.NamespacePrefix, "e2e") + short }

// reach is the measured or expected matrix: "x/a->y/b" → connected.
type reach map[string]bool

// ProbeManyEnv makes the test binary, started inside a pod by `tendril
// lab exec` (so in the pod's network namespace and cgroup, as `lab probe`
// runs), probe several TCP addresses at once: one process per source pod
// and measurement instead of one `lab probe` per pair, which on a loaded
// machine made a matrix of 72 probes take most of a minute.
const ProbeManyEnv = "TDR_E2E_PROBE_MANY"

// RunProberIfAsked is for the TestMain of a package that runs the
// matrix, before anything else: started as the prober inside a pod, the
// test binary probes and exits here.
func RunProberIfAsked() {
	if spec := os.Getenv(ProbeManyEnv); spec != "" {
		os.Exit(runProbeMany(spec))
	}
}

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

// Run is the matrix over IPv4: the pods created, the policies applied one
// after another.
func Run(t *testing.T, l Lab) {
	Steps(t, l, PodsUp(t, l, false))
}

// PodsUp creates the matrix's namespaces and pods, alternating over the
// lab's nodes, and returns each pod's address of one family (IPv6: a
// dual-stack lab's, from status.podIPs).
func PodsUp(t *testing.T, l Lab, ipv6 bool) map[string]string {
	t.Helper()
	ctx := context.Background()
	cs := l.Clientset
	i := 0
	for _, short := range namespaces {
		ns := l.ns(short)
		if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		poll(t, "the default ServiceAccount of "+ns, func() (bool, error) {
			_, err := cs.CoreV1().ServiceAccounts(ns).Get(ctx, "default", metav1.GetOptions{})
			return err == nil, err
		})
		for _, p := range pods {
			pod := l.Pod(ns, p, l.Nodes[i%len(l.Nodes)], map[string]string{"pod": p})
			if _, err := cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
				t.Fatalf("create pod %s/%s: %v", ns, p, err)
			}
			i++
		}
	}
	ips := map[string]string{}
	for _, short := range namespaces {
		for _, p := range pods {
			ns := l.ns(short)
			var pod *corev1.Pod
			poll(t, "pod "+ns+"/"+p+" ready", func() (bool, error) {
				got, err := cs.CoreV1().Pods(ns).Get(ctx, p, metav1.GetOptions{})
				if err != nil {
					return false, err
				}
				pod = got
				return lab.PodReady(got), fmt.Errorf("phase %s", got.Status.Phase)
			})
			addr, err := podAddr(pod, ipv6)
			if err != nil {
				t.Fatal(err)
			}
			ips[short+"/"+p] = addr.String()
		}
	}
	return ips
}

// podAddr is the pod's one address of the family.
func podAddr(p *corev1.Pod, ipv6 bool) (netip.Addr, error) {
	var found []netip.Addr
	for _, ip := range p.Status.PodIPs {
		a, err := netip.ParseAddr(ip.IP)
		if err != nil {
			return netip.Addr{}, fmt.Errorf("pod %s/%s podIPs %v: %w", p.Namespace, p.Name, p.Status.PodIPs, err)
		}
		if a.Is6() == ipv6 {
			found = append(found, a)
		}
	}
	if len(found) != 1 {
		return netip.Addr{}, fmt.Errorf("pod %s/%s podIPs %v: want one address of the family (IPv6 %v)", p.Namespace, p.Name, p.Status.PodIPs, ipv6)
	}
	return found[0], nil
}

// Steps applies the policies one after another to the pods at ips (one
// family) and measures the matrix after each; it leaves no policy. The
// "block" of the CIDR cases is the pod CIDR a node has of the family (/24
// of IPv4, /64 of IPv6), so its except and overlap cases mean the same in
// both.
func Steps(t *testing.T, l Lab, ips map[string]string) {
	block := 24
	if netip.MustParseAddr(ips["x/b"]).Is6() {
		block = 64
	}
	ctx := context.Background()
	np := l.Clientset.NetworkingV1()
	port80 := intstr.FromInt32(80)

	steps := []struct {
		name   string
		apply  func() error
		expect func(from, to string) bool
	}{
		{"no policy: everything connects", func() error { return nil }, func(string, string) bool { return true }},
		{"default deny ingress in x", func() error {
			_, err := np.NetworkPolicies(l.ns("x")).Create(ctx, &networkingv1.NetworkPolicy{
				ObjectMeta: metav1.ObjectMeta{Name: "deny-all"},
				Spec:       networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}},
			}, metav1.CreateOptions{})
			return err
		}, func(from, to string) bool { return !strings.HasPrefix(to, "x/") }},
		{"x/a also admits namespace y on port 80", func() error {
			_, err := np.NetworkPolicies(l.ns("x")).Create(ctx, &networkingv1.NetworkPolicy{
				ObjectMeta: metav1.ObjectMeta{Name: "a-from-y"},
				Spec: networkingv1.NetworkPolicySpec{
					PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"pod": "a"}},
					Ingress: []networkingv1.NetworkPolicyIngressRule{{
						From:  []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": l.ns("y")}}}},
						Ports: []networkingv1.NetworkPolicyPort{{Port: &port80}},
					}},
				},
			}, metav1.CreateOptions{})
			return err
		}, func(from, to string) bool {
			return !strings.HasPrefix(to, "x/") || (to == "x/a" && strings.HasPrefix(from, "y/"))
		}},
		{"z/b may only talk to pods labelled pod=c (egress)", func() error {
			_, err := np.NetworkPolicies(l.ns("z")).Create(ctx, &networkingv1.NetworkPolicy{
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
			for _, d := range [][2]string{{l.ns("x"), "deny-all"}, {l.ns("x"), "a-from-y"}, {l.ns("z"), "b-egress"}} {
				if err := np.NetworkPolicies(d[0]).Delete(ctx, d[1], metav1.DeleteOptions{}); err != nil {
					return err
				}
			}
			return nil
		}, func(string, string) bool { return true }},
		// The upstream suite's CIDR cases as upstream writes them: blocks
		// built from pod addresses select those pods.
		{"should allow egress access to server in CIDR block (y/b's own /32 or /128)", func() error {
			return createEgressBlock(ctx, np, l.ns("x"), "allow-client-a-via-cidr-egress-rule", "a", hostCIDR(ips["y/b"]), nil)
		}, func(from, to string) bool { return from != "x/a" || to == "y/b" }},
		{"should enforce except clause while egress access to server in CIDR block (x/b's node's pod CIDR, /24 or /64, except x/b)", func() error {
			if err := np.NetworkPolicies(l.ns("x")).Delete(ctx, "allow-client-a-via-cidr-egress-rule", metav1.DeleteOptions{}); err != nil {
				return err
			}
			return createEgressBlock(ctx, np, l.ns("x"), "deny-client-a-via-except-cidr-egress-rule", "a", blockCIDR(ips["x/b"], block), []string{hostCIDR(ips["x/b"])})
		}, func(from, to string) bool {
			return from != "x/a" || (to != "x/b" && netip.MustParsePrefix(blockCIDR(ips["x/b"], block)).Contains(netip.MustParseAddr(ips[to])))
		}},
		{"should ensure an IP overlapping both IPBlock.CIDR and IPBlock.Except is allowed", func() error {
			return createEgressBlock(ctx, np, l.ns("x"), "allow-client-a-via-cidr-egress-rule", "a", hostCIDR(ips["x/b"]), nil)
		}, func(from, to string) bool {
			return from != "x/a" || netip.MustParsePrefix(blockCIDR(ips["x/b"], block)).Contains(netip.MustParseAddr(ips[to]))
		}},
		{"ingress from an ipBlock (y/b's own /32 or /128) selects the pod", func() error {
			for _, name := range []string{"allow-client-a-via-cidr-egress-rule", "deny-client-a-via-except-cidr-egress-rule"} {
				if err := np.NetworkPolicies(l.ns("x")).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
					return err
				}
			}
			_, err := np.NetworkPolicies(l.ns("x")).Create(ctx, &networkingv1.NetworkPolicy{
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
			return np.NetworkPolicies(l.ns("x")).Delete(ctx, "a-from-block", metav1.DeleteOptions{})
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
		// Policy takes a moment to reach every agent: measure until the
		// matrix settles on the expectation, or report the last one.
		var got reach
		poll(t, s.name, func() (bool, error) {
			got = measure(t, l, ips)
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

// measure probes every pod to every other pod's TCP port 80, from inside
// the pods: each source pod's probes at once (runProbeMany, the test
// binary started in the pod), a few sources at a time.
func measure(t *testing.T, l Lab, ips map[string]string) reach {
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
			cmd := exec.Command(l.Tendril, "lab", "--name", l.Name, "exec", cmp.Or(l.NamespacePrefix, "e2e")+from, "--", self)
			cmd.Env = append(os.Environ(), ProbeManyEnv+"="+strings.Join(addrs, " "))
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
	for _, ns := range namespaces {
		for _, p := range pods {
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

// poll retries cond until it holds; the deadline only keeps a broken lab
// from hanging the test.
func poll(t *testing.T, what string, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		ok, err := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s (last: %v)", what, err)
		}
		time.Sleep(100 * time.Millisecond)
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
