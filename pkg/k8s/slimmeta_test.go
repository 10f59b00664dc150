package k8s

import (
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/client-go/tools/cache"
)

// TestSlimMetaKeys: client-go's accessor, key function and namespace
// index take an object carrying SlimMeta, and fields it does not hold
// read as unset whatever is set.
func TestSlimMetaKeys(t *testing.T) {
	m := &SlimMeta{Name: "web-1", Namespace: "ns", ResourceVersion: "7"}
	a, err := meta.Accessor(m)
	if err != nil {
		t.Fatal(err)
	}
	if key, err := cache.MetaNamespaceKeyFunc(m); err != nil || key != "ns/web-1" || a.GetResourceVersion() != "7" {
		t.Fatalf("key %q %v, resource version %q", key, err, a.GetResourceVersion())
	}
	if ns, err := cache.MetaNamespaceIndexFunc(m); err != nil || len(ns) != 1 || ns[0] != "ns" {
		t.Fatalf("namespace index %v %v", ns, err)
	}
	a.SetLabels(map[string]string{"a": "b"})
	a.SetUID("u")
	if a.GetLabels() != nil || a.GetUID() != "" {
		t.Fatal("SlimMeta kept a field it does not hold")
	}
	if key, _ := cache.MetaNamespaceKeyFunc(&SlimMeta{Name: "node-a"}); key != "node-a" {
		t.Fatalf("cluster-scoped key %q", key)
	}
}
