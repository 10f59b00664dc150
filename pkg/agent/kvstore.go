package agent

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"path/filepath"
	"sync"
	"time"

	"github.com/cilium/cilium/api/v1/models"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"

	"github.com/tendril-net/tendril/api/v1/ext"
	"github.com/tendril-net/tendril/pkg/dbinspect"
	"github.com/tendril-net/tendril/pkg/health"
	"github.com/tendril-net/tendril/pkg/identity"
	"github.com/tendril-net/tendril/pkg/identity/kvalloc"
	"github.com/tendril-net/tendril/pkg/ipcache/kvpublisher"
	"github.com/tendril-net/tendril/pkg/kvstore"
	"github.com/tendril-net/tendril/pkg/lifecycle"
)

// kvstoreCell is start step 7: the etcd client (with an embedded etcd
// under the state directory when --kvstore=embedded) and, in kvstore
// identity allocation mode, the allocator's watch of the cluster's
// identities; this node's endpoint addresses published, other nodes' read
// into the ipcache.
var kvstoreCell = cell.Module("kvstore", "The etcd client identities and endpoint addresses in etcd",
	cell.Provide(newKVStoreModule),
	cell.Invoke(func(*kvstoreModule) {}),
)

// kvstoreModule is the agent's kvstore side; nil without a kvstore.
type kvstoreModule struct {
	cfg        Config
	log        *slog.Logger
	root       cell.RootLogger
	identities identity.Allocator
	eps        *endpointsModule
	k8s        *kubernetesModule // nil in standalone mode
	ipcache    remoteIPCache     // nil without the datapath
	// ipcacheListed marks the kvstore's initial listing done in the
	// ipcache table (nil without the datapath).
	ipcacheListed func()

	embedded *kvstore.Embedded
	client   *kvstore.Client
	ipStore  *kvstore.SharedStore
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

type kvstoreParams struct {
	cell.In

	Config     Config
	Log        *slog.Logger
	Root       cell.RootLogger
	Lifecycle  cell.Lifecycle
	Steps      *lifecycle.Steps
	Jobs       job.Registry
	Health     *health.Registry
	Identities identity.Allocator
	Endpoints  *endpointsModule
	K8s        *kubernetesModule
	Datapath   *datapathModule
	DB         *statedb.DB
	Inspector  *dbinspect.Inspector
	ModuleID   cell.FullModuleID
}

func newKVStoreModule(p kvstoreParams) (*kvstoreModule, error) {
	if p.Config.KVStore == KVStoreNone && len(p.Config.KVStoreConfig.Endpoints) == 0 {
		return nil, nil
	}
	m := &kvstoreModule{cfg: p.Config, log: p.Log, root: p.Root, identities: p.Identities, eps: p.Endpoints, k8s: p.K8s}
	if p.Datapath != nil {
		m.ipcache = p.Datapath
		// The ipcache prunes the BPF map only once the other nodes'
		// addresses in the kvstore are listed (onIPEvent).
		m.ipcacheListed = p.Datapath.ipcache.AddInitializer("kvstore")
	}
	p.Steps.Append(p.Lifecycle, "kvstore", m.start, m.stop)
	// The publisher's reconciler and the republisher are jobs after the
	// step, which joins the shared store they write to.
	jobs := newJobGroup(p.Jobs, p.Health, "kvstore", p.Log)
	pub, err := kvpublisher.New(kvpublisher.Params{DB: p.DB, Jobs: jobs, Log: logFor(p.Root, "kvstore-publisher"),
		ModuleID: p.ModuleID, Store: ipStoreRef{m}, Owned: m.ownAddress})
	if err != nil {
		return nil, err
	}
	m.ipPub = pub
	p.Inspector.AddReconciled(kvpublisher.TableName, func(txn statedb.ReadTxn) dbinspect.Realization {
		return dbinspect.CountStatus(pub.Table().All(txn), func(k *kvpublisher.Key) reconciler.Status { return k.Reconciliation })
	})
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

// KVStore modes.
const (
	KVStoreNone     = ""
	KVStoreEtcd     = "etcd"
	KVStoreEmbedded = "embedded"
)

func (m *kvstoreModule) start(ctx context.Context) error {
	cfg := m.cfg.KVStoreConfig
	if m.cfg.KVStore == KVStoreEmbedded {
		dir := filepath.Join(m.cfg.StateDir, "etcd")
		e, err := kvstore.StartEmbedded(ctx, kvstore.EmbeddedConfig{Dir: dir,
			ClientURL: "unix://" + filepath.Join(m.cfg.StateDir, "etcd.sock")}, logFor(m.root, "embedded-etcd"))
		if err != nil {
			return fmt.Errorf("embedded etcd: %w", err)
		}
		m.embedded = e
		cfg.Endpoints = e.Endpoints()
	}
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

func (m *kvstoreModule) stop(ctx context.Context) error {
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
	if m.embedded != nil {
		stopCtx, cancel := context.WithTimeout(ctx, 15*time.Second)
		defer cancel()
		if serr := m.embedded.Stop(stopCtx); err == nil {
			err = serr
		}
	}
	return err
}

func (m *kvstoreModule) statusSection() ext.Section {
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
	if m.embedded != nil {
		s.Lines = append(s.Lines, ext.Line{Key: "Mode", Value: "embedded etcd under the state directory"})
	}
	s.Lines = append(s.Lines, ext.Line{Key: "Identity allocation", Value: m.cfg.IdentityAllocationMode})
	if m.ipPub != nil {
		s.Lines = append(s.Lines, ext.Line{Key: "Endpoint addresses", Value: publisherStatus(m.ipPub.Status(), time.Now())})
	}
	return s
}

// model is the kvstore line of the v1 status.
func (m *kvstoreModule) model() *models.Status {
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
