package k8s

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// StripManagedFields is an informer transform that drops
// metadata.managedFields before an object enters a cache: neither the
// agent nor the operator reads them, and they are a large share of each
// cached object (each field's owner, per manager) — at 100,000 Services
// and EndpointSlices, tens of MiB.
func StripManagedFields(obj any) (any, error) {
	if m, ok := obj.(metav1.Object); ok {
		m.SetManagedFields(nil)
	}
	return obj, nil
}
