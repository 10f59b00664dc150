package agent

import (
	"context"
	"log/slog"

	"github.com/cilium/hive/cell"

	"github.com/tendril-net/tendril/api/v1/server"
	"github.com/tendril-net/tendril/pkg/datapath/hostdev"
	"github.com/tendril-net/tendril/pkg/dbinspect"
	"github.com/tendril-net/tendril/pkg/health"
	"github.com/tendril-net/tendril/pkg/identity"
	"github.com/tendril-net/tendril/pkg/lifecycle"
	"github.com/tendril-net/tendril/pkg/metrics"
	"github.com/tendril-net/tendril/pkg/option"
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

	Config     Config
	Log        *slog.Logger
	Flags      effectiveFlags
	Runtime    *option.Runtime
	Health     *health.Registry
	Steps      *lifecycle.Steps
	API        *server.Server
	Identities identity.Allocator
	Endpoints  *endpointsModule
	Policy     *policyModule
	Datapath   *datapathModule   // nil without the datapath
	K8s        *kubernetesModule // nil in standalone mode
	KVStore    *kvstoreModule    // nil without a kvstore
	Services   *servicesModule
	Inspector  *dbinspect.Inspector
	Flows      *flowsModule // nil with flows off
	Metrics    *metrics.Server
	Masquerade *hostdev.Masquerade // nil without the datapath
}

func registerAPIHandlers(p apiParams) {
	(&metricsAPI{metrics: p.Metrics}).register(p.API)
	(&daemonAPI{cfg: p.Config, flags: p.Flags, runtime: p.Runtime, health: p.Health, steps: p.Steps,
		identities: p.Identities, eps: p.Endpoints, dp: p.Datapath, k8s: p.K8s, kvstore: p.KVStore, services: p.Services, tables: p.Inspector, flows: p.Flows, masq: p.Masquerade}).register(p.API)
	(&serviceAPI{services: p.Services}).register(p.API)
	registerStateDBAPI(p.API, p.Inspector)
	(&policyAPI{policy: p.Policy}).register(p.API)
	(&mapAPI{cfg: p.Config, dp: p.Datapath}).register(p.API)
	(&identityAPI{identities: p.Identities, eps: p.Endpoints, dp: p.Datapath}).register(p.API)
	(&ipamAPI{log: p.Log, eps: p.Endpoints}).register(p.API)
	(&endpointAPI{log: p.Log, eps: p.Endpoints, policy: p.Policy, dp: p.Datapath}).register(p.API)
	(&cniAPI{eps: p.Endpoints, dp: p.Datapath}).register(p.API)
}

// daemonAPI serves /v1/healthz (the status), /v1/config and /v1/debuginfo.
type daemonAPI struct {
	cfg        Config
	flags      effectiveFlags
	runtime    *option.Runtime
	health     *health.Registry
	steps      *lifecycle.Steps
	identities identity.Allocator
	eps        *endpointsModule
	dp         *datapathModule
	k8s        *kubernetesModule
	kvstore    *kvstoreModule
	services   *servicesModule
	tables     *dbinspect.Inspector
	flows      *flowsModule
	masq       *hostdev.Masquerade
}

// policyAPI serves /v1/policy.
type policyAPI struct{ policy *policyModule }

// mapAPI serves /v1/map: the BPF maps' contents.
type mapAPI struct {
	cfg Config
	dp  *datapathModule
}

// identityAPI serves /v1/identity and /v1/ip.
type identityAPI struct {
	identities identity.Allocator
	eps        *endpointsModule
	dp         *datapathModule
}

// ipamAPI serves /v1/ipam.
type ipamAPI struct {
	log *slog.Logger
	eps *endpointsModule
}

// endpointAPI serves /v1/endpoint.
type endpointAPI struct {
	log    *slog.Logger
	eps    *endpointsModule
	policy *policyModule
	dp     *datapathModule
}

// cniAPI serves tendril-cni's commands.
type cniAPI struct {
	eps *endpointsModule
	dp  *datapathModule
}

// serveCell is start step 10: metrics, pprof, the Hubble API, then the API served, once
// every subsystem is built and every handler registered (it takes the
// handlers' cell's products: the API server with its handlers).
var serveCell = cell.Module("serve", "Metrics pprof and the API socket",
	cell.Invoke(registerServeSteps),
)

func registerServeSteps(lc cell.Lifecycle, steps *lifecycle.Steps, cfg Config, root cell.RootLogger, m *metrics.Server, api *server.Server, flows *flowsModule) {
	steps.Append(lc, "metrics", m.Start, m.Stop)
	pprofServer := profiling.New(cfg.Profiling, logFor(root, "pprof"))
	steps.Append(lc, "pprof", pprofServer.Start, pprofServer.Stop)
	if flows != nil {
		steps.Append(lc, "hubble", flows.start, flows.stop)
	}
	steps.Append(lc, "api-server", func(context.Context) error {
		if err := api.Listen(); err != nil {
			return err
		}
		return api.Serve()
	}, api.Stop)
}
