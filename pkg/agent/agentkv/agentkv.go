// Package agentkv is the agent's kvstore cell: the etcd client, the kvstore identity
// allocator's watch, this node's endpoint addresses published in etcd
// (the kvstore-addresses table and its reconciler, pkg/ipcache/kvpublisher)
// and other nodes' addresses read into the ipcache as the kvstore source.
// Its start step is "kvstore" (the seeds' step 7).
package agentkv

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"time"

	"github.com/cilium/cilium/api/v1/models"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"

	"github.com/tendril-net/tendril/api/v1/ext"
	"github.com/tendril-net/tendril/pkg/agent/agentidentity"
	"github.com/tendril-net/tendril/pkg/agent/nodes"
	"github.com/tendril-net/tendril/pkg/dbinspect"
	"github.com/tendril-net/tendril/pkg/endpoint"
	"github.com/tendril-net/tendril/pkg/endpointmanager"
	"github.com/tendril-net/tendril/pkg/health"
	"github.com/tendril-net/tendril/pkg/identity"
	"github.com/tendril-net/tendril/pkg/identity/kvalloc"
	"github.com/tendril-net/tendril/pkg/ipcache"
	"github.com/tendril-net/tendril/pkg/ipcache/kvpublisher"
	"github.com/tendril-net/tendril/pkg/kvstore"
	"github.com/tendril-net/tendril/pkg/lifecycle"
	"github.com/tendril-net/tendril/pkg/logging"
	"github.com/tendril-net/tendril/pkg/metrics"
	"github.com/tendril-net/tendril/pkg/nodemanager"
	"github.com/tendril-net/tendril/pkg/option"
)

// Cell is the agent's kvstore: start step 7, after the endpoints are
// restored and the Kubernetes watchers synced.
var Cell = cell.Module("kvstore", "The etcd client identities and endpoint addresses in etcd",
	cell.Provide(validate),
	cell.Provide(lifecycle.Build[*Module]),
	cell.Config(DefaultOptions()),
	cell.Provide(New, statusContribution, endpointsOf, nodeIPOf, addressesOf),
	cell.ProvidePrivate(configOf),
)

// Options are the kvstore's flags.
type Options struct {
	// Mode is "" (none) or etcd. "embedded" (an etcd server inside the
	// agent) is refused: the server is not linked into the agent
	// (pkg/kvstore/kvembed, for tests and labs).
	Mode string `mapstructure:"kvstore"`
	// Client is the client's configuration (endpoints, TLS, timeouts).
	Client kvstore.Config `mapstructure:",squash"`
}

// DefaultOptions are the kvstore's defaults: none.
func DefaultOptions() Options { return Options{Client: kvstore.DefaultConfig()} }

// Flags registers the kvstore's flags, with o's values as defaults.
func (o Options) Flags(fs *pflag.FlagSet) {
	fs.String("kvstore", o.Mode, "kvstore: empty (none) or etcd (see --kvstore-endpoints)")
	// The client's flags bind to this copy of o, which only gives them
	// their defaults: the hive decodes the values into Options.
	o.Client.Flags(fs)
}

// validate checks the options and the one check across two cells'
// options: identities in etcd need a kvstore.
func validate(o Options, id agentidentity.Config) (lifecycle.Invoked, error) {
	var errs []error
	if id.AllocationMode == agentidentity.AllocationKVStore && !o.Enabled() {
		errs = append(errs, fmt.Errorf("identity-allocation-mode kvstore: needs --kvstore etcd with --kvstore-endpoints"))
	}
	return lifecycle.Invoked{}, option.Invalid(errors.Join(append(errs, o.Validate())...))
}

// Validate checks the values; each error names its option.
func (o Options) Validate() error {
	switch o.Mode {
	case ModeNone:
	case ModeEmbedded:
		return fmt.Errorf("kvstore embedded: the agent no longer runs an etcd server in its process; run etcd beside it and use --kvstore etcd --kvstore-endpoints")
	case ModeEtcd:
		if len(o.Client.Endpoints) == 0 {
			return fmt.Errorf("kvstore etcd: --kvstore-endpoints is empty")
		}
	default:
		return fmt.Errorf("kvstore %q: must be empty or etcd", o.Mode)
	}
	return nil
}

// Enabled says whether the agent has a kvstore.
func (o Options) Enabled() bool { return o.Mode != ModeNone || len(o.Client.Endpoints) > 0 }

// Config is the cell's configuration: its options and what it takes from
// the other cells' (configOf).
type Config struct {
	Options
	// NodeName names this node in the published addresses.
	NodeName string
	// IdentityAllocationMode is shown in the status.
	IdentityAllocationMode string
}

func configOf(o Options, a option.Agent, n option.LocalNode, id agentidentity.Config) Config {
	return Config{Options: o, NodeName: n.Name, IdentityAllocationMode: id.AllocationMode}
}

