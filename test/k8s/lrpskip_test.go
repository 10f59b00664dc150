package k8s_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/cilium/api/v1/models"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tendril-net/tendril/pkg/datapath/maps"
	"github.com/tendril-net/tendril/pkg/k8s"
	v1alpha1 "github.com/tendril-net/tendril/pkg/k8s/apis/tendril.io/v1alpha1"
	"github.com/tendril-net/tendril/pkg/namedns"
	"github.com/tendril-net/tendril/pkg/testutil"
)

// startLRPClient starts the DNS client of the local redirect tests (see
// lrpHelper) in the socket-LB cgroup cg, in the network namespace at
// netnsPath ("": a new one), and returns its ask.
func startLRPClient(t *testing.T, cg, netnsPath string, req lrpRequest) func() lrpAnswer {
	t.Helper()
	cgf, err := os.Open(cg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cgf.Close() })
	b, _ := json.Marshal(req)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET, UseCgroupFD: true, CgroupFD: int(cgf.Fd())}
	if netnsPath != "" {
		// nsenter starts in the cgroup and executes the client there.
		cmd = exec.Command("nsenter", "--net="+netnsPath, os.Args[0], "-test.run=^$")
		cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(cgf.Fd())}
	}
	cmd.Env = append(os.Environ(), lrpHelperEnv+"="+string(b))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stdin.Close()
		_ = cmd.Wait()
	})
	dec := json.NewDecoder(stdout)
	return func() lrpAnswer {
		t.Helper()
		if _, err := stdin.Write([]byte("ask\n")); err != nil {
			t.Fatalf("ask: %v; stderr: %s", err, stderr.String())
		}
		var a lrpAnswer
		if err := dec.Decode(&a); err != nil {
			t.Fatalf("client's answer: %v; stderr: %s", err, stderr.String())
		}
		return a
	}
}

// TestPrivilegedLocalRedirectSkipFromBackend: a node-local DNS cache
// whose policy sets skipRedirectFromBackend. The cache pod's endpoint
// (made through the agent's API with its network namespace, as a CNI ADD
// does) names its namespace; the cache's own queries to the kube-dns
// ClusterIP, through the socket LB, reach the Service's real backend,
// another pod's still reach the cache. With the flag turned off the cache
// reaches itself again.
func TestPrivilegedLocalRedirectSkipFromBackend(t *testing.T) {
	testutil.Privileged(t)
	testutil.Require(t, startErr == nil, fmt.Sprintf("no control plane: %v", startErr))
	clients, err := k8s.NewClientsForConfig(env.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	cs := clients.Core
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const nodeName, ns = "node-lrpskip", "lrp-skip"
	const cacheIP, clusterDNSIP = "10.244.34.11", "10.244.34.21"
	if _, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName},
		Spec: corev1.NodeSpec{PodCIDRs: []string{"10.244.34.0/24"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	dns := createKubeDNS(ctx, t, cs, ns, clusterDNSIP)
	cacheLabels := map[string]string{"k8s-app": "node-local-dns"}
	createReadyPod(ctx, t, cs, ns, "cache", nodeName, cacheIP, cacheLabels)

	// The cache pod's network namespace, as its runtime would make it.
	netnsName := "tdr-lrpskip-" + randHex()
	if err := namedns.Create(netnsName); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = namedns.Delete(netnsName) })
	cacheNS := namedns.Path(netnsName)
	cookie, err := namedns.NetnsCookie(cacheNS)
	if err != nil {
		t.Fatal(err)
	}

	root := "/sys/fs/bpf/tendril-k8s-lrpskip-" + randHex()
	t.Cleanup(func() { _ = os.RemoveAll(root) })
	cg := "/sys/fs/cgroup/unified/tendril-test-lrpskip-" + randHex()
	if err := os.Mkdir(cg, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Remove(cg) })
	a := startAgent(t, nodeName, "--enable-datapath=true", "--bpf-root", root, "--ipv4-range", "10.244.34.0/24", "--ipv6-range", "none", "--cgroup-root", cg)
	a.waitServing(t)
	if _, err := a.api.EndpointPut(ctx, "0", &models.EndpointChangeRequest{
		ContainerID: "cache0", K8sNamespace: ns, K8sPodName: "cache", InterfaceName: "tdrcache0",
		Addressing: &models.AddressPair{IPV4: cacheIP}, Properties: map[string]any{"netns": cacheNS},
	}); err != nil {
		t.Fatalf("the cache pod's endpoint: %v", err)
	}
	policy := &v1alpha1.TendrilLocalRedirectPolicy{ObjectMeta: metav1.ObjectMeta{Name: "nodelocaldns", Namespace: ns}, Spec: v1alpha1.LocalRedirectPolicySpec{
		RedirectFrontend: v1alpha1.RedirectFrontend{ServiceMatcher: &v1alpha1.LRPServiceMatcher{ServiceName: "kube-dns", Namespace: ns}},
		RedirectBackend: v1alpha1.RedirectBackend{LocalEndpointSelector: metav1.LabelSelector{MatchLabels: cacheLabels},
			ToPorts: []v1alpha1.LRPPort{lrpPort("53", "UDP", "dns"), lrpPort("53", "TCP", "dns-tcp")}},
		SkipRedirectFromBackend: true}}
	lrps := clients.Tendril.TendrilV1alpha1().TendrilLocalRedirectPolicies(ns)
	eventually(t, "the policy CRD to take the policy", func() (bool, error) {
		_, err := lrps.Create(ctx, policy, metav1.CreateOptions{})
		return err == nil, err
	})

	lb, err := maps.OpenPinnedLB(root, true)
	if err != nil {
		t.Fatal(err)
	}
	defer lb.Close()
	skipped := func() (int, error) {
		n := 0
		err := lb.SkipMap().Iterate(func(k maps.SkipKey, mode uint8) bool {
			if k.NetnsCookie == cookie && k.Frontend.Addr.String() == dns.Spec.ClusterIP && mode == maps.LBSkipOriginal {
				n++
			}
			return true
		})
		return n, err
	}
	eventually(t, "the cache pod's namespace skipped for kube-dns UDP and TCP", func() (bool, error) {
		n, err := skipped()
		return n == 2, fmt.Errorf("%d skip entries for cookie %d (%v)", n, cookie, err)
	})

	req := lrpRequest{Servers: []string{cacheIP, clusterDNSIP}, Ask: net.JoinHostPort(dns.Spec.ClusterIP, "53")}
	fromCache := startLRPClient(t, cg, cacheNS, req)
	fromOther := startLRPClient(t, cg, "", req)
	for range 3 {
		if got := fromCache(); got.Err != "" || got.UDP != clusterDNSIP || got.TCP != clusterDNSIP {
			t.Fatalf("the cache pod's own query should reach the Service's backend %s: %+v", clusterDNSIP, got)
		}
		if got := fromOther(); got.Err != "" || got.UDP != cacheIP || got.TCP != cacheIP {
			t.Fatalf("another pod's query should still reach the cache %s: %+v", cacheIP, got)
		}
	}

	// The flag off: the cache is redirected to itself, as any pod.
	cur, err := lrps.Get(ctx, policy.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cur.Spec.SkipRedirectFromBackend = false
	if _, err := lrps.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the skip entries gone with the flag", func() (bool, error) {
		n, err := skipped()
		return n == 0 && err == nil, fmt.Errorf("%d skip entries (%v)", n, err)
	})
	if got := fromCache(); got.Err != "" || got.UDP != cacheIP || got.TCP != cacheIP {
		t.Fatalf("with the flag off the cache pod should reach itself: %+v", got)
	}
}
