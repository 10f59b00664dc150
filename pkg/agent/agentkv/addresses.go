package agentkv

import (
	"context"
	"encoding/json"
	"errors"
	"net/netip"
	"slices"
	"strconv"
	"time"

	"github.com/tendril-net/tendril/pkg/endpointmanager"
	"github.com/tendril-net/tendril/pkg/ipcache"
	"github.com/tendril-net/tendril/pkg/kvstore"
	"github.com/tendril-net/tendril/pkg/logging"
	"github.com/tendril-net/tendril/pkg/nodemanager"
)

// IPPrefix holds the kvstore ipcache: one key per endpoint address,
// tendril/state/ip/v1/<cluster>/<ip>, written by the endpoint's node on
// its session lease (so a dead node's addresses go with its lease).
const IPPrefix = kvstore.StatePrefix + "ip/v1/default/"

// IPEntry is the JSON value of an ipcache key.
type IPEntry struct {
	IP        string `json:"IP"`
	Identity  uint32 `json:"ID"`
	HostIP    string `json:"HostIP,omitempty"`
	Node      string `json:"Node"`
	Namespace string `json:"Namespace,omitempty"`
	Name      string `json:"Name,omitempty"`
}

// startIPSync publishes this node's endpoint addresses and feeds other
// nodes' into the ipcache (kvstore source, below Kubernetes and local
// endpoints). Publishing never waits for etcd: endpoint events only record
// the desired keys in the publisher, whose goroutine writes them (with
// retries, and again after a new session); stop joins it.
func (m *Module) startIPSync() error {
	log := logging.For(m.root, "kvstore-ipcache")
	store, err := kvstore.JoinSharedStore(m.client, kvstore.SharedStoreConfig{Prefix: IPPrefix, SyncInterval: time.Minute,
		OnEvent: m.onIPEvent}, log)
	if err != nil {
		return err
	}
	m.ipStore = store
	m.addrOwners = map[netip.Addr]uint16{}
	// The publisher's reconciler (a job started right after this step)
	// writes them; the republisher job follows the renewals.
	m.renewals, m.unsubscribe = m.client.SessionRenewals()
	m.eps.Subscribe(func(ev endpointmanager.Event) {
		if ev.Endpoint != nil {
			m.publishAddresses(ev.Endpoint.ID, ev.Endpoint.Addresses())
		}
	})
	for _, ep := range m.eps.List() {
		m.publishAddresses(ep.ID, ep.Addresses())
	}
	m.ipPub.MarkRestored()
	return nil
}

// ipStoreRef is the publisher's store: the shared store the kvstore step
// joins (the reconciler runs only after it).
type ipStoreRef struct{ m *Module }

var errNoIPStore = errors.New("kvstore ipcache store not joined yet")

func (r ipStoreRef) UpsertLocal(ctx context.Context, name string, value []byte) error {
	if r.m.ipStore == nil {
		return errNoIPStore
	}
	return r.m.ipStore.UpsertLocal(ctx, name, value)
}

func (r ipStoreRef) DeleteLocal(ctx context.Context, name string) error {
	if r.m.ipStore == nil {
		return errNoIPStore
	}
	return r.m.ipStore.DeleteLocal(ctx, name)
}

func (r ipStoreRef) List() map[string][]byte {
	if r.m.ipStore == nil {
		return nil
	}
	return r.m.ipStore.List()
}

// ownAddress says whether a key in the kvstore is one of this node's
// addresses (the prune deletes only those).
func (m *Module) ownAddress(_ string, value []byte) bool {
	var e IPEntry
	return json.Unmarshal(value, &e) == nil && e.Node == m.cfg.NodeName
}

// publishAddresses records the kvstore keys of endpoint id's addresses as
// the endpoint is now (the event that called it may be older than a later
// change): published while it exists with an identity, withdrawn when it
// is gone. An address is withdrawn only by the endpoint that published it
// last, so a deleted endpoint's late event cannot remove the key of the
// endpoint that reuses its address. It never waits for etcd.
func (m *Module) publishAddresses(id uint16, addrs []netip.Addr) {
	m.addrMu.Lock()
	defer m.addrMu.Unlock()
	ep, err := m.eps.Lookup(strconv.Itoa(int(id)))
	if err != nil || ep.Identity == 0 {
		ep = nil
	}
	for _, ip := range addrs {
		if ep == nil || !slices.Contains(ep.Addresses(), ip) {
			// Gone, without identity, or the ID is another endpoint's now.
			if owner, ok := m.addrOwners[ip]; ok && owner == id {
				delete(m.addrOwners, ip)
				if err := m.ipPub.Delete(ip.String()); err != nil {
					m.log.Error("Record a kvstore address to withdraw", "ip", ip, "error", err)
				}
			}
			continue
		}
		v, _ := json.Marshal(IPEntry{IP: ip.String(), Identity: ep.Identity, HostIP: m.hostIP(), Node: m.cfg.NodeName,
			Namespace: ep.PodNamespace, Name: ep.PodName})
		m.addrOwners[ip] = id
		if err := m.ipPub.Set(ip.String(), v); err != nil {
			m.log.Error("Record a kvstore address to publish", "ip", ip, "error", err)
		}
	}
}

// hostIP is the address peers route this node's pods through.
func (m *Module) hostIP() string {
	if m.nodeIP != nil {
		return m.nodeIP()
	}
	return ""
}

func (m *Module) onIPEvent(ev kvstore.Event) {
	if ev.Type == kvstore.EventListDone {
		// The store's view holds the first listing: the publisher may
		// prune this node's keys no endpoint backs.
		m.ipPub.MarkListed()
		if m.ipcacheListed != nil {
			// The ipcache may prune once the gate has judged the listing
			// against the nodes' listing.
			m.gate.Synced(m.ipcacheListed)
		}
		return
	}
	if m.ipcache == nil {
		return
	}
	ip, err := netip.ParseAddr(ev.Key)
	if err != nil {
		m.log.Warn("Skipping a malformed kvstore ipcache key", "key", ev.Key)
		return
	}
	owner := ipcache.OwnerKVStore(ev.Key)
	if ev.Type == kvstore.EventDelete {
		m.gate.Delete(ip, ipcache.SourceKVStore, owner)
		return
	}
	var e IPEntry
	if err := json.Unmarshal(ev.Value, &e); err != nil || e.Identity == 0 {
		// An identity beyond 32 bits fails here too: never truncated. A
		// claim the key made before goes.
		m.log.Warn("Skipping a kvstore ipcache value that does not parse", "key", ev.Key, "error", err)
		m.gate.Delete(ip, ipcache.SourceKVStore, owner)
		return
	}
	if e.Node == m.cfg.NodeName {
		// This node's own endpoints are in the ipcache as local; a claim
		// the key made while another node held the address goes.
		m.gate.Delete(ip, ipcache.SourceKVStore, owner)
		return
	}
	// The gate: a cluster-scope identity, an address inside the pod
	// CIDRs of the node the value names, a host IP of that node.
	entry := ipcache.Entry{Source: ipcache.SourceKVStore, Owner: owner, Name: e.Name, Namespace: e.Namespace}
	entry.HostIP, _ = netip.ParseAddr(e.HostIP)
	m.gate.Upsert(nodemanager.Claim{IP: ip, Identity: int64(e.Identity), Node: e.Node, Entry: entry})
}
