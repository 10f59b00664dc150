package k8ssource

import (
	"net/netip"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/tendril-net/tendril/pkg/loadbalancer"
)

func TestServiceFrom(t *testing.T) {
	local := corev1.ServiceInternalTrafficPolicyLocal
	s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web", Annotations: map[string]string{AnnotationLBAlgorithm: "Maglev"}},
		Spec: corev1.ServiceSpec{ClusterIPs: []string{"10.96.0.10", "fd00::10"}, Type: corev1.ServiceTypeClusterIP,
			Ports:                 []corev1.ServicePort{{Name: "http", Port: 80}, {Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP}},
			SessionAffinity:       corev1.ServiceAffinityClientIP,
			SessionAffinityConfig: &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptr.To[int32](30)}},
			InternalTrafficPolicy: &local}}
	got, ok, err := ServiceFrom(s, false)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	if len(got.Addresses) != 2 || got.Addresses[1] != netip.MustParseAddr("fd00::10") || !got.Affinity || got.AffinityTimeout != 30 ||
		got.InternalTrafficPolicy != loadbalancer.TrafficPolicyLocal || !got.Maglev ||
		got.Ports[0] != (loadbalancer.ServicePort{Name: "http", Port: 80, Proto: loadbalancer.TCP}) || got.Ports[1].Proto != loadbalancer.UDP {
		t.Fatalf("converted %+v", got)
	}
	// Default affinity timeout; the node's default algorithm.
	s.Spec.SessionAffinityConfig = nil
	delete(s.Annotations, AnnotationLBAlgorithm)
	got, _, _ = ServiceFrom(s, true)
	if got.AffinityTimeout != 10800 || !got.Maglev {
		t.Fatalf("defaults %+v", got)
	}
	for name, spec := range map[string]corev1.ServiceSpec{
		"headless":     {ClusterIP: corev1.ClusterIPNone, ClusterIPs: []string{corev1.ClusterIPNone}},
		"externalname": {Type: corev1.ServiceTypeExternalName, ExternalName: "example.com"},
	} {
		if _, ok, err := ServiceFrom(&corev1.Service{Spec: spec}, false); ok || err != nil {
			t.Errorf("%s: ok %v err %v, want skipped", name, ok, err)
		}
	}
}

func TestBackendsFrom(t *testing.T) {
	es := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "ns", Name: "web-abc", Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{
			{Addresses: []string{"10.0.0.1"}, NodeName: ptr.To("a"), Zone: ptr.To("z1")},
			{Addresses: []string{"10.0.0.2"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(false), Serving: ptr.To(true), Terminating: ptr.To(true)}},
		},
		Ports: []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080)}},
	}
	name, bs, ok := BackendsFrom(es)
	if !ok || name != (loadbalancer.ServiceName{Namespace: "ns", Name: "web"}) || len(bs) != 2 {
		t.Fatalf("%v %v %+v", ok, name, bs)
	}
	if b := bs[0]; !b.Ready || !b.Serving || b.Terminating || b.NodeName != "a" || b.Zone != "z1" || b.Proto != loadbalancer.TCP || b.PortName != "http" {
		t.Fatalf("unset conditions: %+v", b)
	}
	if b := bs[1]; b.Ready || !b.Serving || !b.Terminating {
		t.Fatalf("terminating: %+v", b)
	}
	es.Labels = nil
	if _, _, ok := BackendsFrom(es); ok {
		t.Fatal("a slice of no service must be skipped")
	}
}
