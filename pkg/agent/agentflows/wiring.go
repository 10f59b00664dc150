package agentflows

import (
	corev1 "k8s.io/api/core/v1"

	"github.com/tendril-net/tendril/pkg/agent/agentk8s"
	"github.com/tendril-net/tendril/pkg/k8s/watchers"
)

// nodeEventsOf follows the Node objects for the Peer service; nil in
// standalone mode.
func nodeEventsOf(k *agentk8s.Client) NodeEvents {
	if k == nil {
		return nil
	}
	return func(fn func(watchers.Event[*corev1.Node])) (func(), error) {
		w := k.Watchers()
		if w == nil {
			return nil, nil
		}
		return w.Nodes.Subscribe(fn)
	}
}