// Endpoints is the local endpoints as the cell reads them: the endpoint
// manager, which exists from the endpoints' start step on (before this
// cell's).
type Endpoints interface {
	Subscribe(fn func(endpointmanager.Event))
	List() []*endpoint.Endpoint
	Lookup(id string) (*endpoint.Endpoint, error)
}

// NodeIP returns the address peers route this node's pods through ("" if
// unknown).
type NodeIP func() string

// IPCache is where other nodes' addresses go (the datapath's ipcache);
// nil without the datapath.
type IPCache interface {
	UpsertRemoteEndpoint(ip netip.Addr, e ipcache.Entry) error
	DeleteRemoteEndpoint(ip netip.Addr, src ipcache.Source, owner ipcache.Owner) error
	// AddInitializer holds the ipcache's prune back until the returned
	// function is called.
	AddInitializer(name string) func()
}

// Module is the agent's kvstore side; nil without a kvstore.
type Module struct {
	cfg        Config
	log        *slog.Logger
	root       cell.RootLogger
	identities identity.Allocator
	eps        Endpoints
	nodeIP     NodeIP  // nil: no node address to publish
	ipcache    IPCache // nil without the datapath
	// ipcacheListed marks the kvstore's initial listing done in the
	// ipcache table (nil without the datapath).
	ipcacheListed func()
	// gate judges other nodes' addresses before they reach the ipcache
	// (nil without the datapath).
	gate *nodemanager.ClaimGate

	client  *kvstore.Client
	ipStore *kvstore.SharedStore
	// allocCancel ends the identity allocator's watch, which runs during
	// the start step already (the step waits for its sync); allocDone
	// joins it.
	allocCancel context.CancelFunc
	allocDone   chan struct{}

	// ipPub holds this node's endpoint addresses to publish (a table);
	// its reconciler writes them to ipStore. renewals are the client's
	// new sessions, after which every key is written again.
	ipPub       *kvpublisher.Publisher
	renewals    <-chan struct{}
	unsubscribe func()
	// addrOwners is which endpoint last published each address.
	addrMu     sync.Mutex
	addrOwners map[netip.Addr]uint16
}

// Params are the cell's dependencies.
type Params struct {
	cell.In

	Config     Config
	Log        *slog.Logger
	Root       cell.RootLogger
	Lifecycle  cell.Lifecycle
	Steps      *lifecycle.Steps
	Jobs       job.Registry
	Health     *health.Registry
	Identities identity.Allocator
	Endpoints  Endpoints
	NodeIP     NodeIP          `optional:"true"`
	IPCache    IPCache         `optional:"true"`
	Metrics    *metrics.Server `optional:"true"`
	DB         *statedb.DB
	Inspector  *dbinspect.Inspector
	ModuleID   cell.FullModuleID
	// Peers are the other nodes (the nodes cell's table) the claim gate
	// judges addresses against; NodeSources says whether anything fills
	// it.
	Peers       statedb.Table[*nodemanager.Peer]
	NodeSources nodes.Sources
}

// New builds the module and registers its step and jobs; nil without a
// kvstore.
func New(p Params) (*Module, error) {
	if !p.Config.Enabled() {
		return nil, nil
	}
	m := &Module{cfg: p.Config, log: p.Log, root: p.Root, identities: p.Identities, eps: p.Endpoints, nodeIP: p.NodeIP}
	if p.IPCache != nil {
		m.ipcache = p.IPCache
		// The ipcache prunes the BPF map only once the other nodes'
		// addresses in the kvstore are listed (onIPEvent).
		m.ipcacheListed = p.IPCache.AddInitializer("kvstore")
		var reg prometheus.Registerer
		if p.Metrics != nil {
			reg = p.Metrics.Registry
		}
		// Without Kubernetes nothing fills the nodes table: the gate
		// judges each address on its identity alone (docs/kvstore.md).
		m.gate = nodemanager.NewClaimGate(nodemanager.ClaimGateParams{DB: p.DB, Nodes: p.Peers, NoNodes: p.NodeSources.None(), Cache: p.IPCache,
			Log: logging.For(p.Root, "kvstore-claims"), OnRejected: nodemanager.ClaimsRejectedCounter(reg, "kvstore")})
	}
	p.Steps.Append(p.Lifecycle, "kvstore", m.start, m.stop)
	// The publisher's reconciler and the republisher are jobs after the
	// step, which joins the shared store they write to.
	jobs := p.Jobs.NewGroup(p.Health.Scope("kvstore"), job.WithLogger(p.Log))
	pub, err := kvpublisher.New(kvpublisher.Params{DB: p.DB, Jobs: jobs, Log: logging.For(p.Root, "kvstore-publisher"),
		ModuleID: p.ModuleID, Store: ipStoreRef{m}, Owned: m.ownAddress})
	if err != nil {
		return nil, err
	}
	m.ipPub = pub
	p.Inspector.AddReconciled(kvpublisher.TableName, func(txn statedb.ReadTxn) dbinspect.Realization {
		return dbinspect.CountStatus(pub.Table().All(txn), func(k *kvpublisher.Key) reconciler.Status { return k.Reconciliation })
	})
	if m.gate != nil {
		jobs.Add(job.OneShot("kvstore-claims", func(ctx context.Context, _ cell.Health) error { return m.gate.Run(ctx) }))
	}
	jobs.Add(job.OneShot("address-republisher", func(ctx context.Context, _ cell.Health) error {
		defer m.unsubscribe()
		for {
			select {
			case <-ctx.Done():
				return nil
			case <-m.renewals:
				pub.Republish()
			}
		}
	}))
	return m, nil
}

