package k8s_test

import (
	"context"
	"fmt"
	"net/netip"
	"os"
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
