// Package agentpolicy is the agent's policy cell: the policy repository,
// its resolution per endpoint (shared per revision and label set), the
// node-local CIDR identities of the prefixes rules name, the realization of
// an endpoint's policy in the BPF policy map, the audit counters, and the
// policy file that keeps the rules imported through the API across
// restarts. Its start step is "policy-restore".
package agentpolicy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"path/filepath"
	"sync"
	"sync/atomic"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/spf13/pflag"

	"github.com/tendril-net/tendril/pkg/datapath/maps"
	"github.com/tendril-net/tendril/pkg/endpoint"
	"github.com/tendril-net/tendril/pkg/endpointmanager"
	"github.com/tendril-net/tendril/pkg/health"
	"github.com/tendril-net/tendril/pkg/identity"
	"github.com/tendril-net/tendril/pkg/identity/identitytable"
	"github.com/tendril-net/tendril/pkg/ipcache"
	"github.com/tendril-net/tendril/pkg/lifecycle"
	"github.com/tendril-net/tendril/pkg/logging"
	"github.com/tendril-net/tendril/pkg/mapevents"
	"github.com/tendril-net/tendril/pkg/metrics"
	"github.com/tendril-net/tendril/pkg/option"
	"github.com/tendril-net/tendril/pkg/policy"
	"github.com/tendril-net/tendril/pkg/policy/policycidr"
	"github.com/tendril-net/tendril/pkg/policy/policyfile"
)

// Cell is the policy repository and its resolution per endpoint; its start
// step restores the rules imported through the API before the restart, so
// restored endpoints regenerate to exactly what they enforced.
var Cell = cell.Module("policy", "Policy repository resolution and the policy file",
	cell.Provide(lifecycle.Check(Config.validate)),
	cell.Provide(registerRestore),
	cell.Config(DefaultConfig()),
	cell.Provide(New, apiHandlers, hostFirewallStatus),
)

// Config is the cell's option. (The enforcement mode is the agent's
// own, a runtime option: pkg/option.)
type Config struct {
	// RevokeEstablished is --policy-revoke-established: which established
	// flows a policy change ends (option.RevokeDeny, RevokeAll,
	// RevokeNone; empty is RevokeDeny).
	RevokeEstablished string `mapstructure:"policy-revoke-established"`
	// AllowLocalhost is --allow-localhost (Cilium's name): "always" lets
	// the node reach its endpoints under ingress policy unless a deny
	// covers it (the kubelet's probes come from the node; the Helm
	// chart sets it), "policy" treats the host identity like any other.
	AllowLocalhost string `mapstructure:"allow-localhost"`
	// EnableHostFirewall is --enable-host-firewall: host policies
	// (nodeSelector) apply to this node's own traffic at its uplinks.
	EnableHostFirewall bool `mapstructure:"enable-host-firewall"`
	// HostFirewallAudit is --host-firewall-audit: every host policy is
	// audited (what it would deny passes, counted and reported).
	HostFirewallAudit bool `mapstructure:"host-firewall-audit"`
	// HostFirewallAlwaysAllow is --host-firewall-always-allow: ports
	// (direction/protocol/port) open to every peer while a host policy
	// enforces their direction, unless one names them.
	HostFirewallAlwaysAllow []string `mapstructure:"host-firewall-always-allow"`
}

// Values of --allow-localhost.
const (
	AllowLocalhostAlways = "always"
	AllowLocalhostPolicy = "policy"
)

// DefaultConfig is the cell's default: deny rules end the flows they
// cover.
func DefaultConfig() Config {
	return Config{RevokeEstablished: option.RevokeDeny, AllowLocalhost: AllowLocalhostPolicy,
		HostFirewallAlwaysAllow: append([]string(nil), DefaultHostFirewallAlwaysAllow...)}
}

// Flags registers the cell's option, with c's value as default.
func (c Config) Flags(fs *pflag.FlagSet) {
	fs.String("policy-revoke-established", c.RevokeEstablished,
		"Established flows a policy change ends: deny (those a deny rule covers), all (also those no allow admits any more) or none (they outlive it, as in Cilium)")
	fs.String("allow-localhost", c.AllowLocalhost,
		"Traffic from the node to its endpoints under ingress policy: always (allowed unless a deny rule covers it, as Cilium's default; the kubelet's probes need it) or policy (only what the rules allow)")
	fs.Bool("enable-host-firewall", c.EnableHostFirewall,
		"Enforce host policies (cluster-wide policies with a nodeSelector) on this node's own traffic at its uplinks (docs/host-firewall.md)")
	fs.Bool("host-firewall-audit", c.HostFirewallAudit,
		"Audit every host policy: what it would deny passes, counted and reported with an AUDIT verdict (try host policies without locking the node out)")
	fs.StringSlice("host-firewall-always-allow", c.HostFirewallAlwaysAllow,
		"Ports (direction/protocol/port) open to every peer while a host policy enforces their direction, unless a host policy names them: the API server, the kubelet, the agent's health")
}

