package agentcore

import (
	"context"

	"github.com/cilium/hive/cell"

	"github.com/tendril-net/tendril/api/v1/server"
	"github.com/tendril-net/tendril/pkg/agent/agentflows"
	"github.com/tendril-net/tendril/pkg/lifecycle"
	"github.com/tendril-net/tendril/pkg/logging"
	"github.com/tendril-net/tendril/pkg/metrics"
	"github.com/tendril-net/tendril/pkg/profiling"
)

// ServeCell registers the handlers every subsystem cell provides (the
// "api-handlers" value group, api/v1/server.HandlersOut) on the API
// server, and is start step 10: metrics, pprof, the Hubble API, then the
// API served, once every subsystem is built and every handler registered.
var ServeCell = cell.Module("serve", "Metrics pprof and the API socket",
	cell.Provide(registerServeSteps),
	cell.Config(profiling.DefaultConfig()),
)

func registerServeSteps(lc cell.Lifecycle, steps *lifecycle.Steps, cfg profiling.Config, root cell.RootLogger, m *metrics.Server,
	api *server.Server, handlers server.HandlersIn, flows *agentflows.Module) lifecycle.Invoked {
	handlers.RegisterAll(api)
	steps.Append(lc, "metrics", m.Start, m.Stop)
	pprofServer := profiling.New(cfg, logging.For(root, "pprof"))
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
	return lifecycle.Invoked{}
}
