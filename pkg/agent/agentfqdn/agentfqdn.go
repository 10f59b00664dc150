// Package agentfqdn is the agent's FQDN cell: the cache of what the DNS
// proxy learned (restored from the state directory before the first
// regeneration, saved after each change, expired on a timer), the
// names it hands to the policy (each learned address a CIDR identity
// toFQDNs select), Learn (the DNS proxy's hook: an answer is released
// only once the pod's policy has its addresses) and the /v1/fqdn routes.
package agentfqdn

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/spf13/pflag"

	"github.com/tendril-net/tendril/api/v1/server"
	"github.com/tendril-net/tendril/pkg/agent/agentpolicy"
	"github.com/tendril-net/tendril/pkg/fqdn"
	"github.com/tendril-net/tendril/pkg/fqdn/fqdnapi"
	"github.com/tendril-net/tendril/pkg/health"
	"github.com/tendril-net/tendril/pkg/lifecycle"
	"github.com/tendril-net/tendril/pkg/observer"
	"github.com/tendril-net/tendril/pkg/option"
	"github.com/tendril-net/tendril/pkg/policy/api"
)

// Cell is the FQDN cache's cell.
var Cell = cell.Module("fqdn", "The names the DNS proxy learned in policy and on the API",
	cell.Provide(lifecycle.Check(Config.validate)),
	cell.Provide(registerJobs),
	cell.Config(DefaultConfig()),
	cell.Provide(New, apiHandlers),
)

// Config is the cell's option.
type Config struct {
	// MinTTL is --tofqdns-min-ttl (Cilium's name), in seconds: a learned
	// name stays allowed at least this long whatever its TTL, so a pod
	// that caches an answer longer than its TTL (many do) still reaches
	// the address, and names outlive an agent restart.
	MinTTL int `mapstructure:"tofqdns-min-ttl"`
	// ProxyPort is --tofqdns-proxy-port (Cilium's name): the port the
	// node's DNS proxy listens on, UDP and TCP; 0 takes a free one at
	// each start. The datapath finds the proxy by its socket, not by
	// this number; a fixed port is for what sits around the node
	// (firewalls, monitoring) and keeps the port across restarts.
	ProxyPort int `mapstructure:"tofqdns-proxy-port"`
}

// DefaultConfig is Cilium's default: an hour.
func DefaultConfig() Config { return Config{MinTTL: 3600} }

// Flags implements cell.Flagger.
func (c Config) Flags(fs *pflag.FlagSet) {
	fs.Int("tofqdns-min-ttl", c.MinTTL, "Seconds a name the DNS proxy learned stays allowed at least, whatever its TTL")
	fs.Int("tofqdns-proxy-port", c.ProxyPort, "Port the DNS proxy listens on, UDP and TCP (0: a free port at each start)")
}

func (c Config) validate() error {
	if c.MinTTL < 0 || c.MinTTL > 7*24*3600 {
		return fmt.Errorf("tofqdns-min-ttl %d: want 0 to %d seconds", c.MinTTL, 7*24*3600)
	}
	if c.ProxyPort < 0 || c.ProxyPort > 65535 {
		return fmt.Errorf("tofqdns-proxy-port %d: want 0 (a free port) to 65535", c.ProxyPort)
	}
	return nil
}

// saveInterval is how often a changed cache is written and expired
// entries dropped.
const saveInterval = 5 * time.Second

// Manager holds the cache and keeps the policy's names in step with it.
type Manager struct {
	log      *slog.Logger
	cache    *fqdn.Cache
	policy   *agentpolicy.Module
	stateDir string
	// proxyPort is --tofqdns-proxy-port.
	proxyPort uint16
	// flows takes the DNS proxy's L7 flows (the flows cell's observer).
	flows observer.L7Sink

	mu      sync.Mutex
	lastGen uint64 // the policy's names generation of the last change
	dirty   bool
}

type params struct {
	cell.In

	Config Config
	Agent  option.Agent
	Log    *slog.Logger
	Policy *agentpolicy.Module
	// Flows is the flows cell's sink of L7 flows; absent in hives
	// without the flows cell (the proxy then records no flow).
	Flows observer.L7Sink `optional:"true"`
}

