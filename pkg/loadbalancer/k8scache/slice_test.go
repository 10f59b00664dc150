package k8scache

import (
	"fmt"
	"testing"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/tendril-net/tendril/pkg/loadbalancer"
)

// TestSliceFrom: an EndpointSlice's backends, each address with each port,
// with its conditions (unset ones mean ready and serving), node, zone and
// hints; addresses no backend may have are left out; a slice of no
// service lists none.
func TestSliceFrom(t *testing.T) {
	es := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "ns", Name: "web-abc", Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{
			{Addresses: []string{"10.0.0.1"}, NodeName: ptr.To("a"), Zone: ptr.To("z1"), Hints: &discoveryv1.EndpointHints{
				ForZones: []discoveryv1.ForZone{{Name: "z1"}}, ForNodes: []discoveryv1.ForNode{{Name: "a"}}}},
			{Addresses: []string{"10.0.0.2"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(false), Serving: ptr.To(true), Terminating: ptr.To(true)}},
		},
		Ports: []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080)}},
	}
	sl := SliceFrom(es)
	name, bs, ok := sl.Service, sl.Backends, sl.OK
	if !ok || name != (loadbalancer.ServiceName{Namespace: "ns", Name: "web"}) || len(bs) != 2 {
		t.Fatalf("%v %v %+v", ok, name, bs)
	}
	if b := bs[0]; !b.Ready || !b.Serving || b.Terminating || b.NodeName != "a" || b.Zone != "z1" || b.Hints == nil || fmt.Sprint(b.Hints.ForZones, b.Hints.ForNodes) != "[z1] [a]" || b.Proto != loadbalancer.TCP || b.PortName != "http" || b.Service != name || b.Source != "web-abc" {
		t.Fatalf("unset conditions: %+v", b)
	}
	if b := bs[1]; b.Ready || !b.Serving || !b.Terminating {
		t.Fatalf("terminating: %+v", b)
	}
	// Addresses no backend may have (a selectorless Service's owner
	// writes them): loopback, unspecified, link-local, multicast.
	es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{Addresses: []string{"127.0.0.1", "0.0.0.0", "169.254.169.254", "224.0.0.1", "::ffff:127.0.0.1"}})
	if bs := SliceFrom(es).Backends; len(bs) != 2 {
		t.Fatalf("backends %+v, want the two unicast ones only", bs)
	}
	es.Labels = nil
	if sl := SliceFrom(es); sl.OK || len(sl.Backends) != 0 {
		t.Fatal("a slice of no service must be skipped")
	}
}