func (c Config) validate() error {
	var errAllow error
	switch c.AllowLocalhost {
	case "", AllowLocalhostAlways, AllowLocalhostPolicy:
	default:
		errAllow = fmt.Errorf("allow-localhost %q: must be always or policy", c.AllowLocalhost)
	}
	_, errPorts := parseAlwaysAllow(c.HostFirewallAlwaysAllow)
	return option.Invalid(errors.Join(option.ValidateRevokeMode(c.RevokeEstablished), errAllow, errPorts))
}

// policyFile is the policy file's path in the state dir.
func policyFile(stateDir string) string { return filepath.Join(stateDir, "policy.json") }

// SourceAPI is the repository source of the rules imported through the
// API: the only rules the policy file keeps.
const SourceAPI = "api"

// Datapath is the datapath's maps as the policy reads and writes them
// (the audit counters, the policy maps of revocation). Nil without the
// datapath.
type Datapath interface {
	// Maps are the open BPF maps; nil before the datapath's start step.
	Maps() *maps.Maps
}

// Endpoints are the local endpoints: their manager (nil before the
// endpoints' start step builds it) and their events.
type Endpoints interface {
	Manager() *endpointmanager.Manager
	Subscribe(fn func(endpointmanager.Event))
}

// NamedPorts are the pods' named container ports, from Kubernetes; nil in
// standalone mode.
type NamedPorts interface {
	// NamedPorts are the named ports of a local endpoint's pod.
	NamedPorts(ep *endpoint.Endpoint) map[string]policy.NamedPort
	// AddRemoteNamedPorts adds other nodes' endpoints' named ports per
	// identity.
	AddRemoteNamedPorts(out map[identity.NumericIdentity]map[string]policy.NamedPort)
}

// PolicyMap is the BPF policy map as the realization writes it.
type PolicyMap interface {
	DumpEndpoint(id uint16) (map[maps.PolicyKey]maps.PolicyValue, error)
	Upsert(maps.PolicyKey, maps.PolicyValue) error
	Delete(maps.PolicyKey) error
	DeleteEndpoint(id uint16) error
}

// Module resolves the repository's rules for each endpoint and realizes
// the difference in the BPF policy map.
type Module struct {
	log        *slog.Logger
	repo       *policy.Repository
	runtime    *option.Runtime
	idTable    *identitytable.Table // the universe's identities: one snapshot, a generation per change of the set or labels
	dp         Datapath             // nil without the datapath
	policyCIDR *policycidr.Table    // nil without the datapath
	mapEvents  *mapevents.Ring      // the policy map's writes; nil: not recorded
	ipcache    *ipcache.IPCache     // nil without the datapath
	eps        Endpoints            // its manager exists from its start step on
	namedPorts NamedPorts           // nil in standalone mode

	// revokeMode is Config.RevokeEstablished.
	revokeMode string

	mu       sync.Mutex
	realized map[uint16]policy.MapState
	// revoke marks what each endpoint's realized policy took away since
	// its established flows were last checked (RevokeEstablished), and
	// enforced its enforcement flags at that check.
	revoke   map[uint16]revokeKind
	enforced map[uint16][2]bool
	results  map[uint16]policy.Result
	cidrIDs  map[netip.Prefix]identity.NumericIdentity
	nextCIDR identity.NumericIdentity
	cidrGen  uint64
	cache    *policy.SelectorCache

	// universeEpoch moves whenever something outside the identity
	// allocator and the CIDR identities may have changed the universe (the
	// named ports of local and remote pods): every trigger and every
	// endpoint change.
	universeEpoch atomic.Uint64
	// sharedMu guards shared: the universe and the resolutions of the
	// current policy revision, shared by every endpoint that resolves alike.
	sharedMu sync.Mutex
	shared   *sharedResolution

	regen chan struct{}

	// fqdnNames are the DNS names the DNS proxy learned per address
	// (guarded by mu): each address gets a host-prefix CIDR identity, the
	// names are that identity's for toFQDNs selectors. namesGen counts
	// SetFQDNNames calls; namesApplied is the last one a complete
	// regeneration pass has applied; passDone is closed at the end of
	// each pass (then replaced).
	fqdnNames    map[netip.Addr][]string
	namesGen     uint64
	namesApplied uint64
	passDone     chan struct{}

	// hostCfg is the host firewall's configuration; nodeLabels the
	// node's labels (nil standalone). hostRealized is what the host
	// endpoint's policy entries hold (hostKnown: read from the pinned
	// map), hostResult its last resolution (guarded by mu).
	hostCfg      hostFirewallConfig
	nodeLabels   NodeLabels
	hostRealized policy.MapState
	// hostRevoke is what the host policy took away since the node's
	// established flows were last checked (revokeHostFlows).
	hostRevoke revokeKind
	hostKnown  bool
	hostResult policy.Result

	// dnsfb is what the DNS fallback map holds per endpoint (read back
	// from the pinned map at the endpoint's first realization),
	// dnsfbAllLogged the patterns last logged as beyond it per endpoint
	// (logged once), both guarded by dnsfbMu (its own: the map's writes
	// and walks do not hold up the proxies' rule lookups under mu);
	// dnsfbMap a map a test gives (nil: the datapath's).
	dnsfbMu        sync.Mutex
	dnsfb          map[uint16]dnsfbSet
	dnsfbAllLogged map[uint16]string
	dnsfbMap       DNSFallbackMap
	// dnsfbPinned is the one walk of the pinned map, by endpoint, that
	// endpoints not yet realized in this run take their entries from
	// (nil until the first one needs it): see dnsfbCurrent.
	dnsfbPinned map[uint16][]maps.DNSFallbackKey

	// file keeps the rules imported through the API across restarts;
	// its writer is a job started after the restore.
	file *policyfile.File
}

