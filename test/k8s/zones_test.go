package k8s_test

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/tendril-net/tendril/pkg/datapath/maps"
	"github.com/tendril-net/tendril/pkg/k8s"
	"github.com/tendril-net/tendril/pkg/testutil"
)

// TestPrivilegedServicePreferClose: a Service with trafficDistribution
// PreferClose gets, in the LB maps' slots, only the backends its
// EndpointSlice hints for the zone of the agent's node (its
// topology.kubernetes.io/zone label); relabeling the node to another zone
// moves the slots there, and a zone no backend is hinted for uses all.
func TestPrivilegedServicePreferClose(t *testing.T) {
	testutil.Privileged(t)
	testutil.Require(t, startErr == nil, fmt.Sprintf("no control plane: %v", startErr))
	clients, err := k8s.NewClientsForConfig(env.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	cs := clients.Core
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const nodeName, ns = "node-zone", "zones"
	_, err = cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName,
		Labels: map[string]string{corev1.LabelTopologyZone: "zone-a"}},
		Spec: corev1.NodeSpec{PodCIDRs: []string{"10.244.32.0/24"}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	svc, err := cs.CoreV1().Services(ns).Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "near", Namespace: ns},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}},
			TrafficDistribution: ptr.To(corev1.ServiceTrafficDistributionPreferClose)}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	hinted := func(ip, zone string) discoveryv1.Endpoint {
		return discoveryv1.Endpoint{Addresses: []string{ip}, Zone: ptr.To(zone),
			Hints: &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: zone}}}}
	}
	es := slice(ns, "near-1", "near", 8080, corev1.ProtocolTCP, "http")
	es.Endpoints = []discoveryv1.Endpoint{hinted("10.244.32.11", "zone-a"), hinted("10.244.32.12", "zone-b"), hinted("10.244.32.13", "zone-a")}
	if _, err := cs.DiscoveryV1().EndpointSlices(ns).Create(ctx, es, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	root := "/sys/fs/bpf/tendril-k8s-zones-" + randHex()
	t.Cleanup(func() { _ = os.RemoveAll(root) })
	a := startAgent(t, nodeName, "--enable-datapath=true", "--bpf-root", root, "--ipv4-range", "10.244.32.0/24", "--ipv6-range", "none")
	a.waitServing(t)
	fe := maps.Frontend{Addr: netip.MustParseAddr(svc.Spec.ClusterIP), Port: 80, Proto: maps.ProtoTCP}
	waitSlots := func(what, want string) {
		t.Helper()
		eventually(t, what, func() (bool, error) {
			st := readFrontend(t, root, fe)
			return fmt.Sprint(st.backends) == want, fmt.Errorf("slots %v, want %s", st.backends, want)
		})
	}
	// The first write already has the zone: the node is part of the sync.
	waitSlots("zone-a's backends", "[10.244.32.11:8080(active) 10.244.32.13:8080(active)]")
	relabel := func(zone string) {
		t.Helper()
		n, err := cs.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		n.Labels[corev1.LabelTopologyZone] = zone
		if _, err := cs.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	relabel("zone-b")
	waitSlots("zone-b's backend", "[10.244.32.12:8080(active)]")
	relabel("zone-c")
	waitSlots("every backend for a zone without hints", "[10.244.32.11:8080(active) 10.244.32.12:8080(active) 10.244.32.13:8080(active)]")
}

// TestPrivilegedServiceTopologyHints: the agent follows an EndpointSlice's
// hints as kube-proxy does, whatever the Service's trafficDistribution
// says. A Service with only the topology-mode Auto annotation gets the
// zone-hinted backends of its node's zone; one whose slice hints
// backends for nodes (trafficDistribution PreferSameNode) gets the
// backend hinted for the agent's node, and, when no backend is hinted for
// it, those of its zone.
func TestPrivilegedServiceTopologyHints(t *testing.T) {
	testutil.Privileged(t)
	testutil.Require(t, startErr == nil, fmt.Sprintf("no control plane: %v", startErr))
	clients, err := k8s.NewClientsForConfig(env.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	cs := clients.Core
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const nodeName, ns = "node-hints", "hints"
	_, err = cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName,
		Labels: map[string]string{corev1.LabelTopologyZone: "zone-a"}},
		Spec: corev1.NodeSpec{PodCIDRs: []string{"10.244.33.0/24"}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	auto, err := cs.CoreV1().Services(ns).Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "auto", Namespace: ns,
		Annotations: map[string]string{"service.kubernetes.io/topology-mode": "Auto"}},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sameNode, err := cs.CoreV1().Services(ns).Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "same-node", Namespace: ns},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}},
			TrafficDistribution: ptr.To(corev1.ServiceTrafficDistributionPreferSameNode)}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// The EndpointSlice controller's hints for these Services: zone hints
	// for topology-mode Auto, node and zone hints for PreferSameNode.
	hinted := func(ip, node, zone string) discoveryv1.Endpoint {
		e := discoveryv1.Endpoint{Addresses: []string{ip}, NodeName: ptr.To(node), Zone: ptr.To(zone),
			Hints: &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: zone}}}}
		return e
	}
	forNode := func(e discoveryv1.Endpoint) discoveryv1.Endpoint {
		e.Hints.ForNodes = []discoveryv1.ForNode{{Name: *e.NodeName}}
		return e
	}
	autoSlice := slice(ns, "auto-1", "auto", 8080, corev1.ProtocolTCP, "http")
	autoSlice.Endpoints = []discoveryv1.Endpoint{hinted("10.244.33.11", nodeName, "zone-a"), hinted("10.244.33.12", "other", "zone-b")}
	if _, err := cs.DiscoveryV1().EndpointSlices(ns).Create(ctx, autoSlice, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	nodeSlice := slice(ns, "same-node-1", "same-node", 8080, corev1.ProtocolTCP, "http")
	nodeSlice.Endpoints = []discoveryv1.Endpoint{forNode(hinted("10.244.33.21", "node-x", "zone-a")),
		forNode(hinted("10.244.33.22", nodeName, "zone-b")), forNode(hinted("10.244.33.23", "node-y", "zone-a"))}
	nodeSlice, err = cs.DiscoveryV1().EndpointSlices(ns).Create(ctx, nodeSlice, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	root := "/sys/fs/bpf/tendril-k8s-hints-" + randHex()
	t.Cleanup(func() { _ = os.RemoveAll(root) })
	a := startAgent(t, nodeName, "--enable-datapath=true", "--bpf-root", root, "--ipv4-range", "10.244.33.0/24", "--ipv6-range", "none")
	a.waitServing(t)
	waitSlots := func(svc *corev1.Service, what, want string) {
		t.Helper()
		fe := maps.Frontend{Addr: netip.MustParseAddr(svc.Spec.ClusterIP), Port: 80, Proto: maps.ProtoTCP}
		eventually(t, what, func() (bool, error) {
			st := readFrontend(t, root, fe)
			return fmt.Sprint(st.backends) == want, fmt.Errorf("slots %v, want %s", st.backends, want)
		})
	}
	waitSlots(auto, "topology-mode Auto: zone-a's backend", "[10.244.33.11:8080(active)]")
	waitSlots(sameNode, "PreferSameNode: the node's backend, in another zone", "[10.244.33.22:8080(active)]")
	// The backend of this node goes: no backend is hinted for it, and the
	// zone hints choose.
	nodeSlice.Endpoints = slices.Delete(nodeSlice.Endpoints, 1, 2)
	if _, err := cs.DiscoveryV1().EndpointSlices(ns).Update(ctx, nodeSlice, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitSlots(sameNode, "PreferSameNode without a backend on the node: zone-a's", "[10.244.33.21:8080(active) 10.244.33.23:8080(active)]")
}