// Publisher is the address publisher (its table and status).
func (m *Module) Publisher() *kvpublisher.Publisher { return m.ipPub }

// Modes.
const (
	ModeNone = ""
	ModeEtcd = "etcd"
	// ModeEmbedded is refused (Validate says why); named so that the
	// refusal is explicit rather than "unknown mode".
	ModeEmbedded = "embedded"
)

func (m *Module) start(ctx context.Context) error {
	cfg := m.cfg.Client
	c, err := kvstore.Connect(ctx, cfg, m.log)
	if err != nil {
		return fmt.Errorf("kvstore %v: %w", cfg.Endpoints, err)
	}
	m.client = c
	if alloc, ok := m.identities.(*kvalloc.Allocator); ok {
		alloc.SetClient(c)
		runCtx, cancel := context.WithCancel(context.Background())
		m.allocCancel, m.allocDone = cancel, make(chan struct{})
		go func() {
			defer close(m.allocDone)
			alloc.Run(runCtx)
		}()
		wctx, wcancel := context.WithTimeout(ctx, cfg.ConnectTimeout)
		defer wcancel()
		if err := alloc.WaitSynced(wctx); err != nil {
			return err
		}
	}
	return m.startIPSync()
}

func (m *Module) stop(ctx context.Context) error {
	if m.allocCancel != nil {
		m.allocCancel()
	}
	var err error
	if m.ipStore != nil {
		err = m.ipStore.Close(ctx)
	}
	if m.client != nil {
		if cerr := m.client.Close(ctx); err == nil {
			err = cerr
		}
	}
	if m.allocDone != nil {
		<-m.allocDone
	}
	return err
}

func (m *Module) StatusSection() ext.Section {
	s := ext.Section{Title: "KVStore"}
	if m.client == nil {
		s.Lines = append(s.Lines, ext.Line{Key: "State", Value: "not connected"})
		return s
	}
	st := m.client.Status()
	s.Lines = append(s.Lines,
		ext.Line{Key: "State", Value: fmt.Sprintf("%s since %s", st.State, st.Since.Format(time.RFC3339))},
		ext.Line{Key: "Endpoint", Value: st.Endpoint},
		ext.Line{Key: "Message", Value: st.Message})
	s.Lines = append(s.Lines, ext.Line{Key: "Identity allocation", Value: m.cfg.IdentityAllocationMode})
	if m.ipPub != nil {
		s.Lines = append(s.Lines, ext.Line{Key: "Endpoint addresses", Value: publisherStatus(m.ipPub.Status(), time.Now())})
	}
	return s
}

// Model is the kvstore line of the v1 status.
func (m *Module) Model() *models.Status {
	if m.client == nil {
		return &models.Status{State: models.StatusStateWarning, Msg: "not connected yet"}
	}
	st := m.client.Status()
	state := models.StatusStateOk
	if st.State != kvstore.StateConnected {
		state = models.StatusStateFailure
	}
	return &models.Status{State: state, Msg: fmt.Sprintf("etcd %s: %s", st.Endpoint, st.Message)}
}

// publisherStatus is the status line of the address publisher: how many
// keys, how many not yet written, and the last write error.
func publisherStatus(st kvpublisher.Status, now time.Time) string {
	v := fmt.Sprintf("%d addresses, %d writes pending", st.Keys, st.Pending)
	if st.LastError != nil {
		v += fmt.Sprintf("; last error %s ago: %v", now.Sub(st.LastErrorAt).Round(time.Second), st.LastError)
	}
	return v
}

// addressesOf is the endpoint addresses this node publishes in etcd, the
// cell's typed output (its reconciler writes and prunes the keys). Nil
// without a kvstore.
func addressesOf(m *Module) statedb.Table[*kvpublisher.Key] {
	if m == nil || m.ipPub == nil {
		return nil
	}
	return m.ipPub.Table()
}
