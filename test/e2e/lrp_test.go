package e2e_test

import (
	"context"
	"fmt"
	"net"
	"regexp"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	v1alpha1 "github.com/tendril-net/tendril/pkg/k8s/apis/tendril.io/v1alpha1"
)

// answeredName is the pod that answered a `lab probe` (the lab workload
// answers with its name).
var answeredName = regexp.MustCompile(`answered "([a-z0-9-]+)`)

// TestPrivilegedLabLocalRedirect: the node-local cache pattern on the lab.
// A Service's pods run on node 2; a TendrilLocalRedirectPolicy selects the
// cache pod on node 1. A client on node 1 reaching the ClusterIP gets the
// cache (TCP and UDP, socket LB; TCP per packet from outside the node's
// cgroup), a client on node 2, which has no cache pod, gets the Service's
// own pod; with skipRedirectFromBackend the cache pod itself reaches the
// Service's pod while node 1's client still gets the cache; with the cache
// pod deleted, node 1's client falls back to the Service.
func TestPrivilegedLabLocalRedirect(t *testing.T) {
	e := labUp(t)
	ctx := context.Background()
	const ns = "e2e-lrp"
	e.createNamespace(t, ns)
	t.Cleanup(func() { _ = e.cs.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{}) })
	node1, node2 := e.st.Nodes[0], e.st.Nodes[1]
	e.createPod(t, ns, "cache", node1.Name, map[string]string{"app": "lrp-cache"})
	e.createPod(t, ns, "upstream", node2.Name, map[string]string{"app": "lrp-upstream"})
	e.createPod(t, ns, "client-1", node1.Name, map[string]string{"app": "lrp-client"})
	e.createPod(t, ns, "client-2", node2.Name, map[string]string{"app": "lrp-client"})
	for _, p := range []string{"cache", "upstream", "client-1", "client-2"} {
		e.waitReady(t, ns, p)
	}
	svc, err := e.cs.CoreV1().Services(ns).Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "resolver"},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "lrp-upstream"}, Ports: []corev1.ServicePort{
			{Name: "tcp", Protocol: corev1.ProtocolTCP, Port: 8053, TargetPort: intstr.FromInt32(80)},
			{Name: "udp", Protocol: corev1.ProtocolUDP, Port: 8054, TargetPort: intstr.FromInt32(81)},
		}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	lrp := &v1alpha1.TendrilLocalRedirectPolicy{ObjectMeta: metav1.ObjectMeta{Name: "local-resolver", Namespace: ns},
		Spec: v1alpha1.LocalRedirectPolicySpec{
			RedirectFrontend: v1alpha1.RedirectFrontend{ServiceMatcher: &v1alpha1.LRPServiceMatcher{ServiceName: "resolver", Namespace: ns}},
			RedirectBackend: v1alpha1.RedirectBackend{LocalEndpointSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "lrp-cache"}},
				ToPorts: []v1alpha1.LRPPort{{Port: "80", Protocol: "TCP", Name: "tcp"}, {Port: "81", Protocol: "UDP", Name: "udp"}}}}}
	if _, err := e.k8.Tendril.TendrilV1alpha1().TendrilLocalRedirectPolicies(ns).Create(ctx, lrp, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tcp, udp := net.JoinHostPort(svc.Spec.ClusterIP, "8053"), net.JoinHostPort(svc.Spec.ClusterIP, "8054")
	answeredBy := func(client, target string, extra ...string) (string, error) {
		code, out := tendril(t, append([]string{"probe", ns + "/" + client, target, "--timeout", "2s"}, extra...)...)
		m := answeredName.FindStringSubmatch(out)
		if code != 0 || m == nil {
			return "", fmt.Errorf("exit %d: %s", code, out)
		}
		return m[1], nil
	}
	expect := func(what, client, target, want string, extra ...string) {
		t.Helper()
		eventually(t, what, func() (bool, error) {
			got, err := answeredBy(client, target, extra...)
			if err != nil {
				return false, err
			}
			return got == want, fmt.Errorf("answered by %s, want %s", got, want)
		})
	}
	expect("node 1's client reaches the local cache over TCP", "client-1", tcp, "cache")
	expect("node 1's client reaches the local cache over UDP", "client-1", udp, "cache", "--udp")
	expect("node 1's client reaches the local cache per packet", "client-1", tcp, "cache", "--outside-node-cgroup")
	expect("node 2's client, with no cache on its node, reaches the Service", "client-2", tcp, "upstream")
	for range 5 {
		if got, err := answeredBy("client-1", tcp); err != nil || got != "cache" {
			t.Fatalf("node 1's client answered by %q (%v), want the cache every time", got, err)
		}
	}

	// The cache's own lookups go to itself without skipRedirectFromBackend
	// (a node-local DNS cache would loop); with it, to the Service's pod
	// on the other node, by socket and per packet, while node 1's other
	// client is still redirected to the cache.
	expect("the cache pod reaches itself without skipRedirectFromBackend", "cache", tcp, "cache")
	cur, err := e.k8.Tendril.TendrilV1alpha1().TendrilLocalRedirectPolicies(ns).Get(ctx, lrp.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cur.Spec.SkipRedirectFromBackend = true
	if _, err := e.k8.Tendril.TendrilV1alpha1().TendrilLocalRedirectPolicies(ns).Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	expect("the cache pod reaches the Service's pod over TCP with skipRedirectFromBackend", "cache", tcp, "upstream")
	expect("the cache pod reaches the Service's pod over UDP with skipRedirectFromBackend", "cache", udp, "upstream", "--udp")
	expect("the cache pod reaches the Service's pod per packet with skipRedirectFromBackend", "cache", tcp, "upstream", "--outside-node-cgroup")
	for range 5 {
		if got, err := answeredBy("client-1", tcp); err != nil || got != "cache" {
			t.Fatalf("with skipRedirectFromBackend node 1's client answered by %q (%v), want the cache every time", got, err)
		}
	}

	zero := int64(0)
	if err := e.cs.CoreV1().Pods(ns).Delete(ctx, "cache", metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
	expect("node 1's client falls back to the Service over TCP", "client-1", tcp, "upstream")
	expect("node 1's client falls back to the Service over UDP", "client-1", udp, "upstream", "--udp")
}
