// Package agent is the composition root of tendril-agent: a hive
// (github.com/cilium/hive) of the subsystem cells listed in cells.go. It
// builds the hive, whose cells own their flags (cell.Config), populates
// it from the flags' values, starts it (each start step timed into the
// bootstrap stats, with its health) and stops it.
// See docs/architecture.md.
package agent

import (
	"context"
	"fmt"
	"log/slog"
	"reflect"
	"time"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/spf13/pflag"
	"go.uber.org/dig"

	"github.com/tendril-net/tendril/pkg/agent/daemonapi"
	"github.com/tendril-net/tendril/pkg/health"
	"github.com/tendril-net/tendril/pkg/lifecycle"
	"github.com/tendril-net/tendril/pkg/option"
)

// Deps are what the caller (cmd/tendril-agent) hands the agent besides
// its flags: the logger, its level (changed by PATCH /v1/config), the
// resolved flag set (the effective configuration, which the API reports)
// and what to call once the agent is ready.
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
	deps   Deps
	log    *slog.Logger
	hive   *hive.Hive
	steps  *lifecycle.Steps
	health *health.Registry
	opts   option.Agent
	node   option.LocalNode
}

// New builds the agent's hive of the cells: every cell's flags exist
// (RegisterFlags), nothing is constructed until Populate. extra cells are
// added after the agent's own: tests use them to reach the objects they
// inspect.
func New(extra ...cell.Cell) *Agent {
	a := &Agent{}
	all := append(cells(),
		// What the command hands the core cell, read when the hive is
		// populated.
		cell.Provide(
			func() *slog.LevelVar { return a.deps.LogLevel },
			func() daemonapi.Flags { return daemonapi.Flags{Set: a.deps.Flags} },
		),
		// The one Invoke: building the group runs every cell's Invoked
		// constructor, in the order of the cells (pkg/lifecycle.Invoked).
		cell.Invoke(func(_ lifecycle.InvokedAll, s *lifecycle.Steps, h *health.Registry, o option.Agent, n option.LocalNode) {
			a.steps, a.health, a.opts, a.node = s, h, o, n
		}))
	// The extra cells' Invokes run after the agent's: what they take is
	// built in the cells' order first.
	all = append(all, extra...)
	opts := hive.DefaultOptions()
	// TENDRIL_<FLAG> sets an option the command line does not (the
	// command resolves the environment and the config directory into the
	// flags first: pkg/option.Resolver).
	opts.EnvPrefix = option.EnvPrefix
	opts.DecodeHooks = cell.DecodeHooks{keepListsWhole}
	// The hive logs each hook at Info only when it takes longer than this
	// (at Debug otherwise), as the agent logged its steps before.
	opts.LogThreshold = time.Second
	a.hive = hive.NewWithOptions(opts, all...)
	return a
}

// RegisterFlags adds every cell's flags to fs (the command's): what is set
// on them before Populate configures the cells.
func (a *Agent) RegisterFlags(fs *pflag.FlagSet) { a.hive.RegisterFlags(fs) }

// Populate builds the agent's object graph from the flags' values: each
// cell decodes and validates its config, every constructor runs, nothing
// starts until Start. An invalid option is returned as its cell reported
// it (naming the option).
func (a *Agent) Populate(deps Deps) error {
	if deps.Log == nil {
		deps.Log = slog.New(slog.DiscardHandler)
	}
	if deps.LogLevel == nil {
		deps.LogLevel = new(slog.LevelVar)
	}
	a.deps, a.log = deps, deps.Log
	if err := a.hive.Populate(slog.New(quietInvalid{deps.Log.Handler()})); err != nil {
		if cause := dig.RootCause(err); option.IsInvalid(cause) {
			return cause
		}
		return fmt.Errorf("build the agent: %w", err)
	}
	return nil
}

// quietInvalid drops the hive's log record of a failed invoke whose error
// is an invalid option: Populate returns that error, and the command
// reports it once, as it did when the agent validated its options before
// building the hive.
type quietInvalid struct{ slog.Handler }

func (h quietInvalid) Handle(ctx context.Context, r slog.Record) error {
	invalid := false
	r.Attrs(func(a slog.Attr) bool {
		if err, ok := a.Value.Any().(error); ok && option.IsInvalid(err) {
			invalid = true
		}
		return !invalid
	})
	if invalid {
		return nil
	}
	return h.Handler.Handle(ctx, r)
}

func (h quietInvalid) WithAttrs(attrs []slog.Attr) slog.Handler {
	return quietInvalid{h.Handler.WithAttrs(attrs)}
}

func (h quietInvalid) WithGroup(name string) slog.Handler {
	return quietInvalid{h.Handler.WithGroup(name)}
}

// keepListsWhole is a decode hook of the agent's hive: a list flag's
// values reach the cell's config as the flag parsed them. cell.Config's
// decoding splits a []string of one value again at its spaces (so that
// "a b" from an environment variable is two values); here every value
// comes through the flags (the command resolves the environment and the
// config directory into them), and one value holding a space is one
// value: a label pattern "a{1, 2}" or a file path. The hook sees the
// config's whole input first and hands each []string on as a []any,
// which that split does not touch and which decodes into the []string
// field the same.
func keepListsWhole(_, to reflect.Type, data any) (any, error) {
	in, ok := data.(map[string]any)
	if !ok || to.Kind() != reflect.Struct {
		return data, nil
	}
	out := make(map[string]any, len(in))
	for k, v := range in {
		if list, ok := v.([]string); ok {
			values := make([]any, len(list))
			for i, s := range list {
				values[i] = s
			}
			v = values
		}
		out[k] = v
	}
	return out, nil
}

// Start starts every step in order; on failure the started ones are
// stopped.
func (a *Agent) Start(ctx context.Context) error {
	begin := time.Now()
	a.steps.Begin(begin)
	a.log.Info("Starting tendril-agent", "node", a.node.Name, "state-dir", a.opts.StateDir, "bpf-root", a.opts.BPFRoot)
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
	if a.deps.Ready != nil {
		a.deps.Ready()
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
