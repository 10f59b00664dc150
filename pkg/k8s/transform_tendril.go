package k8s

import "github.com/tendril-net/tendril/pkg/k8s/apis/tendril.io/v1alpha1"

// StripTendril is the Tendril informers' transform: StripManagedFields,
// and for a TendrilEndpoint its identity's label list. The agent reads
// another node's endpoint for its addresses, node, identity number and
// named ports; an identity's labels come from the identity itself
// (TendrilIdentity, or the kvstore), and the endpoint publisher reads this
// node's own objects from the API server, not from the cache. With one
// TendrilEndpoint per pod the list is most of each cached object: at
// 50,000 pods about 20 MiB of the agent's heap (bench/scale).
func StripTendril(obj any) (any, error) {
	if tep, ok := obj.(*v1alpha1.TendrilEndpoint); ok && tep.Status.Identity != nil {
		id := *tep.Status.Identity
		id.Labels = nil
		tep.Status.Identity = &id
	}
	return StripManagedFields(obj)
}
