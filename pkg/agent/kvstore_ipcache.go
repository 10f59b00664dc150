package agent

import (
	"context"
	"encoding/json"
	"net/netip"
	"time"

	"github.com/tendril-net/tendril/pkg/endpoint"
	"github.com/tendril-net/tendril/pkg/endpointmanager"
	"github.com/tendril-net/tendril/pkg/identity"
	"github.com/tendril-net/tendril/pkg/ipcache"
	"github.com/tendril-net/tendril/pkg/kvstore"
)

// ipPrefix holds the kvstore ipcache: one key per endpoint address,
// tendril/state/ip/v1/<cluster>/<ip>, written by the endpoint's node on
// its session lease (so a dead node's addresses go with its lease).
const ipPrefix = kvstore.StatePrefix + "ip/v1/default/"

// ipEntry is the JSON value of an ipcache key.
type ipEntry struct {
	IP        string `json:"IP"`
	Identity  uint32 `json:"ID"`
	HostIP    string `json:"HostIP,omitempty"`
	Node      string `json:"Node"`
	Namespace string `json:"Namespace,omitempty"`
	Name      string `json:"Name,omitempty"`
}

// startIPSync publishes this node's endpoint addresses and feeds other
// nodes' into the ipcache (kvstore source, below local endpoints).
func (m *kvstoreModule) startIPSync() error {
	a := m.a
	store, err := kvstore.JoinSharedStore(m.client, kvstore.SharedStoreConfig{Prefix: ipPrefix, SyncInterval: time.Minute,
		OnEvent: m.onIPEvent}, a.log.With("module", "kvstore-ipcache"))
	if err != nil {
		return err
	}
	m.ipStore = store
	publish := func(ep *endpoint.Endpoint, deleted bool) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, ip := range ep.Addresses() {
			if deleted || ep.Identity == 0 {
				_ = store.DeleteLocal(ctx, ip.String())
				continue
			}
			v, _ := json.Marshal(ipEntry{IP: ip.String(), Identity: ep.Identity, HostIP: m.hostIP(), Node: a.cfg.NodeName,
				Namespace: ep.PodNamespace, Name: ep.PodName})
			if err := store.UpsertLocal(ctx, ip.String(), v); err != nil {
				a.log.Warn("Publish endpoint address to the kvstore", "ip", ip, "error", err)
			}
		}
	}
	a.endpoints.mgr.Subscribe(func(ev endpointmanager.Event) {
		if ev.Endpoint != nil {
			publish(ev.Endpoint, ev.Kind == endpointmanager.EventDelete)
		}
	})
	for _, ep := range a.endpoints.mgr.List() {
		publish(ep, false)
	}
	return nil
}

// hostIP is the address peers route this node's pods through.
func (m *kvstoreModule) hostIP() string {
	if m.a.k8s != nil {
		return m.a.k8s.nodeIP()
	}
	return ""
}

func (m *kvstoreModule) onIPEvent(ev kvstore.Event) {
	a := m.a
	if a.datapath == nil || ev.Type == kvstore.EventListDone {
		return
	}
	ip, err := netip.ParseAddr(ev.Key)
	if err != nil {
		a.log.Warn("Skipping a malformed kvstore ipcache key", "key", ev.Key)
		return
	}
	if ev.Type == kvstore.EventDelete {
		if err := a.datapath.DeleteRemoteEndpoint(ip, ipcache.SourceKVStore, ipcache.OwnerKVStore(ev.Key)); err != nil {
			a.log.Warn("ipcache: remove kvstore address", "ip", ip, "error", err)
		}
		return
	}
	var e ipEntry
	if err := json.Unmarshal(ev.Value, &e); err != nil || e.Identity == 0 {
		a.log.Warn("Skipping a kvstore ipcache value that does not parse", "key", ev.Key, "error", err)
		return
	}
	if e.Node == a.cfg.NodeName {
		// This node's own endpoints are in the ipcache as local; a claim
		// the key made while another node held the address goes.
		if err := a.datapath.DeleteRemoteEndpoint(ip, ipcache.SourceKVStore, ipcache.OwnerKVStore(ev.Key)); err != nil {
			a.log.Warn("ipcache: remove kvstore address", "ip", ip, "error", err)
		}
		return
	}
	entry := ipcache.Entry{Identity: identity.NumericIdentity(e.Identity), Source: ipcache.SourceKVStore, Owner: ipcache.OwnerKVStore(ev.Key),
		Name: e.Name, Namespace: e.Namespace}
	entry.HostIP, _ = netip.ParseAddr(e.HostIP)
	if err := a.datapath.UpsertRemoteEndpoint(ip, entry); err != nil {
		a.log.Warn("ipcache: kvstore address", "ip", ip, "error", err)
	}
}