// Params are the policy's dependencies.
type Params struct {
	cell.In

	Config     Config
	Agent      option.Agent
	Log        *slog.Logger
	Root       cell.RootLogger
	Runtime    *option.Runtime
	Identities identity.Allocator
	IDTable    *identitytable.Table
	Datapath   Datapath
	// PolicyCIDR (the prefixes rules name) and IPCache (where their CIDR
	// identities are claimed) are the datapath cell's tables; nil
	// without the datapath.
	PolicyCIDR *policycidr.Table
	IPCache    *ipcache.IPCache
	Endpoints  Endpoints
	NamedPorts NamedPorts
	// NodeLabels are the node's labels for host policies (nil
	// standalone).
	NodeLabels NodeLabels `optional:"true"`
	Metrics    *metrics.Server
	// MapEvents records the policy map's writes (nil: none).
	MapEvents *mapevents.Registry `optional:"true"`
}

// New builds the policy module and subscribes it to what changes the
// policy of endpoints: rules, identities, the enforcement mode, endpoints.
func New(p Params) *Module {
	m := &Module{
		log: p.Log, repo: policy.NewRepository(), runtime: p.Runtime, idTable: p.IDTable,
		dp: p.Datapath, policyCIDR: p.PolicyCIDR, ipcache: p.IPCache, eps: p.Endpoints, namedPorts: p.NamedPorts,
		mapEvents: p.MapEvents.Ring(maps.PolicyMapName),
		realized:  map[uint16]policy.MapState{}, results: map[uint16]policy.Result{},
		revokeMode: p.Config.RevokeEstablished, revoke: map[uint16]revokeKind{}, enforced: map[uint16][2]bool{},
		cidrIDs: map[netip.Prefix]identity.NumericIdentity{}, nextCIDR: 1, cache: policy.NewSelectorCache(),
		regen: make(chan struct{}, 1), passDone: make(chan struct{}),
		dnsfb: map[uint16]dnsfbSet{}, dnsfbAllLogged: map[uint16]string{},
	}
	alwaysAllow, _ := parseAlwaysAllow(p.Config.HostFirewallAlwaysAllow) // validated by the cell
	m.hostCfg = hostFirewallConfig{enabled: p.Config.EnableHostFirewall, audit: p.Config.HostFirewallAudit, alwaysAllow: alwaysAllow}
	m.nodeLabels = p.NodeLabels
	if m.dp != nil {
		p.Metrics.Registry.MustRegister(newAuditCollector(m))
		if m.hostCfg.enabled {
			p.Metrics.Registry.MustRegister(newHostFirewallCollector(m))
		}
	}
	m.repo.SetAllowLocalhost(p.Config.AllowLocalhost == AllowLocalhostAlways)
	if m.revokeMode == "" {
		m.revokeMode = option.RevokeDeny
	}
	m.file = policyfile.New(policyFile(p.Agent.StateDir), m.repo, SourceAPI, logging.For(p.Root, "policy-file"))
	m.repo.Subscribe(func(uint64) { m.TriggerRegeneration() })
	if m.dp != nil {
		// A new or vanished identity may change what other endpoints'
		// selectors select.
		p.Identities.Subscribe(func(_, _ []identity.Identity) {
			if rules, _ := m.repo.Rules(nil); len(rules) > 0 {
				m.TriggerRegeneration()
			}
		})
	}
	m.runtime.Subscribe(func(option.RuntimeValues) { m.TriggerRegeneration() })
	// An endpoint's identity is part of the universe (its pod's named
	// ports).
	m.eps.Subscribe(func(endpointmanager.Event) { m.invalidateUniverse() })
	return m
}

type restoreParams struct {
	cell.In

	Log       *slog.Logger
	Lifecycle cell.Lifecycle
	Steps     *lifecycle.Steps
	Jobs      job.Registry
	Health    *health.Registry
}

// registerRestore appends the "policy-restore" step and the policy file's
// writer: it runs from after the restore until the step stops, with the
// last change written.
func registerRestore(p restoreParams, m *Module) lifecycle.Invoked {
	p.Steps.Append(p.Lifecycle, "policy-restore", m.restore, nil)
	p.Jobs.NewGroup(p.Health.Scope("policy-restore"), job.WithLogger(p.Log)).Add(job.OneShot("policy-file", func(ctx context.Context, _ cell.Health) error {
		m.file.Run(ctx)
		return nil
	}))
	return lifecycle.Invoked{}
}