// New builds the manager and restores the saved cache into the policy's
// names. It does so here, before any start step, because the policy's
// first regeneration (of the restored endpoints) must already hold the
// learned addresses: otherwise it would take them out of the pinned
// policy maps that kept them allowed while the agent was down.
func New(p params) *Manager {
	m := &Manager{log: p.Log, cache: fqdn.NewCache(time.Duration(p.Config.MinTTL)*time.Second, nil), policy: p.Policy, stateDir: p.Agent.StateDir, proxyPort: uint16(p.Config.ProxyPort), flows: p.Flows}
	n, err := m.cache.Restore(m.stateDir)
	if err != nil {
		m.log.Warn("FQDN cache not restored; names are learned again at the next lookups", "error", err)
	} else if n > 0 {
		m.log.Info("Restored the FQDN cache", "names", n)
	}
	m.lastGen = m.policy.SetFQDNNames(m.cache.Names())
	return m
}

// ProxyConfig is the part of the DNS proxy's configuration this cell
// owns: Learned puts answers into policy before they are released, Flow
// publishes each query's L7 flow into the observer (hubble observe
// --type l7, the dns metrics). The redirect's listener adds the rest
// (Endpoint, Rules, OrigDst).
func (m *Manager) ProxyConfig() fqdn.ProxyConfig {
	cfg := fqdn.ProxyConfig{Learned: m.Learn, Log: m.log}
	if m.flows != nil {
		cfg.Flow = m.flows.PublishL7
	}
	return cfg
}

// ProxyPort is the port the DNS proxy is to listen on
// (--tofqdns-proxy-port; 0: any free one).
func (m *Manager) ProxyPort() uint16 { return m.proxyPort }

// Cache is the cache.
func (m *Manager) Cache() *fqdn.Cache { return m.cache }

// Learn is the DNS proxy's Learned hook: it adds the answer to the cache
// and returns once the policy of every endpoint holds the addresses (also
// when they were known: a lookup learning them concurrently may still be
// waiting).
func (m *Manager) Learn(ctx context.Context, src fqdn.Source, name string, ips []netip.Addr, ttl uint32) error {
	m.mu.Lock()
	if m.cache.Add(src.EndpointID, name, ips, ttl) {
		m.lastGen = m.policy.SetFQDNNames(m.cache.Names())
	}
	m.dirty = true
	g := m.lastGen
	m.mu.Unlock()
	return m.policy.WaitFQDNNames(ctx, g)
}

// changed hands the cache's names to the policy after entries went.
func (m *Manager) changed() {
	m.mu.Lock()
	m.lastGen = m.policy.SetFQDNNames(m.cache.Names())
	m.dirty = true
	m.mu.Unlock()
}

// tick expires entries and saves a changed cache.
func (m *Manager) tick(context.Context) error {
	if m.cache.Expire() {
		m.changed()
	}
	m.mu.Lock()
	dirty := m.dirty
	m.dirty = false
	m.mu.Unlock()
	if !dirty {
		return nil
	}
	if err := m.cache.Save(m.stateDir); err != nil {
		m.mu.Lock()
		m.dirty = true
		m.mu.Unlock()
		return err
	}
	return nil
}

// selectors are the toFQDNs selectors of the rules in force.
func (m *Manager) selectors() []api.FQDNSelector {
	rules, _ := m.policy.Repository().Rules(nil)
	var out []api.FQDNSelector
	for _, r := range rules {
		for _, eg := range r.Rule.Egress {
			out = append(out, eg.ToFQDNs...)
		}
	}
	return out
}

type jobParams struct {
	cell.In

	Log    *slog.Logger
	Jobs   job.Registry
	Health *health.Registry
}

func registerJobs(p jobParams, m *Manager) lifecycle.Invoked {
	g := p.Jobs.NewGroup(p.Health.Scope("fqdn"), job.WithLogger(p.Log))
	g.Add(job.Timer("fqdn-cache", m.tick, saveInterval))
	return lifecycle.Invoked{}
}

func apiHandlers(m *Manager) server.HandlersOut {
	return server.Handlers((&fqdnapi.Handlers{Cache: m.cache, Selectors: m.selectors, Deleted: m.changed}).Register)
}
