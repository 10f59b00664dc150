// Package nodemanager learns the cluster's other nodes (Node and
// TendrilNode objects: addresses and pod CIDRs) and makes this node able to
// reach their pods by native routing: a route to each peer's pod CIDRs via
// the peer's node address, and each peer's addresses in the ipcache as
// remote-node. It reconciles desired against installed state, so a failed
// write is retried and routes of peers that vanished while the agent was
// down are removed at start.
package nodemanager

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sort"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/tendril-net/tendril/pkg/datapath/linux"
)

// RouteProtocol marks routes to peer nodes' pod CIDRs. It differs from the
// endpoint routes' protocol so neither side mistakes the other's routes.
const RouteProtocol netlink.RouteProtocol = 0x55

// Peer is another node as this node needs it.
type Peer struct {
	Name string
	// IPs are the node's addresses (InternalIP first).
	IPs []netip.Addr
	// PodCIDRs are the node's pod CIDRs (at most one per family).
	PodCIDRs []netip.Prefix
}

// nextHop is the peer address of the CIDR's family.
func (p Peer) nextHop(cidr netip.Prefix) (netip.Addr, bool) {
	for _, ip := range p.IPs {
		if ip.Is4() == cidr.Addr().Is4() {
			return ip, true
		}
	}
	return netip.Addr{}, false
}

// IPCache is where peer node addresses are published (the BPF ipcache).
// Each address is claimed on behalf of its node, so that when an address
// moves from a node being removed to a new one, the old node's withdrawal
// leaves the new node's claim in place.
type IPCache interface {
	UpsertRemoteNode(node string, ip netip.Addr) error
	DeleteRemoteNode(node string, ip netip.Addr) error
}

// nodeAddr is one node's claim on one address.
type nodeAddr struct {
	node string
	ip   netip.Addr
}

// Config tunes the manager.
type Config struct {
	// LocalNode is this node's name: it is never a peer.
	LocalNode string
	// InstallRoutes turns the routes on (off when the agent does not own
	// its network namespace's routing, e.g. in control-plane tests).
	InstallRoutes bool
	// ResyncInterval re-applies everything, retrying failed writes.
	ResyncInterval time.Duration
}

// Manager holds the peers and reconciles routes and ipcache entries.
type Manager struct {
	cfg   Config
	nl    *netlink.Handle
	cache IPCache
	log   *slog.Logger

	mu        sync.Mutex
	peers     map[string]Peer
	published map[nodeAddr]bool
	lastErr   error
	kick      chan struct{}
}

// New makes a manager; nl is the handle of the namespace to route in.
func New(cfg Config, nl *netlink.Handle, cache IPCache, log *slog.Logger) *Manager {
	if cfg.ResyncInterval <= 0 {
		cfg.ResyncInterval = 30 * time.Second
	}
	return &Manager{cfg: cfg, nl: nl, cache: cache, log: log,
		peers: map[string]Peer{}, published: map[nodeAddr]bool{}, kick: make(chan struct{}, 1)}
}

// UpsertPeer adds or changes a peer; the local node is ignored.
func (m *Manager) UpsertPeer(p Peer) {
	if p.Name == m.cfg.LocalNode {
		return
	}
	m.mu.Lock()
	m.peers[p.Name] = p
	m.mu.Unlock()
	m.trigger()
}

// DeletePeer removes a peer.
func (m *Manager) DeletePeer(name string) {
	m.mu.Lock()
	delete(m.peers, name)
	m.mu.Unlock()
	m.trigger()
}

func (m *Manager) trigger() {
	select {
	case m.kick <- struct{}{}:
	default:
	}
}

// Peers returns the known peers, by name.
func (m *Manager) Peers() []Peer {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]Peer, 0, len(m.peers))
	for _, p := range m.peers {
		out = append(out, p)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// LastError is the last reconciliation's error (nil when it succeeded).
func (m *Manager) LastError() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.lastErr
}

