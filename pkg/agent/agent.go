// Package agent is the composition root of tendril-agent: it builds every
// module from the configuration and starts them in the order of
// ARCHITECTURE.md (config, sysctls and clients, BPF maps, restore, watchers,
// identities, host IPs, regeneration, then health, metrics and the API).
package agent

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/spf13/pflag"

	"github.com/tendril-net/tendril/api/v1/ext"
	"github.com/tendril-net/tendril/api/v1/server"
	"github.com/tendril-net/tendril/pkg/endpointmanager"
	"github.com/tendril-net/tendril/pkg/health"
	"github.com/tendril-net/tendril/pkg/identity"
	"github.com/tendril-net/tendril/pkg/identity/crdalloc"
	"github.com/tendril-net/tendril/pkg/identity/kvalloc"
	"github.com/tendril-net/tendril/pkg/labels"
	"github.com/tendril-net/tendril/pkg/lifecycle"
	"github.com/tendril-net/tendril/pkg/metrics"
	"github.com/tendril-net/tendril/pkg/option"
	"github.com/tendril-net/tendril/pkg/profiling"
)

// Deps are what the caller (cmd/tendril-agent) hands the agent besides its
// config: the logger, its level (changed by PATCH /v1/config) and the
// resolved flag set (the effective configuration).
type Deps struct {
	Log      *slog.Logger
	LogLevel *slog.LevelVar
	Flags    *pflag.FlagSet
	Sources  map[string]option.Source
}

// Agent is a running node agent.
type Agent struct {
	cfg      Config
	log      *slog.Logger
	logLevel *slog.LevelVar
	flags    *pflag.FlagSet
	sources  map[string]option.Source

	lc      *lifecycle.Lifecycle
	health  *health.Registry
	runtime *option.Runtime
	metrics *metrics.Server
	api     *server.Server

	endpoints *endpointsModule
	datapath  *datapathModule
	policy    *policyModule
	// k8s is the Kubernetes module; nil in standalone mode.
	k8s *kubernetesModule
	// labelFilter keeps the identity-relevant labels of pods.
	labelFilter *labels.Filter
	// kvstore is the etcd client module; nil without a kvstore.
	kvstore *kvstoreModule
	// identities is the identity allocator: local in standalone mode,
	// TendrilIdentity objects (crdalloc) in Kubernetes mode.
	identities identity.Allocator

	mu       sync.Mutex
	started  time.Time
	sections []func() ext.Section
	hooks    []endpointmanager.Regenerator
}

// AddRegenerateHook adds a step to every endpoint's regeneration (identity,
// policy, BPF), run in the order added; removal runs in reverse.
func (a *Agent) AddRegenerateHook(h endpointmanager.Regenerator) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.hooks = append(a.hooks, h)
}

func (a *Agent) regenerateHooks() []endpointmanager.Regenerator {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]endpointmanager.Regenerator(nil), a.hooks...)
}

// New builds the agent and its modules; nothing starts until Run.
func New(cfg Config, deps Deps) (*Agent, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.NodeName == "" {
		host, err := os.Hostname()
		if err != nil {
			return nil, fmt.Errorf("node-name not set and host name unknown: %w", err)
		}
		cfg.NodeName = host
	}
	log := deps.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	level := deps.LogLevel
	if level == nil {
		level = new(slog.LevelVar)
	}
	a := &Agent{
		cfg:      cfg,
		log:      log,
		logLevel: level,
		flags:    deps.Flags,
		sources:  deps.Sources,
		lc:       lifecycle.New(log),
		health:   health.NewRegistry(),
		runtime:  option.NewRuntime(option.RuntimeValues{PolicyEnforcement: cfg.PolicyEnforcement, Debug: cfg.Debug}),
	}
	a.runtime.Subscribe(func(v option.RuntimeValues) {
		if v.Debug {
			a.logLevel.Set(slog.LevelDebug)
		} else {
			a.logLevel.Set(slog.LevelInfo)
		}
		a.log.Info("Runtime options changed", "policy-enforcement", v.PolicyEnforcement, "debug", v.Debug)
	})
	a.metrics = metrics.New(cfg.Metrics, log.With("module", "metrics"))
	api, err := server.New(cfg.API, log.With("module", "api"), a.metrics.Registry)
	if err != nil {
		return nil, err
	}
	a.api = api
	a.endpoints = &endpointsModule{a: a}
	if a.labelFilter, err = labels.NewFilter(cfg.IdentityLabels); err != nil {
		return nil, fmt.Errorf("identity-labels: %w", err)
	}
	a.identities = identity.NewLocalAllocator()
	switch {
	case cfg.K8s.Enabled() && cfg.IdentityAllocationMode == IdentityAllocationCRD:
		a.identities = crdalloc.New(log.With("module", "identity-allocator"))
	case cfg.IdentityAllocationMode == IdentityAllocationKVStore:
		a.identities = kvalloc.New(nil, cfg.NodeName, log.With("module", "identity-allocator"))
	}
	if cfg.KVStore != KVStoreNone || len(cfg.KVStoreConfig.Endpoints) > 0 {
		a.kvstore = &kvstoreModule{a: a}
		a.AddStatusSection(a.kvstore.statusSection)
	}
	if cfg.K8s.Enabled() {
		a.k8s = newKubernetesModule(a)
		a.AddStatusSection(a.k8s.statusSection)
	}
	a.policy = newPolicyModule(a)
	if cfg.EnableDatapath {
		a.datapath = newDatapathModule(a)
		a.AddRegenerateHook(a.datapath)
		a.AddStatusSection(a.datapath.statusSection)
		// A new or vanished identity may change what other endpoints'
		// selectors select.
		a.datapath.identities.Subscribe(func(_, _ []identity.Identity) {
			if rules, _ := a.policy.repo.Rules(nil); len(rules) > 0 {
				a.policy.triggerRegeneration()
			}
		})
	}
	a.runtime.Subscribe(func(option.RuntimeValues) { a.policy.triggerRegeneration() })
	a.registerDaemonAPI()
	a.registerPolicyAPI()
	a.registerMapAPI()
	a.registerIdentityAPI()
	a.registerIPAMAPI()
	a.registerEndpointAPI()
	a.registerCNIAPI()
	a.AddStatusSection(a.endpoints.statusSection)
	a.AddStatusSection(a.identityStatusSection)
	a.buildStartList()
	return a, nil
}

