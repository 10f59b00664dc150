package agentendpoints

import (
	"log/slog"

	"github.com/cilium/cilium/api/v1/models"
	"github.com/cilium/hive/cell"

	"github.com/tendril-net/tendril/api/v1/server"
	"github.com/tendril-net/tendril/pkg/agent/agentpolicy"
	"github.com/tendril-net/tendril/pkg/datapath/loader"
	"github.com/tendril-net/tendril/pkg/endpoint"
	"github.com/tendril-net/tendril/pkg/endpointmanager/endpointapi"
	"github.com/tendril-net/tendril/pkg/ipam/ipamapi"
)

// PolicyModel is an endpoint's policy status in its model, as the policy
// resolves it.
type PolicyModel func(ep *endpoint.Endpoint) *models.EndpointPolicyStatus

type apiParams struct {
	cell.In

	Endpoints *Module
	Log       *slog.Logger
	// Loader is the datapath's loader; nil without the datapath.
	Loader      *loader.Loader
	PolicyModel PolicyModel
}

// apiHandlers serves the IPAM, endpoint and CNI APIs. Endpoints created
// or removed through them hold the datapath's moves to TCX links
// meanwhile.
func apiHandlers(p apiParams) server.HandlersOut {
	eps := p.Endpoints
	var hold func() func()
	if p.Loader != nil {
		hold = p.Loader.HoldPromotions
	}
	ipamAPI := &ipamapi.Handlers{Log: p.Log, IPAM: eps.IPAM, NodeAddressing: eps.NodeAddressing,
		Endpoints: func() []*endpoint.Endpoint { return eps.Manager().List() }}
	endpointAPI := &endpointapi.Handlers{Log: p.Log, Manager: eps.ManagerForAPI, NodeAddressing: eps.NodeAddressing,
		ApplyPodLabels: eps.ApplyPodLabels, PolicyModel: p.PolicyModel,
		Holding: func(h server.HandlerFunc) server.HandlerFunc { return Holding(hold, h) }}
	cniAPI := &CNIAPI{Endpoints: eps, HoldPromotions: hold}
	return server.Handlers(ipamAPI.Register, endpointAPI.Register, cniAPI.Register)
}

// ListForAPI lists the endpoints, or the API's 503 before the start step
// built their manager.
func (m *Module) ListForAPI() ([]*endpoint.Endpoint, error) {
	mgr, err := m.ManagerForAPI()
	if err != nil {
		return nil, err
	}
	return mgr.List(), nil
}

// Lookup finds an endpoint by ID, or the API's 503 before the start step
// built the manager.
func (m *Module) Lookup(id string) (*endpoint.Endpoint, error) {
	mgr, err := m.ManagerForAPI()
	if err != nil {
		return nil, err
	}
	return mgr.Lookup(id)
}

// policyModelOf is the policy's model of an endpoint's policy status.
func policyModelOf(p *agentpolicy.Module) PolicyModel { return p.EndpointPolicyModel }
