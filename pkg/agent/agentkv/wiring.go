package agentkv

import (
	"github.com/tendril-net/tendril/pkg/agent/agentendpoints"
	"github.com/tendril-net/tendril/pkg/agent/agentk8s"
	"github.com/tendril-net/tendril/pkg/endpoint"
	"github.com/tendril-net/tendril/pkg/endpointmanager"
)

// endpointsOf reads the endpoint manager, which the endpoints' start step
// builds (before the kvstore's), and subscribes to it then.
func endpointsOf(eps *agentendpoints.Module) Endpoints { return managerOf{eps} }

type managerOf struct{ eps *agentendpoints.Module }

func (m managerOf) Subscribe(fn func(endpointmanager.Event)) { m.eps.Manager().Subscribe(fn) }
func (m managerOf) List() []*endpoint.Endpoint               { return m.eps.Manager().List() }
func (m managerOf) Lookup(id string) (*endpoint.Endpoint, error) {
	return m.eps.Manager().Lookup(id)
}

// nodeIPOf is the node's address as Kubernetes knows it; nil in
// standalone mode.
func nodeIPOf(k *agentk8s.Module) NodeIP {
	if k == nil {
		return nil
	}
	return k.NodeIP
}
