package agent

import (
	"context"
	"fmt"
	"net/netip"
	"path/filepath"
	"sync"
	"time"

	"github.com/cilium/cilium/api/v1/models"

	"github.com/tendril-net/tendril/api/v1/ext"
	"github.com/tendril-net/tendril/pkg/identity/kvalloc"
	"github.com/tendril-net/tendril/pkg/ipcache/kvpublisher"
	"github.com/tendril-net/tendril/pkg/kvstore"
)

// kvstoreModule is start step 7: the etcd client (with an embedded etcd
// under the state directory when --kvstore=embedded) and, in kvstore
// identity allocation mode, the allocator's watch of the cluster's
// identities.
type kvstoreModule struct {
	a        *Agent
	embedded *kvstore.Embedded
	client   *kvstore.Client
	ipStore  *kvstore.SharedStore
	cancel   context.CancelFunc
	done     chan struct{}

	// ipPub writes this node's endpoint addresses to ipStore on its own
	// goroutine (joined by stop through ipPubCancel and ipPubDone).
	ipPub       *kvpublisher.Publisher
	ipPubCancel context.CancelFunc
	ipPubDone   chan struct{}
	// addrOwners is which endpoint last published each address.
	addrMu     sync.Mutex
	addrOwners map[netip.Addr]uint16
}

// KVStore modes.
const (
	KVStoreNone     = ""
	KVStoreEtcd     = "etcd"
	KVStoreEmbedded = "embedded"
)

func (m *kvstoreModule) start(ctx context.Context) error {
	a := m.a
	cfg := a.cfg.KVStoreConfig
	if a.cfg.KVStore == KVStoreEmbedded {
		dir := filepath.Join(a.cfg.StateDir, "etcd")
		e, err := kvstore.StartEmbedded(ctx, kvstore.EmbeddedConfig{Dir: dir,
			ClientURL: "unix://" + filepath.Join(a.cfg.StateDir, "etcd.sock")}, a.log.With("module", "embedded-etcd"))
		if err != nil {
			return fmt.Errorf("embedded etcd: %w", err)
		}
		m.embedded = e
		cfg.Endpoints = e.Endpoints()
	}
	c, err := kvstore.Connect(ctx, cfg, a.log.With("module", "kvstore"))
	if err != nil {
		return fmt.Errorf("kvstore %v: %w", cfg.Endpoints, err)
	}
	m.client = c
	if alloc, ok := a.identities.(*kvalloc.Allocator); ok {
		alloc.SetClient(c)
		runCtx, cancel := context.WithCancel(context.Background())
		m.cancel, m.done = cancel, make(chan struct{})
		go func() {
			defer close(m.done)
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
	if m.cancel != nil {
		m.cancel()
	}
	if m.ipPubCancel != nil {
		m.ipPubCancel()
		<-m.ipPubDone
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
	if m.done != nil {
		<-m.done
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
	s.Lines = append(s.Lines, ext.Line{Key: "Identity allocation", Value: m.a.cfg.IdentityAllocationMode})
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
