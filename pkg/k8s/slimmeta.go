package k8s

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
)

// SlimMeta is the metadata an informer needs of a cached object it was
// transformed into: its key and resource version, 48 bytes instead of
// metav1.ObjectMeta's 264 (≈ 21 MiB less at 100,000 cached EndpointSlices, by arithmetic). It
// implements metav1.Object, so that client-go's key functions and indexes
// take it; the other fields read as unset and setting them does nothing
// (nothing writes through a cache's objects).
type SlimMeta struct {
	Name, Namespace, ResourceVersion string
}

var _ metav1.Object = &SlimMeta{}

// GetObjectKind implements runtime.Object's half for embedding types: a
// transformed object carries no kind (client-go does not read it from
// the cache).
func (m *SlimMeta) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }

func (m *SlimMeta) GetNamespace() string                          { return m.Namespace }
func (m *SlimMeta) SetNamespace(namespace string)                 { m.Namespace = namespace }
func (m *SlimMeta) GetName() string                               { return m.Name }
func (m *SlimMeta) SetName(name string)                           { m.Name = name }
func (m *SlimMeta) GetResourceVersion() string                    { return m.ResourceVersion }
func (m *SlimMeta) SetResourceVersion(version string)             { m.ResourceVersion = version }
func (m *SlimMeta) GetGenerateName() string                       { return "" }
func (m *SlimMeta) SetGenerateName(string)                        {}
func (m *SlimMeta) GetUID() types.UID                             { return "" }
func (m *SlimMeta) SetUID(types.UID)                              {}
func (m *SlimMeta) GetGeneration() int64                          { return 0 }
func (m *SlimMeta) SetGeneration(int64)                           {}
func (m *SlimMeta) GetSelfLink() string                           { return "" }
func (m *SlimMeta) SetSelfLink(string)                            {}
func (m *SlimMeta) GetCreationTimestamp() metav1.Time             { return metav1.Time{} }
func (m *SlimMeta) SetCreationTimestamp(metav1.Time)              {}
func (m *SlimMeta) GetDeletionTimestamp() *metav1.Time            { return nil }
func (m *SlimMeta) SetDeletionTimestamp(*metav1.Time)             {}
func (m *SlimMeta) GetDeletionGracePeriodSeconds() *int64         { return nil }
func (m *SlimMeta) SetDeletionGracePeriodSeconds(*int64)          {}
func (m *SlimMeta) GetLabels() map[string]string                  { return nil }
func (m *SlimMeta) SetLabels(map[string]string)                   {}
func (m *SlimMeta) GetAnnotations() map[string]string             { return nil }
func (m *SlimMeta) SetAnnotations(map[string]string)              {}
func (m *SlimMeta) GetFinalizers() []string                       { return nil }
func (m *SlimMeta) SetFinalizers([]string)                        {}
func (m *SlimMeta) GetOwnerReferences() []metav1.OwnerReference   { return nil }
func (m *SlimMeta) SetOwnerReferences([]metav1.OwnerReference)    {}
func (m *SlimMeta) GetManagedFields() []metav1.ManagedFieldsEntry { return nil }
func (m *SlimMeta) SetManagedFields([]metav1.ManagedFieldsEntry)  {}
