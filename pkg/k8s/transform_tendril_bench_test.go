package k8s

import (
	"encoding/json"
	"fmt"
	"runtime"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tendril-net/tendril/pkg/k8s/apis/tendril.io/v1alpha1"
	"github.com/tendril-net/tendril/pkg/testutil"
)

// BenchmarkCachedEndpointMemory: the heap an informer cache of 50,000
// TendrilEndpoints holds (bench/scale's 1,000 nodes of 50 pods), decoded
// from JSON as the informer decodes a custom resource, with the transform
// (a CachedEndpoint each) and with the one before it (the decoded object,
// its managed fields and its identity's label list dropped).
func BenchmarkCachedEndpointMemory(b *testing.B) {
	const n = 50000
	encoded := make([][]byte, n)
	for i := range encoded {
		tep := &v1alpha1.TendrilEndpoint{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("app-%d-7d9f8c6b5-%05d", i%200, i), Namespace: fmt.Sprintf("ns-%d", i%50),
				UID: "2d9f6e4a-0c69-4b2a-9c75-8c3a4b5e6f7a", ResourceVersion: fmt.Sprint(100000 + i), Generation: 1,
				CreationTimestamp: metav1.Now(), ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "tendril-agent", Operation: "Update", APIVersion: "tendril.io/v1alpha1"}}},
			Status: v1alpha1.EndpointStatus{ID: int64(i%4000 + 1), State: "ready",
				Identity: &v1alpha1.EndpointIdentity{ID: int64(20000 + i%1000), Labels: []string{
					fmt.Sprintf("k8s:app=app-%d", i%200), fmt.Sprintf("k8s:io.kubernetes.pod.namespace=ns-%d", i%50),
					"k8s:io.cilium.k8s.policy.serviceaccount=default", "k8s:io.cilium.k8s.policy.cluster=default"}},
				Networking: &v1alpha1.EndpointNetworking{Addressing: []v1alpha1.AddressPair{{IPv4: fmt.Sprintf("10.%d.%d.%d", i/50/256, i/50%256, i%50+2)}},
					NodeIP: fmt.Sprintf("172.18.%d.%d", i/50/256, i/50%256)},
				NamedPorts: []v1alpha1.NamedPort{{Name: "http", Port: 8080, Protocol: "TCP"}}},
		}
		var err error
		if encoded[i], err = json.Marshal(tep); err != nil {
			b.Fatal(err)
		}
	}
	before := func(obj any) (any, error) {
		tep := obj.(*v1alpha1.TendrilEndpoint)
		id := *tep.Status.Identity
		id.Labels = nil
		tep.Status.Identity = &id
		return StripManagedFields(obj)
	}
	for _, tr := range []struct {
		name string
		fn   func(any) (any, error)
	}{{"before", before}, {"cached-endpoint", StripTendril}} {
		b.Run(tr.name, func(b *testing.B) {
			for range b.N {
				start := testutil.HeapAfterGC()
				cache := make([]any, 0, n)
				for _, e := range encoded {
					tep := &v1alpha1.TendrilEndpoint{}
					if err := json.Unmarshal(e, tep); err != nil {
						b.Fatal(err)
					}
					o, _ := tr.fn(tep)
					cache = append(cache, o)
				}
				b.ReportMetric(float64(testutil.HeapAfterGC()-start)/(1<<20), "heap-MiB")
				runtime.KeepAlive(cache)
			}
		})
	}
}
