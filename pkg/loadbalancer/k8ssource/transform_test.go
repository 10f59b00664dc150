package k8ssource

import (
	"reflect"
	"testing"
	"time"
	"unsafe"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
	"log/slog"

	"github.com/tendril-net/tendril/pkg/k8s/watchers"
	"github.com/tendril-net/tendril/pkg/loadbalancer/k8scache"
)

// fullService sets every field ServiceFrom reads to a value that changes
// its result, and fields it does not read beside them.
func fullService() *corev1.Service {
	local := corev1.ServiceInternalTrafficPolicyLocal
	vip, proxy := corev1.LoadBalancerIPModeVIP, corev1.LoadBalancerIPModeProxy
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web", UID: "u-1", ResourceVersion: "42",
			CreationTimestamp: metav1.NewTime(time.Unix(1700000000, 0)),
			Labels:            map[string]string{"app": "web", "tier": "front"},
			Annotations:       map[string]string{AnnotationLBAlgorithm: "maglev", "other": "x"},
			ManagedFields:     []metav1.ManagedFieldsEntry{{Manager: "kubectl"}},
			OwnerReferences:   []metav1.OwnerReference{{Name: "owner"}}},
		Spec: corev1.ServiceSpec{
			Type:       corev1.ServiceTypeLoadBalancer,
			ClusterIP:  "10.96.0.10",
			ClusterIPs: []string{"10.96.0.10", "fd00::10"},
			Ports: []corev1.ServicePort{
				{Name: "http", Port: 80, NodePort: 30080, TargetPort: intstr.FromInt32(8080), AppProtocol: ptr.To("http")},
				{Name: "dns", Port: 53, NodePort: 30053, Protocol: corev1.ProtocolUDP},
			},
			Selector:                 map[string]string{"app": "web"},
			ExternalIPs:              []string{"192.0.2.1"},
			SessionAffinity:          corev1.ServiceAffinityClientIP,
			SessionAffinityConfig:    &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptr.To[int32](30)}},
			LoadBalancerSourceRanges: []string{"198.51.100.0/24"},
			ExternalTrafficPolicy:    corev1.ServiceExternalTrafficPolicyLocal,
			HealthCheckNodePort:      32000,
			InternalTrafficPolicy:    &local,
			TrafficDistribution:      ptr.To(corev1.ServiceTrafficDistributionPreferClose),
			IPFamilies:               []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol},
		},
		Status: corev1.ServiceStatus{LoadBalancer: corev1.LoadBalancerStatus{Ingress: []corev1.LoadBalancerIngress{
			{IP: "203.0.113.1", IPMode: &vip, Ports: []corev1.PortStatus{{Port: 80}}},
			{IP: "203.0.113.2", IPMode: &proxy},
			{Hostname: "lb.example.com"},
		}}},
	}
}

// fullSlice sets every field k8scache.From reads (each condition set,
// unset, true and false somewhere), and fields it does not read.
func fullSlice() *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web-abc", ResourceVersion: "7",
			Labels:        map[string]string{discoveryv1.LabelServiceName: "web", discoveryv1.LabelManagedBy: "endpointslice-controller.k8s.io"},
			Annotations:   map[string]string{corev1.EndpointsLastChangeTriggerTime: "2026-11-29T00:00:00Z"},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kube-controller-manager"}}},
		AddressType: discoveryv1.AddressTypeIPv6,
		Endpoints: []discoveryv1.Endpoint{
			{Addresses: []string{"fd00::1"}, NodeName: ptr.To("a"), Zone: ptr.To("z1"), Hostname: ptr.To("h"),
				TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: "ns", Name: "web-1", UID: "p-1"},
				Hints:     &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: "z1"}}, ForNodes: []discoveryv1.ForNode{{Name: "a"}}}},
			{Addresses: []string{"fd00::2"}, NodeName: ptr.To("b"), Zone: ptr.To("z2"),
				Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(false), Serving: ptr.To(true), Terminating: ptr.To(true)}},
			{Addresses: []string{"fd00::3"}, NodeName: ptr.To("a"),
				Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(false), Terminating: ptr.To(false)}},
		},
		Ports: []discoveryv1.EndpointPort{
			{Name: ptr.To("http"), Port: ptr.To[int32](8080), AppProtocol: ptr.To("http")},
			{Name: ptr.To("dns"), Port: ptr.To[int32](5353), Protocol: ptr.To(corev1.ProtocolUDP)},
		},
	}
}

