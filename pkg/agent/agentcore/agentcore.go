// Package agentcore is the agent's core cell: the agent's own options
// (option.Agent: state dir, bpffs root, node name, log and runtime
// options), the API socket and the metrics server with their flags, the
// node's resolved name, the health registry, the start steps, the
// runtime options, the statedb database and its inspection, the "config"
// start step (the state dir's lock) and the serve cell (metrics, pprof,
// the Hubble API and the API socket served last).
package agentcore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"

	"github.com/tendril-net/tendril/api/v1/server"
	"github.com/tendril-net/tendril/pkg/dbinspect"
	"github.com/tendril-net/tendril/pkg/health"
	"github.com/tendril-net/tendril/pkg/heaptrim"
	"github.com/tendril-net/tendril/pkg/lifecycle"
	"github.com/tendril-net/tendril/pkg/lockfile"
	"github.com/tendril-net/tendril/pkg/logging"
	"github.com/tendril-net/tendril/pkg/metrics"
	"github.com/tendril-net/tendril/pkg/option"
)

// Cell provides what the subsystems share: the agent's own options and
// the node's name, the health registry, the start-step recorder, the
// runtime options, the metrics registry and the API server handlers
// register on. Its "config" step is the first. The command provides the
// log level (*slog.LevelVar) and the resolved flags (daemonapi.Flags).
var Cell = cell.Module("agent-core", "Configuration health bootstrap stats runtime options and shared services",
	cell.Provide(validate),
	cell.Config(option.DefaultAgent()),
	cell.Config(server.DefaultConfig()),
	cell.Config(metrics.DefaultConfig()),
	cell.Provide(
		localNode,
		health.NewRegistry,
		lifecycle.NewSteps,
		newRuntime,
		newMetricsServer,
		newAPIServer,
	),
	// The job registry's own hook goes first, so jobs added by start
	// steps start at once and stop before every step.
	cell.Provide(lifecycle.Build[job.Registry]),
	cell.Provide(registerConfigStep),
	cell.Provide(startHeapTrim),
)

// TablesCell provides the database (statedb.Cell) and its Inspector,
// with the inspector's API handlers and status section.
var TablesCell = cell.Group(
	statedb.Cell,
	cell.Module("statedb-inspect", "Inspection of the statedb tables",
		cell.Provide(dbinspect.New, dbinspect.StatusContribution, dbinspect.APIHandlers),
	),
)

// validate checks the agent's own options and the API server's; each
// error names its option.
func validate(a option.Agent, api server.Config) (lifecycle.Invoked, error) {
	return lifecycle.Invoked{}, option.Invalid(errors.Join(a.Validate(), api.Validate()))
}

// localNode is the node's name: --node-name, else the host name.
func localNode(a option.Agent) (option.LocalNode, error) {
	n, err := a.ResolveLocalNode()
	return n, option.Invalid(err)
}

// startHeapTrim adds the job that returns the idle Go heap to the kernel
// once allocation is quiet (pkg/heaptrim: after the start and after a
// burst such as a resync, about half of an idle agent's RSS is freed heap
// the runtime keeps).
func startHeapTrim(jobs job.Registry, h *health.Registry, m *metrics.Server, root cell.RootLogger) lifecycle.Invoked {
	log := logging.For(root, "heaptrim")
	t := heaptrim.New(heaptrim.DefaultConfig(), log)
	m.Registry.MustRegister(t.Collectors()...)
	g := jobs.NewGroup(h.Scope("heaptrim"), job.WithLogger(log))
	g.Add(job.OneShot("heaptrim", func(ctx context.Context, _ cell.Health) error { return t.Run(ctx) }))
	return lifecycle.Invoked{}
}

// registerConfigStep is start step 1: the configuration is resolved
// already; create the directory the agent owns and lock it, before any
// step writes pins, restores endpoints or takes sockets over, so that a
// second agent on the same state dir stops here and disturbs nothing of
// the first. The lock goes when this step stops (or the process exits).
func registerConfigStep(lc cell.Lifecycle, steps *lifecycle.Steps, cfg option.Agent) lifecycle.Invoked {
	var lock *lockfile.Lock
	steps.Append(lc, "config", func(context.Context) error {
		l, err := lockfile.Acquire(cfg.StateDir)
		if errors.Is(err, lockfile.ErrHeld) {
			return fmt.Errorf("state dir %s: %w: another tendril-agent runs on it; stop it, or give this one its own --state-dir", cfg.StateDir, err)
		}
		if err != nil {
			return fmt.Errorf("state dir %s: %w", cfg.StateDir, err)
		}
		lock = l
		return nil
	}, func(context.Context) error {
		return lock.Release()
	})
	return lifecycle.Invoked{}
}

// newRuntime holds the options PATCH /v1/config changes at run time; the
// debug option sets the log level.
func newRuntime(cfg option.Agent, log *slog.Logger, level *slog.LevelVar) *option.Runtime {
	return option.NewLoggedRuntime(option.RuntimeValues{PolicyEnforcement: cfg.PolicyEnforcement, Debug: cfg.Debug}, log, level)
}

func newMetricsServer(cfg metrics.Config, root cell.RootLogger) *metrics.Server {
	return metrics.New(cfg, logging.For(root, "metrics"))
}

// newAPIServer is the API server the cells register their handlers on;
// it serves the metrics' own API.
func newAPIServer(cfg server.Config, root cell.RootLogger, m *metrics.Server) (*server.Server, error) {
	api, err := server.New(cfg, logging.For(root, "api"), m.Registry)
	if err != nil {
		return nil, fmt.Errorf("API server: %w", err)
	}
	(&metrics.API{Metrics: m}).Register(api)
	return api, nil
}
