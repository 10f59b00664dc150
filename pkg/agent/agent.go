// Package agent is the composition root of tendril-agent: a hive
// (github.com/cilium/hive) of the subsystem cells listed in cells.go. It
// builds the hive from the resolved configuration, starts it (each start
// step timed into the bootstrap stats, with its health) and stops it.
// See docs/architecture.md.
package agent

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/spf13/pflag"

	"github.com/tendril-net/tendril/pkg/datapath/loader"
	"github.com/tendril-net/tendril/pkg/health"
	"github.com/tendril-net/tendril/pkg/lifecycle"
	"github.com/tendril-net/tendril/pkg/option"
)

// Deps are what the caller (cmd/tendril-agent) hands the agent besides its
// config: the logger, its level (changed by PATCH /v1/config), the
// resolved flag set (the effective configuration) and what to call once
// the agent is ready.
type Deps struct {
	Log      *slog.Logger
	LogLevel *slog.LevelVar
	Flags    *pflag.FlagSet
	Sources  map[string]option.Source
	// Ready, when set, is called once Start has started every step: the
	// command ends the start's garbage collector target there
	// (pkg/startgc).
	Ready func()
}

// Agent is a node agent: its hive and what the caller asks of it.
type Agent struct {
	cfg    Config
	log    *slog.Logger
	ready  func()
	hive   *hive.Hive
	steps  *lifecycle.Steps
	health *health.Registry
}

// New builds the agent's hive and its object graph (every constructor
// runs, nothing starts until Start). extra cells are added after the
// agent's own: tests use them to reach the objects they inspect.
func New(cfg Config, deps Deps, extra ...cell.Cell) (*Agent, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := cfg.DefaultNodeName(); err != nil {
		return nil, err
	}
	if deps.Log == nil {
		deps.Log = slog.New(slog.DiscardHandler)
	}
	if deps.LogLevel == nil {
		deps.LogLevel = new(slog.LevelVar)
	}
	if cfg.Datapath.Enable {
		// A kernel before 6.6 has no TCX: the datapath attaches with tc
		// filters there rather than failing every endpoint's attach.
		mode, note := loader.ResolveAttachMode(loader.AttachMode(cfg.Datapath.AttachMode), loader.ProbeTCX)
		if note != "" {
			deps.Log.Warn("Datapath attach mode falls back to tc", "requested", cfg.Datapath.AttachMode, "reason", note)
			cfg.Datapath.AttachMode, cfg.attachModeNote = string(mode), note
		}
	}
	a := &Agent{cfg: cfg, log: deps.Log, ready: deps.Ready}
	all := append(cells(cfg, deps), extra...)
	all = append(all, cell.Invoke(func(s *lifecycle.Steps, h *health.Registry) { a.steps, a.health = s, h }))
	opts := hive.DefaultOptions()
	// The hive logs each hook at Info only when it takes longer than this
	// (at Debug otherwise), as the agent logged its steps before.
	opts.LogThreshold = time.Second
	a.hive = hive.NewWithOptions(opts, all...)
	if err := a.hive.Populate(deps.Log); err != nil {
		return nil, fmt.Errorf("build the agent: %w", err)
	}
	return a, nil
}

// Start starts every step in order; on failure the started ones are
// stopped.
func (a *Agent) Start(ctx context.Context) error {
	begin := time.Now()
	a.steps.Begin(begin)
	a.log.Info("Starting tendril-agent", "node", a.cfg.NodeName, "state-dir", a.cfg.StateDir, "bpf-root", a.cfg.BPFRoot)
	if err := a.hive.Start(a.log, ctx); err != nil {
		a.log.Error("Start step failed, stopping the modules already started", "error", err)
		stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if stopErr := a.hive.Stop(a.log, stopCtx); stopErr != nil {
			a.log.Error("Rollback after failed start", "error", stopErr)
		}
		return err
	}
	a.steps.SetTotal(time.Since(begin))
	a.log.Info("Agent ready", "bootstrap", time.Since(begin))
	if a.ready != nil {
		a.ready()
	}
	return nil
}

// Stop stops every started step in reverse order (job goroutines first).
func (a *Agent) Stop(ctx context.Context) error {
	a.log.Info("Stopping tendril-agent")
	return a.hive.Stop(a.log, ctx)
}

// Run starts the agent, serves until ctx ends, then stops it within
// stopTimeout.
func (a *Agent) Run(ctx context.Context, stopTimeout time.Duration) error {
	if err := a.Start(ctx); err != nil {
		return err
	}
	<-ctx.Done()
	stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), stopTimeout)
	defer cancel()
	return a.Stop(stopCtx)
}

// Health returns the health registry.
func (a *Agent) Health() *health.Registry { return a.health }
