package k8s

import (
	"unique"

	"k8s.io/apimachinery/pkg/runtime"

	"github.com/tendril-net/tendril/pkg/k8s/apis/tendril.io/v1alpha1"
)

// StripTendril is the Tendril informers' transform: StripManagedFields,
// and a TendrilEndpoint becomes a CachedEndpoint. The agent reads another
// node's endpoint for its addresses, node, identity number and named
// ports; an identity's labels come from the identity itself
// (TendrilIdentity, or the kvstore), and the endpoint publisher reads this
// node's own objects from the API server, not from the cache. With one
// TendrilEndpoint per pod the identity's label list was most of each
// cached object (at 50,000 pods about 20 MiB of the agent's heap,
// bench/scale), and the object's metadata most of the rest.
func StripTendril(obj any) (any, error) {
	switch o := obj.(type) {
	case *v1alpha1.TendrilEndpoint:
		return NewCachedEndpoint(o), nil
	case *CachedEndpoint:
		// Already converted (a transform must be idempotent).
		return o, nil
	}
	return StripManagedFields(obj)
}

// CachedEndpoint is a TendrilEndpoint as the agent's informer caches it:
// its key and resource version, and its status with the identity's number
// but not its label list. Nothing may change one once made (the cache's
// readers share it).
type CachedEndpoint struct {
	SlimMeta
	Status v1alpha1.EndpointStatus
}

// NewCachedEndpoint converts tep, which it does not change (the informer
// may hand the transform an object others hold); the node address, the
// state and the namespace are interned (shared by the endpoints of a node,
// of a namespace).
func NewCachedEndpoint(tep *v1alpha1.TendrilEndpoint) *CachedEndpoint {
	e := &CachedEndpoint{SlimMeta: SlimMeta{Name: tep.Name, Namespace: Intern(tep.Namespace), ResourceVersion: tep.ResourceVersion},
		Status: tep.Status}
	e.Status.State = Intern(e.Status.State)
	if id := tep.Status.Identity; id != nil {
		e.Status.Identity = &v1alpha1.EndpointIdentity{ID: id.ID}
	}
	if n := tep.Status.Networking; n != nil {
		e.Status.Networking = &v1alpha1.EndpointNetworking{Addressing: n.Addressing, NodeIP: Intern(n.NodeIP)}
	}
	return e
}

// TendrilEndpoint is the cached endpoint as an API object (name,
// namespace and status).
func (e *CachedEndpoint) TendrilEndpoint() v1alpha1.TendrilEndpoint {
	var tep v1alpha1.TendrilEndpoint
	tep.Name, tep.Namespace = e.Name, e.Namespace
	tep.Status = *e.Status.DeepCopy()
	return tep
}

// DeepCopyObject implements runtime.Object.
func (e *CachedEndpoint) DeepCopyObject() runtime.Object {
	if e == nil {
		return nil
	}
	c := &CachedEndpoint{SlimMeta: e.SlimMeta}
	e.Status.DeepCopyInto(&c.Status)
	return c
}

// Intern returns the canonical copy of s: many cached objects share one
// (namespaces, node names and addresses, zones). The unique package drops
// a value once nothing holds it, so names of nodes long gone do not
// accumulate.
func Intern(s string) string {
	if s == "" {
		return ""
	}
	return unique.Make(s).Value()
}
