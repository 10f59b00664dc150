package containerd_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tendril-net/tendril/pkg/controlplane"
	v1alpha1 "github.com/tendril-net/tendril/pkg/k8s/apis/tendril.io/v1alpha1"
	tendrilclient "github.com/tendril-net/tendril/pkg/k8s/client/clientset/versioned"
	"github.com/tendril-net/tendril/pkg/lab"
	"github.com/tendril-net/tendril/pkg/policy/api"
	"github.com/tendril-net/tendril/pkg/testutil"
)

// TestPrivilegedLabContainerdDualStack brings up a two-node lab of real
// kubelet+containerd nodes with --ip-family dual (the chart's agents
// without ipv6-range none): each Node registers an IPv6 InternalIP and
// gets an IPv6 pod CIDR beside its IPv4 ones; pods get an address of
// each family, the IPv6 one in their Node's IPv6 pod CIDR; node1 routes
// node2's IPv6 pod CIDR via node2's IPv6 address (native routing); a pod
// on node2 reaches a pod on node1 over IPv6 by TCP, UDP and ping; then a
// policy admitting only that client: the client still connects and pings
// over IPv6, another pod of node2 is refused over IPv6 (and IPv4).
func TestPrivilegedLabContainerdDualStack(t *testing.T) {
	testutil.Privileged(t)
	binDir, imagesDir := buildLab(t)
	tendril := filepath.Join(binDir, "tendril")
	name := labName + "ds"
	t.Cleanup(func() {
		if out, err := exec.Command(tendril, "lab", "down", "--name", name).CombinedOutput(); err != nil {
			t.Errorf("lab down: %v\n%s", err, out)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	begin := time.Now()
	out, err := exec.CommandContext(ctx, tendril, "lab", "up", "--name", name, "--runtime", lab.RuntimeContainerd,
		"--nodes", "2", "--pods-per-node", "0", "--ip-family", lab.IPFamilyDual, "--bin-dir", binDir, "--images-dir", imagesDir).CombinedOutput()
	t.Logf("tendril lab up --runtime containerd --ip-family dual (%s):\n%s", time.Since(begin).Round(time.Millisecond), out)
	if err != nil {
		t.Fatalf("lab up: %v", err)
	}
	st, err := lab.LoadState(name)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := st.Clientset()
	if err != nil {
		t.Fatal(err)
	}

	// Each Node: an InternalIP of each family (the kubelet's --node-ip)
	// and a pod CIDR of each (node IPAM).
	cidr6 := map[string]netip.Prefix{}
	for _, n := range st.Nodes {
		node, err := cs.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var internal []string
		for _, a := range node.Status.Addresses {
			if a.Type == corev1.NodeInternalIP {
				internal = append(internal, a.Address)
			}
		}
		if n.Address6 == "" || len(internal) != 2 || internal[0] != n.Address || internal[1] != n.Address6 {
			t.Errorf("%s: InternalIPs %v, want [%s %s]", n.Name, internal, n.Address, n.Address6)
		}
		for _, c := range node.Spec.PodCIDRs {
			if p := netip.MustParsePrefix(c); p.Addr().Is6() {
				cidr6[n.Name] = p
			}
		}
		if len(node.Spec.PodCIDRs) != 2 || !cidr6[n.Name].IsValid() {
			t.Fatalf("%s: pod CIDRs %v, want an IPv4 and an IPv6 one", n.Name, node.Spec.PodCIDRs)
		}
	}
	n1, n2 := st.Nodes[0], st.Nodes[1]
	want := cidr6[n2.Name].String() + " via " + n2.Address6
	poll(t, "node1's route "+want, func() (bool, error) {
		out, err := exec.Command("nsenter", "--net="+lab.NetnsPath(n1.Netns), "ip", "-6", "route", "show", "proto", "85").CombinedOutput()
		return err == nil && strings.Contains(string(out), want), fmt.Errorf("%v: %s", err, out)
	})

	server, client, denied := "ds-server", "ds-client", "ds-denied"
	nodeOf := map[string]string{server: n1.Name, client: n2.Name, denied: n2.Name}
	for pod, node := range nodeOf {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: pod, Namespace: metav1.NamespaceDefault, Labels: map[string]string{"app": pod}},
			Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{lab.WorkloadContainer(st.WorkloadImage)}}}
		if _, err := cs.CoreV1().Pods(metav1.NamespaceDefault).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	ip4, ip6 := map[string]netip.Addr{}, map[string]netip.Addr{}
	poll(t, "the dual-stack test's pods Ready", func() (bool, error) {
		for pod := range nodeOf {
			p, err := cs.CoreV1().Pods(metav1.NamespaceDefault).Get(ctx, pod, metav1.GetOptions{})
			if err != nil || !lab.PodReady(p) {
				return false, err
			}
			for _, ip := range p.Status.PodIPs {
				if a := netip.MustParseAddr(ip.IP); a.Is6() {
					ip6[pod] = a
				} else {
					ip4[pod] = a
				}
			}
		}
		return true, nil
	})
	for pod, node := range nodeOf {
		if !ip4[pod].IsValid() || !ip6[pod].IsValid() || !cidr6[node].Contains(ip6[pod]) {
			t.Fatalf("pod %s on %s: IPv4 %v, IPv6 %v; want one of each, the IPv6 one in %s", pod, node, ip4[pod], ip6[pod], cidr6[node])
		}
	}
	t.Logf("server %s/%s on node1, client %s/%s and denied %s/%s on node2", ip4[server], ip6[server], ip4[client], ip6[client], ip4[denied], ip6[denied])

	probe := func(from string, addr netip.Addr, udp bool) (int, string) {
		argv := []string{"lab", "probe", "--name", name, "default/" + from, net.JoinHostPort(addr.String(), "80"), "--timeout", "1s"}
		if udp {
			argv = append(argv, "--udp")
		}
		out, err := exec.Command(tendril, argv...).CombinedOutput()
		var ee *exec.ExitError
		switch {
		case err == nil:
			return 0, string(out)
		case errors.As(err, &ee):
			return ee.ExitCode(), string(out)
		}
		t.Fatalf("lab probe: %v", err)
		return -1, ""
	}
	ping := func(from string, addr netip.Addr) error {
		out, err := exec.Command(tendril, "lab", "exec", "--name", name, "default/"+from, "--", "ping", "-6", "-n", "-c", "3", "-i", "0.2", "-W", "2", addr.String()).CombinedOutput()
		if err != nil {
			return fmt.Errorf("ping -6 %s from %s: %v\n%s", addr, from, err, out)
		}
		return nil
	}

	// IPv6 across the nodes, no policy yet: TCP and UDP answered by the
	// server itself, and ping.
	for _, from := range []string{client, denied} {
		for _, udp := range []bool{false, true} {
			poll(t, fmt.Sprintf("%s -> [%s]:80 (udp %v)", from, ip6[server], udp), func() (bool, error) {
				c, out := probe(from, ip6[server], udp)
				return c == 0 && strings.Contains(out, server), fmt.Errorf("exit %d: %s", c, out)
			})
		}
	}
	if err := ping(client, ip6[server]); err != nil {
		t.Error(err)
	}

	// The server admits the client only: the denied pod's IPv6 peer is
	// refused, the client's allowed (TCP and ping: an L3 rule).
	rc, err := controlplane.RESTConfig(st.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	tc, err := tendrilclient.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	pol := &v1alpha1.TendrilNetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "ds-server-admits-client", Namespace: metav1.NamespaceDefault},
		Spec: &api.Rule{
			EndpointSelector: &api.EndpointSelector{MatchLabels: map[string]string{"app": server}},
			Ingress:          []api.IngressRule{{FromEndpoints: []api.EndpointSelector{{MatchLabels: map[string]string{"app": client}}}}},
		},
	}
	if _, err := tc.TendrilV1alpha1().TendrilNetworkPolicies(metav1.NamespaceDefault).Create(ctx, pol, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	poll(t, "the policy to refuse the denied pod over IPv6", func() (bool, error) {
		c, out := probe(denied, ip6[server], false)
		return c == 1, fmt.Errorf("exit %d: %s", c, out)
	})
	if c, out := probe(client, ip6[server], false); c != 0 || !strings.Contains(out, server) {
		t.Errorf("policy on: the client -> [%s]:80 over IPv6 exit %d, want 0: %s", ip6[server], c, out)
	}
	if err := ping(client, ip6[server]); err != nil {
		t.Errorf("policy on: %v", err)
	}
	if c, out := probe(denied, ip6[server], true); c != 1 {
		t.Errorf("policy on: the denied pod -> [%s]:80 UDP exit %d, want 1 (refused): %s", ip6[server], c, out)
	}
	if c, out := probe(denied, ip4[server], false); c != 1 {
		t.Errorf("policy on: the denied pod -> %s:80 over IPv4 exit %d, want 1 (refused): %s", ip4[server], c, out)
	}
}
