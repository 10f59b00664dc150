package cni_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/cilium/cilium/api/v1/models"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/tendril-net/tendril/pkg/k8s"
	v1alpha1 "github.com/tendril-net/tendril/pkg/k8s/apis/tendril.io/v1alpha1"
	"github.com/tendril-net/tendril/pkg/testutil"
)

// TestPrivilegedLocalRedirectPerPacket: with socket LB off, a client
// pod's TCP connection to the kube-dns-like ClusterIP is carried by the
// pod programs' per-packet NAT to the node-local cache pod a
// TendrilLocalRedirectPolicy selects (and answered from the ClusterIP),
// and to the Service's own backend pod once the cache's Pod is deleted.
func TestPrivilegedLocalRedirectPerPacket(t *testing.T) {
	testutil.Privileged(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	env, err := startControlPlane(t, ctx)
	testutil.Require(t, err == nil, fmt.Sprintf("no control plane: %v", err))
	cs := env.Clientset()
	clients, err := k8s.NewClientsForConfig(env.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	apiAddr := strings.TrimPrefix(env.RESTConfig().Host, "https://")

	n := newNode(t)
	forwardAPIServer(t, n.netns, apiAddr)
	var nodeErr error
	eventually(t, "the Node created", func() bool {
		_, nodeErr = cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.name},
			Spec: corev1.NodeSpec{PodCIDRs: []string{"10.244.41.0/24"}}}, metav1.CreateOptions{})
		return nodeErr == nil
	})
	n.start(t, "--kubeconfig", env.Kubeconfig())

	list := n.confList("tendril-cni", "1.1.0", nil)
	clientPod, cachePod, dnsPod := n.newPod("client"), n.newPod("lrp-cache"), n.newPod("cluster-dns")
	ipv4Of(t, n.mustAdd(list, clientPod))
	cacheIP := ipv4Of(t, n.mustAdd(list, cachePod))
	dnsIP := ipv4Of(t, n.mustAdd(list, dnsPod))
	for _, p := range []struct{ ns, name string }{{cachePod.netns, "cache"}, {dnsPod.netns, "cluster-dns"}} {
		ln := listenIn(t, p.ns, "0.0.0.0:8053")
		go func(name string) {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				fmt.Fprint(c, name)
				c.Close()
			}
		}(p.name)
	}

	// The cache's Pod object, on this node, running at its address.
	cacheLabels := map[string]string{"k8s-app": "node-local-dns"}
	pod, err := cs.CoreV1().Pods("default").Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "lrp-cache", Labels: cacheLabels},
		Spec: corev1.PodSpec{NodeName: n.name, Containers: []corev1.Container{{Name: "c", Image: "none"}}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: cacheIP, PodIPs: []corev1.PodIP{{IP: cacheIP}},
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
	if _, err := cs.CoreV1().Pods("default").UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	svc, err := cs.CoreV1().Services("default").Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "kube-dns"},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "dns-tcp", Port: 53, TargetPort: intstr.FromInt32(8053), Protocol: corev1.ProtocolTCP}}}},
		metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.DiscoveryV1().EndpointSlices("default").Create(ctx, &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "kube-dns-1", Labels: map[string]string{discoveryv1.LabelServiceName: "kube-dns"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{dnsIP}, NodeName: ptr.To(n.name), Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}},
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("dns-tcp"), Port: ptr.To[int32](8053), Protocol: ptr.To(corev1.ProtocolTCP)}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	lrp := &v1alpha1.TendrilLocalRedirectPolicy{ObjectMeta: metav1.ObjectMeta{Name: "nodelocaldns", Namespace: "default"},
		Spec: v1alpha1.LocalRedirectPolicySpec{
			RedirectFrontend: v1alpha1.RedirectFrontend{ServiceMatcher: &v1alpha1.LRPServiceMatcher{ServiceName: "kube-dns", Namespace: "default"}},
			RedirectBackend: v1alpha1.RedirectBackend{LocalEndpointSelector: metav1.LabelSelector{MatchLabels: cacheLabels},
				ToPorts: []v1alpha1.LRPPort{{Port: "8053", Protocol: "TCP"}}},
			// The cache's own queries go to the Service's backend.
			SkipRedirectFromBackend: true}}
	eventually(t, "the policy created (the agent installs its CRD)", func() bool {
		_, err := clients.Tendril.TendrilV1alpha1().TendrilLocalRedirectPolicies("default").Create(ctx, lrp, metav1.CreateOptions{})
		return err == nil
	})

	frontend := netip.AddrPortFrom(netip.MustParseAddr(svc.Spec.ClusterIP), 53).String()
	realizedTo := func(backend string) func() bool {
		return func() bool {
			var out []*models.Service
			if err := n.agent.Do(ctx, http.MethodGet, "/service", nil, nil, nil, &out); err != nil {
				return false
			}
			for _, s := range out {
				if s.Spec.FrontendAddress.IP == svc.Spec.ClusterIP && s.Status.Realized != nil &&
					len(s.Spec.BackendAddresses) == 1 && *s.Spec.BackendAddresses[0].IP == backend {
					return true
				}
			}
			return false
		}
	}
	var askFrom func(string) string
	ask := func() string { return askFrom(clientPod.netns) }
	askFrom = func(netns string) string {
		t.Helper()
		c, err := dialFrom(netns, frontend)
		if err != nil {
			t.Fatalf("connect to %s from the client pod: %v\nagent log:\n%s", frontend, err, n.logs)
		}
		defer c.Close()
		if got := c.RemoteAddr().String(); got != frontend {
			t.Errorf("connection's peer %s, want the frontend %s", got, frontend)
		}
		b, err := io.ReadAll(c)
		if err != nil {
			t.Fatalf("read from %s: %v", frontend, err)
		}
		return string(b)
	}
	eventually(t, "the ClusterIP redirected to the cache pod", realizedTo(cacheIP))
	for range 3 {
		if got := ask(); got != "cache" {
			t.Fatalf("the ClusterIP reached %q, want the node-local cache", got)
		}
		// skipRedirectFromBackend, per packet: the cache pod's own
		// connection (by its source address) reaches the Service's
		// backend.
		if got := askFrom(cachePod.netns); got != "cluster-dns" {
			t.Fatalf("the cache pod's own connection to the ClusterIP reached %q, want the Service's backend", got)
		}
	}
	// The flag off: the cache pod is redirected to itself (hairpin).
	cur, err := clients.Tendril.TendrilV1alpha1().TendrilLocalRedirectPolicies("default").Get(ctx, lrp.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cur.Spec.SkipRedirectFromBackend = false
	if _, err := clients.Tendril.TendrilV1alpha1().TendrilLocalRedirectPolicies("default").Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the cache pod redirected to itself with the flag off", func() bool { return askFrom(cachePod.netns) == "cache" })

	if err := cs.CoreV1().Pods("default").Delete(ctx, "lrp-cache", metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the ClusterIP back on the Service's backend", realizedTo(dnsIP))
	for range 3 {
		if got := ask(); got != "cluster-dns" {
			t.Fatalf("with the cache's Pod gone the ClusterIP reached %q, want the Service's backend", got)
		}
	}
}
