package agent

import (
	"context"
	"log/slog"

	"github.com/cilium/hive/cell"

	"github.com/tendril-net/tendril/api/v1/server"
	"github.com/tendril-net/tendril/pkg/datapath/agentdatapath"
	"github.com/tendril-net/tendril/pkg/dbinspect"
	"github.com/tendril-net/tendril/pkg/endpoint"
	"github.com/tendril-net/tendril/pkg/endpointmanager/agentendpoints"
	"github.com/tendril-net/tendril/pkg/endpointmanager/endpointapi"
	"github.com/tendril-net/tendril/pkg/hubble/agentflows"
	"github.com/tendril-net/tendril/pkg/identity/identityapi"
	"github.com/tendril-net/tendril/pkg/identity/identitytable"
	"github.com/tendril-net/tendril/pkg/ipam/ipamapi"
	"github.com/tendril-net/tendril/pkg/lifecycle"
	"github.com/tendril-net/tendril/pkg/loadbalancer/agentservices"
	"github.com/tendril-net/tendril/pkg/metrics"
	"github.com/tendril-net/tendril/pkg/policy/agentpolicy"
	"github.com/tendril-net/tendril/pkg/policy/policyapi"
	"github.com/tendril-net/tendril/pkg/profiling"
)

// apiCell registers the REST API's handlers (Cilium v1 paths and the
// Tendril extensions) on the API server; each group of handlers gets only
// the subsystems it serves.
var apiCell = cell.Module("api-handlers", "REST API handlers",
	cell.Invoke(registerAPIHandlers),
)

type apiParams struct {
	cell.In

	Config    Config
	Log       *slog.Logger
	API       *server.Server
	IDTable   *identitytable.Table
	Endpoints *agentendpoints.Module
	Policy    *agentpolicy.Module
	Datapath  *agentdatapath.Module // nil without the datapath
	Services  *agentservices.Module
	Inspector *dbinspect.Inspector
	Metrics   *metrics.Server
}

func registerAPIHandlers(p apiParams) {
	(&metrics.API{Metrics: p.Metrics}).Register(p.API)
	(&agentservices.ServiceAPI{Services: p.Services}).Register(p.API)
	p.Inspector.RegisterAPI(p.API)
	(&policyapi.Handlers{Repo: p.Policy.Repository(), Universe: p.Policy.Universe, Source: agentpolicy.SourceAPI}).Register(p.API)
	(&agentdatapath.MapAPI{Datapath: p.Datapath, BPFRoot: p.Config.BPFRoot}).Register(p.API)
	ids := &identityapi.Handlers{Identities: p.IDTable, Endpoints: func() ([]*endpoint.Endpoint, error) {
		mgr, err := p.Endpoints.ManagerForAPI()
		if err != nil {
			return nil, err
		}
		return mgr.List(), nil
	}}
	if p.Datapath != nil {
		ids.IPCache = p.Datapath.IPCache()
	}
	ids.Register(p.API)
	eps := p.Endpoints
	// Endpoints created or removed through the API hold the datapath's
	// moves to TCX links meanwhile.
	var hold func() func()
	if p.Datapath != nil {
		hold = p.Datapath.Loader().HoldPromotions
	}
	(&ipamapi.Handlers{Log: p.Log, IPAM: eps.IPAM, NodeAddressing: eps.NodeAddressing,
		Endpoints: func() []*endpoint.Endpoint { return eps.Manager().List() }}).Register(p.API)
	(&endpointapi.Handlers{Log: p.Log, Manager: eps.ManagerForAPI, NodeAddressing: eps.NodeAddressing, ApplyPodLabels: eps.ApplyPodLabels,
		PolicyModel: p.Policy.EndpointPolicyModel, Holding: func(h server.HandlerFunc) server.HandlerFunc { return agentendpoints.Holding(hold, h) }}).Register(p.API)
	(&agentendpoints.CNIAPI{Endpoints: p.Endpoints, HoldPromotions: hold}).Register(p.API)
}

// serveCell is start step 10: metrics, pprof, the Hubble API, then the API served, once
// every subsystem is built and every handler registered (it takes the
// handlers' cell's products: the API server with its handlers).
var serveCell = cell.Module("serve", "Metrics pprof and the API socket",
	cell.Invoke(registerServeSteps),
)

func registerServeSteps(lc cell.Lifecycle, steps *lifecycle.Steps, cfg Config, root cell.RootLogger, m *metrics.Server, api *server.Server, flows *agentflows.Module) {
	steps.Append(lc, "metrics", m.Start, m.Stop)
	pprofServer := profiling.New(cfg.Profiling, logFor(root, "pprof"))
	steps.Append(lc, "pprof", pprofServer.Start, pprofServer.Stop)
	if flows != nil {
		steps.Append(lc, "hubble", flows.Start, flows.Stop)
	}
	steps.Append(lc, "api-server", func(context.Context) error {
		if err := api.Listen(); err != nil {
			return err
		}
		return api.Serve()
	}, api.Stop)
}