// buildStartList appends the modules in start order. Each later capability
// adds its module here, at its place in the order.
func (a *Agent) buildStartList() {
	// 1. config: already resolved; check the directories we own.
	a.appendModule("config", func(ctx context.Context) error {
		if err := os.MkdirAll(a.cfg.StateDir, 0o750); err != nil {
			return fmt.Errorf("create state dir %s: %w", a.cfg.StateDir, err)
		}
		return nil
	}, nil)

	// 2. Kubernetes client: reach the API server, install the CRDs.
	if a.k8s != nil {
		a.appendModule("k8s-client", a.k8s.connect, nil)
	}

	// 3. open or create the pinned BPF maps before anything reads them.
	if a.datapath != nil {
		a.appendModule("bpf-maps", a.datapath.start, a.datapath.stop)
	}

	// 5. restore endpoints, pick the pod CIDRs, IPAM re-reserves restored
	// addresses before any new allocation, host device.
	a.appendModule("endpoint-restore-ipam", a.endpoints.start, a.endpoints.stop)
	if a.k8s != nil {
		a.appendModule("k8s-node-writeback", a.k8s.startWriteBack, nil)
		// 6. watchers, and their caches synced, before restored endpoints
		// regenerate: Kubernetes policies must be in first (fail closed).
		a.appendModule("k8s-watchers", a.k8s.startWatchers, a.k8s.stop)
	}

	// 7. kvstore (and the kvstore identity allocator's watch), then
	// identities: restored endpoints keep theirs.
	if a.kvstore != nil {
		a.appendModule("kvstore", a.kvstore.start, a.kvstore.stop)
	}
	if a.datapath != nil {
		a.appendModule("identity-restore", func(context.Context) error {
			a.datapath.reserveRestored(a.endpoints.mgr.List())
			return nil
		}, nil)
		// 8. host IPs into the ipcache; conntrack GC.
		a.appendModule("host-ips-ct-gc", a.datapath.syncHostIPs, nil)
	}

	// Policy imported through the API before the restart, so restored
	// endpoints regenerate to exactly what they enforced.
	a.appendModule("policy-restore", a.policy.restorePolicy, a.policy.stopPolicyFile)

	// 9. regenerate the restored endpoints once identities and policy are in;
	// then keep endpoints in line with policy changes.
	a.appendModule("regenerate-restored", a.endpoints.regenerateRestored, a.endpoints.stopRegeneration)
	var policyCancel context.CancelFunc
	policyDone := make(chan struct{})
	a.appendModule("policy-regeneration", func(context.Context) error {
		ctx, cancel := context.WithCancel(context.Background())
		policyCancel = cancel
		go func() {
			defer close(policyDone)
			a.policy.run(ctx)
		}()
		return nil
	}, func(context.Context) error {
		policyCancel()
		<-policyDone
		return nil
	})

	// 10. health, status, metrics, then serve the API; mark ready.
	a.appendModule("metrics", a.metrics.Start, a.metrics.Stop)
	pprofServer := profiling.New(a.cfg.Profiling, a.log.With("module", "pprof"))
	a.appendModule("pprof", pprofServer.Start, pprofServer.Stop)
	a.appendModule("api-server", func(context.Context) error {
		if err := a.api.Listen(); err != nil {
			return err
		}
		return a.api.Serve()
	}, a.api.Stop)
}

// appendModule adds a module whose health is OK once it has started.
func (a *Agent) appendModule(name string, start, stop func(context.Context) error) {
	rep := a.health.Reporter(name)
	a.lc.Append(lifecycle.Hook{
		Name: name,
		Start: func(ctx context.Context) error {
			if start != nil {
				if err := start(ctx); err != nil {
					rep.Failed(err.Error())
					return err
				}
			}
			rep.OK("started")
			return nil
		},
		Stop: func(ctx context.Context) error {
			rep.Stopped()
			if stop == nil {
				return nil
			}
			return stop(ctx)
		},
	})
}

// AddStatusSection registers a provider of status lines for `tendril status`.
func (a *Agent) AddStatusSection(fn func() ext.Section) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.sections = append(a.sections, fn)
}

// Start starts every module in order; on failure the started ones are stopped.
func (a *Agent) Start(ctx context.Context) error {
	a.mu.Lock()
	a.started = time.Now()
	a.mu.Unlock()
	a.log.Info("Starting tendril-agent", "node", a.cfg.NodeName, "state-dir", a.cfg.StateDir, "bpf-root", a.cfg.BPFRoot)
	if err := a.lc.Start(ctx); err != nil {
		return err
	}
	_, total := a.lc.Stats()
	a.log.Info("Agent ready", "bootstrap", total)
	return nil
}

// Stop stops every module in reverse order.
func (a *Agent) Stop(ctx context.Context) error {
	a.log.Info("Stopping tendril-agent")
	return a.lc.Stop(ctx)
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

// API returns the REST server so modules can register handlers.
func (a *Agent) API() *server.Server { return a.api }

// Health returns the health registry.
func (a *Agent) Health() *health.Registry { return a.health }
