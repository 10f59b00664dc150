package agentservices

import "github.com/tendril-net/tendril/pkg/agent/agentk8s"

// watchersOf are the Kubernetes client's watchers (they exist once its
// step has connected); nil in standalone mode.
func watchersOf(k *agentk8s.Client) Watchers {
	if k == nil {
		return nil
	}
	return k.Watchers
}
