package watchers

import (
	"fmt"
	"runtime"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/tendril-net/tendril/pkg/loadbalancer"
	"github.com/tendril-net/tendril/pkg/loadbalancer/k8scache"
	"github.com/tendril-net/tendril/pkg/testutil"
)

func ptrTo[T any](v T) *T { return &v }

// benchObjects are a Service and its EndpointSlice of 10 endpoints as the
// API server stores them, in protobuf; withPods adds what the EndpointSlice
// controller writes for real pods (target references, its labels and
// annotation) and a selector.
func benchObjects(i int, withPods bool) (svc, es []byte) {
	name := fmt.Sprintf("svc-%05d", i)
	s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "bench", UID: "0b9d4c2e-8a47-4f0e-9a53-6a1e2f3c4d5e", ResourceVersion: "123456"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, ClusterIP: "10.96.1.1", ClusterIPs: []string{"10.96.1.1"},
			Ports:           []corev1.ServicePort{{Name: "p", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP}},
			SessionAffinity: corev1.ServiceAffinityNone, IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol}, IPFamilyPolicy: ptrTo(corev1.IPFamilyPolicySingleStack),
			InternalTrafficPolicy: ptrTo(corev1.ServiceInternalTrafficPolicyCluster)}}
	e := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: name + "-1", Namespace: "bench", UID: "1c8e5d3f-9b58-4a1f-8b64-7b2f3a4d5e6f", ResourceVersion: "123457",
		Labels: map[string]string{discoveryv1.LabelServiceName: name}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptrTo("p"), Port: ptrTo[int32](8080), Protocol: ptrTo(corev1.ProtocolTCP)}}}
	for j := range 10 {
		ep := discoveryv1.Endpoint{Addresses: []string{fmt.Sprintf("10.245.0.%d", j+1)}, NodeName: ptrTo("bench-node"),
			Conditions: discoveryv1.EndpointConditions{Ready: ptrTo(true), Serving: ptrTo(true), Terminating: ptrTo(false)}}
		if withPods {
			ep.TargetRef = &corev1.ObjectReference{Kind: "Pod", Namespace: "bench", Name: fmt.Sprintf("%s-7d9f8c6b5-%05d", name, j), UID: "2d9f6e4a-0c69-4b2a-9c75-8c3a4b5e6f7a"}
			ep.Zone = ptrTo("zone-a")
		}
		e.Endpoints = append(e.Endpoints, ep)
	}
	if withPods {
		s.Spec.Selector = map[string]string{"app": name}
		s.Labels = map[string]string{"app": name}
		e.Labels[discoveryv1.LabelManagedBy] = "endpointslice-controller.k8s.io"
		e.Labels["app"] = name
		e.Annotations = map[string]string{corev1.EndpointsLastChangeTriggerTime: "2026-11-29T17:00:00Z"}
		e.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Service", Name: name, UID: s.UID, Controller: ptrTo(true), BlockOwnerDeletion: ptrTo(true)}}
	}
	svc, err := s.Marshal()
	if err != nil {
		panic(err)
	}
	if es, err = e.Marshal(); err != nil {
		panic(err)
	}
	return svc, es
}

// BenchmarkCacheMemory: the heap the informer caches and the services
// and backends tables' rows hold for 10,000 Services and their
// EndpointSlices of 10 endpoints, decoded from protobuf as the informers
// decode them, with the transform (issue 31: each cached as its
// conversion, which the tables share) and with only managedFields
// stripped (before it: the cached objects, and the rows beside them).
func BenchmarkCacheMemory(b *testing.B) {
	const n = 10000
	for _, withPods := range []bool{false, true} {
		encoded := make([][2][]byte, n)
		for i := range encoded {
			encoded[i][0], encoded[i][1] = benchObjects(i, withPods)
		}
		shape := "bench-objects"
		if withPods {
			shape = "controller-objects"
		}
		for _, tr := range []struct {
			name string
			fn   func(any) (any, error)
		}{{"before", func(o any) (any, error) { return o, nil }}, {"transform", NewTransform()}} {
			b.Run(shape+"/"+tr.name, func(b *testing.B) {
				for range b.N {
					before := testutil.HeapAfterGC()
					cache := make([]any, 0, 2*n)
					var table [][]*loadbalancer.Backend
					var rows []*loadbalancer.Service
					for _, e := range encoded {
						s, es := &corev1.Service{}, &discoveryv1.EndpointSlice{}
						if err := s.Unmarshal(e[0]); err != nil {
							b.Fatal(err)
						}
						if err := es.Unmarshal(e[1]); err != nil {
							b.Fatal(err)
						}
						so, _ := tr.fn(s)
						eo, _ := tr.fn(es)
						cache = append(cache, so, eo)
						if sl, ok := eo.(*k8scache.Slice); ok {
							table = append(table, sl.Backends)
						} else {
							table = append(table, k8scache.SliceFrom(es).Backends)
						}
						if _, ok := so.(*k8scache.Service); !ok {
							svc, _, _ := k8scache.ServiceFrom(s, false)
							rows = append(rows, svc)
						}
					}
					b.ReportMetric(float64(testutil.HeapAfterGC()-before)/(1<<20), "heap-MiB")
					runtime.KeepAlive(cache)
					runtime.KeepAlive(table)
					runtime.KeepAlive(rows)
				}
			})
		}
	}
}