// Run reconciles on every change and every resync interval until ctx ends.
func (m *Manager) Run(ctx context.Context) {
	t := time.NewTicker(m.cfg.ResyncInterval)
	defer t.Stop()
	for {
		err := m.Reconcile()
		m.mu.Lock()
		m.lastErr = err
		m.mu.Unlock()
		if err != nil {
			m.log.Warn("Node reconciliation failed; will retry", "error", err)
		}
		retry := time.Duration(0)
		if err != nil {
			retry = time.Second
		}
		var retryC <-chan time.Time
		if retry > 0 {
			retryC = time.After(retry)
		}
		select {
		case <-ctx.Done():
			return
		case <-m.kick:
		case <-t.C:
		case <-retryC:
		}
	}
}

// Reconcile makes routes and ipcache entries match the peers once.
func (m *Manager) Reconcile() error {
	m.mu.Lock()
	peers := make([]Peer, 0, len(m.peers))
	for _, p := range m.peers {
		peers = append(peers, p)
	}
	m.mu.Unlock()

	var errs []error
	wantIPs := map[nodeAddr]bool{}
	wantRoutes := map[netip.Prefix]netip.Addr{}
	for _, p := range peers {
		for _, ip := range p.IPs {
			wantIPs[nodeAddr{p.Name, ip}] = true
		}
		for _, c := range p.PodCIDRs {
			if hop, ok := p.nextHop(c); ok {
				wantRoutes[c] = hop
			} else {
				errs = append(errs, fmt.Errorf("node %s: no address of the family of pod CIDR %s", p.Name, c))
			}
		}
	}

	if m.cache != nil {
		for na := range wantIPs {
			if err := m.cache.UpsertRemoteNode(na.node, na.ip); err != nil {
				errs = append(errs, fmt.Errorf("ipcache remote node %s %s: %w", na.node, na.ip, err))
				continue
			}
			m.mu.Lock()
			m.published[na] = true
			m.mu.Unlock()
		}
		m.mu.Lock()
		var stale []nodeAddr
		for na := range m.published {
			if !wantIPs[na] {
				stale = append(stale, na)
			}
		}
		m.mu.Unlock()
		for _, na := range stale {
			if err := m.cache.DeleteRemoteNode(na.node, na.ip); err != nil {
				errs = append(errs, fmt.Errorf("ipcache remove remote node %s %s: %w", na.node, na.ip, err))
				continue
			}
			m.mu.Lock()
			delete(m.published, na)
			m.mu.Unlock()
		}
	}

	if m.cfg.InstallRoutes && m.nl != nil {
		if err := m.reconcileRoutes(wantRoutes); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (m *Manager) reconcileRoutes(want map[netip.Prefix]netip.Addr) error {
	var errs []error
	for cidr, hop := range want {
		r := &netlink.Route{
			Dst:      prefixNet(cidr),
			Gw:       net.IP(hop.AsSlice()),
			Protocol: RouteProtocol,
			Table:    unix.RT_TABLE_MAIN,
		}
		if err := m.nl.RouteReplace(r); err != nil {
			errs = append(errs, fmt.Errorf("route %s via %s: %w", cidr, hop, err))
		}
	}
	installed, err := m.installedRoutes()
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	for _, r := range installed {
		if r.Dst == nil {
			continue
		}
		cidr, ok := netipPrefix(r.Dst)
		if !ok {
			continue
		}
		if hop, wanted := want[cidr]; wanted && r.Gw != nil && r.Gw.Equal(net.IP(hop.AsSlice())) {
			continue
		}
		if err := m.nl.RouteDel(&r); err != nil && !errors.Is(err, unix.ESRCH) {
			errs = append(errs, fmt.Errorf("remove stale route %s: %w", cidr, err))
		}
	}
	return errors.Join(errs...)
}

func (m *Manager) installedRoutes() ([]netlink.Route, error) {
	routes, err := linux.RoutesByProtocol(m.nl, RouteProtocol)
	if err != nil {
		return nil, fmt.Errorf("list node routes: %w", err)
	}
	return routes, nil
}

func prefixNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: net.IP(p.Addr().AsSlice()), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

func netipPrefix(n *net.IPNet) (netip.Prefix, bool) {
	a, ok := netip.AddrFromSlice(n.IP)
	if !ok {
		return netip.Prefix{}, false
	}
	ones, _ := n.Mask.Size()
	return netip.PrefixFrom(a.Unmap(), ones).Masked(), true
}