// TestTransformKeepsWhatIsRead: the informers' transform (which caches
// Services and EndpointSlices as their conversions to save memory) keeps
// every field the source reads: what the source writes for a transformed
// object equals the conversion of the original, and transforming again
// changes nothing.
func TestTransformKeepsWhatIsRead(t *testing.T) {
	transform := watchers.NewTransform()

	want, ok, err := ServiceFrom(fullService(), false)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	if len(want.LoadBalancerIPs) != 1 || want.HealthCheckNodePort == 0 || !want.Maglev || want.TrafficDistribution == "" {
		t.Fatalf("the full service does not exercise every field: %+v", want)
	}
	var svcObj any = fullService()
	for round := 1; round <= 2; round++ {
		if svcObj, err = transform(svcObj); err != nil {
			t.Fatal(err)
		}
		c, ok := svcObj.(*k8scache.Service)
		if !ok {
			t.Fatalf("round %d: the transform made a %T", round, svcObj)
		}
		if c.Err != nil || c.Service == nil || !reflect.DeepEqual(c.Service, want) || !c.MaglevSet {
			t.Fatalf("round %d: the transformed service\n got %+v (%v)\nwant %+v", round, c.Service, c.Err, want)
		}
		if key, _ := cache.MetaNamespaceKeyFunc(c); key != "ns/web" || c.ResourceVersion != "42" {
			t.Fatalf("round %d: key %q, resource version %q", round, key, c.ResourceVersion)
		}
	}
	// The source writes the cache's conversion itself when the node's
	// settings leave it as it is, a copy with them applied otherwise,
	// never changing the cache's.
	c := svcObj.(*k8scache.Service)
	src := &Source{}
	if got := src.withNodeSettings("ns/web", c); got != c.Service {
		t.Fatal("a copy where the cache's conversion would do")
	}
	plain := fullService()
	plain.Annotations = nil
	pc := k8scache.CachedServiceFrom(plain)
	src.defaultMaglev = true
	if got := src.withNodeSettings("ns/web", pc); got == pc.Service || !got.Maglev || pc.Service.Maglev {
		t.Fatalf("the node's default Maglev: got %+v, cache %+v", got, pc.Service)
	}
	src.defaultMaglev, src.nodePortMin, src.nodePortMax = false, 30000, 30060
	src.log = slog.New(slog.DiscardHandler)
	got := src.withNodeSettings("ns/web", c)
	if got == c.Service || got.Ports[0].NodePort != 0 || got.Ports[1].NodePort != 30053 || got.HealthCheckNodePort != 0 ||
		c.Service.Ports[0].NodePort != 30080 || c.Service.HealthCheckNodePort != 32000 {
		t.Fatalf("node ports out of range: got %+v, cache %+v", got, c.Service)
	}

	// A slice becomes its backends: what the source reads of it, the
	// same as converting the slice itself, and converting again changes
	// nothing.
	wantSlice := k8scache.SliceFrom(fullSlice())
	if !wantSlice.OK || len(wantSlice.Backends) != 6 {
		t.Fatalf("the full slice: %v %d backends", wantSlice.OK, len(wantSlice.Backends))
	}
	var obj any = fullSlice()
	for round := 1; round <= 2; round++ {
		var err error
		if obj, err = transform(obj); err != nil {
			t.Fatal(err)
		}
		sl, ok := obj.(*k8scache.Slice)
		if !ok {
			t.Fatalf("round %d: the transform made a %T", round, obj)
		}
		if !sl.OK || sl.Service != wantSlice.Service || !reflect.DeepEqual(sl.Backends, wantSlice.Backends) {
			t.Fatalf("round %d: the transformed slice\n got %v %+v\nwant %v %+v", round, sl.Service, sl.Backends, wantSlice.Service, wantSlice.Backends)
		}
		if key, _ := cache.MetaNamespaceKeyFunc(sl); key != "ns/web-abc" || sl.Name != "web-abc" || sl.ResourceVersion != "7" {
			t.Fatalf("round %d: key %q, name %q, resource version %q", round, key, sl.Name, sl.ResourceVersion)
		}
	}
	// The endpoints on node a share its name's bytes.
	bs := obj.(*k8scache.Slice).Backends
	if unsafe.StringData(bs[0].NodeName) != unsafe.StringData(bs[4].NodeName) || bs[4].NodeName != "a" {
		t.Fatal("backends of one node hold separate copies of its name")
	}
	// A copy for the cache's readers is equal and separate.
	sc := obj.(*k8scache.Slice).DeepCopyObject().(*k8scache.Slice)
	if !reflect.DeepEqual(sc, obj) || &sc.Backends[0] == &bs[0] {
		t.Fatal("DeepCopyObject")
	}
}
