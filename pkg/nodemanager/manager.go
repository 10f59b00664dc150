// Package nodemanager learns the cluster's other nodes (Node and
// TendrilNode objects: addresses and pod CIDRs) and makes this node able to
// reach their pods by native routing: a route to each peer's pod CIDRs via
// the peer's node address, and each peer's addresses in the ipcache as
// remote-node.
//
// Desired state is in two statedb tables: "nodes" (one object per peer,
// written by the sources in one short transaction per change) and
// "routes" (one per pod CIDR, derived from the peers in the same
// transaction). Two statedb reconcilers realize them: the nodes
// reconciler makes each peer's remote-node ipcache claims, the routes
// reconciler writes the kernel's routes. Each object carries its status, a
// failed write is retried with backoff, and once every source has synced
// (the tables' initializers) the routes reconciler prunes routes of peers
// that vanished while the agent was down.
package nodemanager

import (
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sync"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"

	"github.com/tendril-net/tendril/pkg/reconcile"
)

// IPCache is where peer node addresses are published (the BPF ipcache).
// Each address is claimed on behalf of its node, so that when an address
// moves from a node being removed to a new one, the old node's withdrawal
// leaves the new node's claim in place.
type IPCache interface {
	UpsertRemoteNode(node string, ip netip.Addr) error
	// UpsertRemoteHealth maps a peer's health endpoint address to the
	// health identity on that node (hostIP: its address of the family,
	// the tunnel's remote), as that node's claim.
	UpsertRemoteHealth(node string, ip, hostIP netip.Addr) error
	// DeleteRemoteNode withdraws node's claim on ip (either kind).
	DeleteRemoteNode(node string, ip netip.Addr) error
}

// Params builds a Manager.
type Params struct {
	// LocalNode is this node's name: it is never a peer.
	LocalNode string
	DB        *statedb.DB
	// Jobs runs the reconcilers; they start with the group.
	Jobs     job.Group
	Log      *slog.Logger
	ModuleID cell.FullModuleID
	// Routes is the kernel's routing table; nil when the agent does not
	// own its network namespace's routing (no routes table is written).
	Routes RouteBackend
	// IPCache takes the peers' remote-node claims; nil without a datapath.
	IPCache IPCache
	// Rules check each peer's pod CIDRs before they are accepted.
	Rules Rules
	// OnRejected, if set, is told of each pod CIDR a peer is newly
	// refused for (after the transaction; the counter of rejections).
	OnRejected func(node string, r Rejection)
	// OnAddressRefused, if set, is told of each address a peer is newly
	// refused as its own (RefusedIPs; the counter of refusals).
	OnAddressRefused func(node string, r AddressRejection)
	// Options beyond the defaults (backoff, prune interval), for tests;
	// applied to both reconcilers.
	Options []reconciler.Option
	// Tables are the nodes and routes tables the manager writes
	// (NewTables); zero: New creates them.
	Tables Tables
}

// Manager is the sources' API over the nodes and routes tables.
type Manager struct {
	local  string
	db     *statedb.DB
	nodes  statedb.RWTable[*Peer]
	routes statedb.RWTable[*Route]
	// installRoutes: the routes table is written and reconciled.
	installRoutes bool
	routeRec      reconciler.Reconciler[*Route]
	rules         Rules
	log           *slog.Logger
	onRejected    func(string, Rejection)
	// onAddressRefused: Params.OnAddressRefused.
	onAddressRefused func(string, AddressRejection)
}

// New registers the tables' reconcilers on p.Jobs (and the tables, unless
// p.Tables holds them already).
func New(p Params) (*Manager, error) {
	if p.Tables.Nodes == nil || p.Tables.Routes == nil {
		t, err := NewTables(p.DB)
		if err != nil {
			return nil, err
		}
		p.Tables = t
	}
	nodes, routes := p.Tables.Nodes, p.Tables.Routes
	if err := p.Rules.Validate(); err != nil {
		return nil, err
	}
	m := &Manager{local: p.LocalNode, db: p.DB, nodes: nodes, routes: routes, installRoutes: p.Routes != nil,
		rules: p.Rules, log: p.Log, onRejected: p.OnRejected, onAddressRefused: p.OnAddressRefused}
	rp := reconciler.Params{Log: p.Log, DB: p.DB, JobGroup: p.Jobs, ModuleID: p.ModuleID}
	// The claims live in the ipcache's own table, rebuilt at every start:
	// nothing of a previous run to prune.
	_, err := reconciler.Register(rp, nodes, (*Peer).clone, (*Peer).setStatus, (*Peer).getStatus,
		&peerOps{cache: p.IPCache, published: map[string][]netip.Addr{}}, nil,
		append([]reconciler.Option{reconciler.WithName(NodesTableName), reconciler.WithoutPruning(),
			reconciler.WithRetry(reconcile.RetryMin, reconcile.RetryMax)}, p.Options...)...)
	if err != nil {
		return nil, fmt.Errorf("nodes reconciler: %w", err)
	}
	if p.Routes != nil {
		m.routeRec, err = reconciler.Register(rp, routes, (*Route).clone, (*Route).setStatus, (*Route).getStatus,
			routeOps(p.Routes, p.Log), nil,
			append([]reconciler.Option{reconciler.WithName(RoutesTableName), reconciler.WithPruning(reconcile.PruneInterval),
				reconciler.WithRefreshing(reconcile.Refresh, nil), reconciler.WithRetry(reconcile.RetryMin, reconcile.RetryMax)}, p.Options...)...)
		if err != nil {
			return nil, fmt.Errorf("routes reconciler: %w", err)
		}
	}
	return m, nil
}

// AddInitializer holds the route prune back until the returned function is
// called: each source of peers registers one while the hive is built and
// calls it once its initial listing is in the table, so that the prune
// never removes the route of a peer not yet seen. Idempotent.
//
// The nodes table gets the same initializer: the claim gates
// (ClaimGate) judge other nodes' endpoints only once every node is known.
func (m *Manager) AddInitializer(name string) func() {
	wtxn := m.db.WriteTxn(m.routes, m.nodes)
	doneRoutes := m.routes.RegisterInitializer(wtxn, name)
	doneNodes := m.nodes.RegisterInitializer(wtxn, name)
	wtxn.Commit()
	var once sync.Once
	return func() {
		once.Do(func() {
			wtxn := m.db.WriteTxn(m.routes, m.nodes)
			doneRoutes(wtxn)
			doneNodes(wtxn)
			wtxn.Commit()
		})
	}
}

// Prune asks for a prune of the routes now (it still waits for the
// initializers).
func (m *Manager) Prune() {
	if m.routeRec != nil {
		m.routeRec.Prune()
	}
}

// UpsertPeer adds or changes a peer in one short transaction; the local
// node is ignored. p.PodCIDRs are the pod CIDRs the node asks for: each
// is checked (Rules, and against the other peers' claims) and only those
// accepted become routes; the refused ones are logged, counted and kept
// in the peer's Rejected. A change can also change what overlapping
// peers are accepted for: they are evaluated again in the same
// transaction. The peer is marked pending only when what it wants
// changed, so a resync of an unchanged Node writes nothing.
func (m *Manager) UpsertPeer(p Peer) error {
	if p.Name == m.local || p.Name == "" {
		return nil
	}
	next := &Peer{Name: p.Name, Created: p.Created, IPs: slices.Clone(p.IPs), HealthIPs: slices.Clone(p.HealthIPs), Requested: slices.Clone(p.PodCIDRs),
		Rejected: slices.Clone(p.Rejected), WireGuardKey: p.WireGuardKey, KeyError: p.KeyError, Status: reconciler.StatusPending()}
	wtxn := m.db.WriteTxn(m.nodes, m.routes)
	defer wtxn.Abort()
	old, _, found := m.nodes.Get(wtxn, PeerNameIndex.Query(p.Name))
	peers := []*Peer{next}
	for q := range m.nodes.All(wtxn) {
		if q.Name != p.Name {
			peers = append(peers, q)
		}
	}
	k := newChecker(m.rules, peers)
	k.evaluate(next)
	if found && old.sameOutcome(next) {
		return nil
	}
	if !found {
		old = nil
	}
	rejected, err := m.apply(wtxn, k, old, next)
	if err != nil {
		return err
	}
	wtxn.Commit()
	m.reportRejected(rejected)
	if next.KeyError != "" && m.log != nil && (old == nil || old.KeyError != next.KeyError) {
		m.log.Warn("Refused the WireGuard public key of a node: no encrypted traffic to it until it publishes a valid one",
			"node", next.Name, "error", next.KeyError)
	}
	return nil
}

// DeletePeer removes a peer; its routes go unless another peer has the
// same pod CIDR, and the peers it kept from overlapping CIDRs are
// evaluated again.
func (m *Manager) DeletePeer(name string) error {
	wtxn := m.db.WriteTxn(m.nodes, m.routes)
	defer wtxn.Abort()
	old, _, found := m.nodes.Get(wtxn, PeerNameIndex.Query(name))
	if !found {
		return nil
	}
	if _, _, err := m.nodes.Delete(wtxn, old); err != nil {
		return fmt.Errorf("node %s: %w", name, err)
	}
	k := newChecker(m.rules, statedb.Collect(m.nodes.All(wtxn)))
	rejected, err := m.apply(wtxn, k, old, nil)
	if err != nil {
		return err
	}
	wtxn.Commit()
	m.reportRejected(rejected)
	return nil
}

// apply writes next (nil: the peer went), evaluates again every other
// peer whose claims old or next touch, judges again the addresses of
// every peer whose verdict may have changed (NodeIPs: a shared address,
// an address inside a pod CIDR that came or went), and recomputes the
// routes of every pod CIDR whose owner or next hop may have changed. It
// returns the rejections that are new.
func (m *Manager) apply(wtxn statedb.WriteTxn, k *checker, old, next *Peer) ([]peerRejection, error) {
	var affected []netip.Prefix
	var rejected []peerRejection
	// current are the peers as they will be; fresh are those of them not
	// in the table yet (written at the end).
	current := make([]*Peer, 0, len(k.peers))
	fresh := map[string]bool{}
	var touchedIPs []netip.Addr
	var touchedCIDRs []netip.Prefix
	if old != nil {
		affected = append(affected, old.PodCIDRs...)
		touchedIPs, touchedCIDRs = append(touchedIPs, old.IPs...), append(touchedCIDRs, old.PodCIDRs...)
	}
	if next != nil {
		fresh[next.Name] = true
		affected = append(affected, next.PodCIDRs...)
		touchedIPs, touchedCIDRs = append(touchedIPs, next.IPs...), append(touchedCIDRs, next.PodCIDRs...)
		rejected = append(rejected, newRejections(old, next)...)
	}
	for _, q := range k.peers {
		if q == next || !(related(old, q) || related(next, q)) {
			current = append(current, q)
			continue
		}
		q2 := q.clone()
		k.evaluate(q2)
		if slices.Equal(q2.PodCIDRs, q.PodCIDRs) && slices.Equal(q2.Rejected, q.Rejected) {
			current = append(current, q)
			continue
		}
		if !slices.Equal(q2.PodCIDRs, q.PodCIDRs) {
			q2.Status = reconciler.StatusPending()
			touchedCIDRs = append(append(touchedCIDRs, q.PodCIDRs...), q2.PodCIDRs...)
		}
		current = append(current, q2)
		fresh[q2.Name] = true
		affected = append(append(affected, q.PodCIDRs...), q2.PodCIDRs...)
		rejected = append(rejected, newRejections(q, q2)...)
	}
	// The addresses, against the peers' pod CIDRs as they now are (this
	// node's own as k read them).
	ak := &checker{rules: k.rules, localCIDRs: k.localCIDRs, localAddrs: k.localAddrs, peers: current}
	for i, q := range current {
		if !fresh[q.Name] && !addressTouched(q, touchedIPs, touchedCIDRs) {
			continue
		}
		nodeIPs, refused := ak.nodeAddresses(q)
		if slices.Equal(nodeIPs, q.NodeIPs) && slices.Equal(refused, q.RefusedIPs) {
			continue
		}
		// The refusals already reported: a re-evaluated peer's clone
		// carries them; next is new, its predecessor is old.
		prev := q.RefusedIPs
		if q == next && old != nil {
			prev = old.RefusedIPs
		}
		if !fresh[q.Name] {
			q = q.clone()
			current[i], fresh[q.Name] = q, true
		}
		if !slices.Equal(nodeIPs, q.NodeIPs) {
			q.Status = reconciler.StatusPending()
			affected = append(affected, q.PodCIDRs...)
		}
		q.NodeIPs, q.RefusedIPs = nodeIPs, refused
		for _, r := range refused {
			if !slices.Contains(prev, r) {
				rejected = append(rejected, peerRejection{node: q.Name, addr: &r})
			}
		}
	}
	for _, q := range current {
		if !fresh[q.Name] {
			continue
		}
		if _, _, err := m.nodes.Insert(wtxn, q); err != nil {
			return nil, fmt.Errorf("node %s: %w", q.Name, err)
		}
	}
	return rejected, m.updateRoutes(wtxn, affected)
}

// peerRejection is a pod CIDR refused, or (addr set) an address.
type peerRejection struct {
	node string
	r    Rejection
	addr *AddressRejection
}

// newRejections are next's rejections old did not have.
func newRejections(old, next *Peer) []peerRejection {
	var out []peerRejection
	for _, r := range next.Rejected {
		if old == nil || !slices.Contains(old.Rejected, r) {
			out = append(out, peerRejection{node: next.Name, r: r})
		}
	}
	return out
}

// reportRejected logs each new rejection and tells OnRejected (or
// OnAddressRefused).
func (m *Manager) reportRejected(rs []peerRejection) {
	for _, r := range rs {
		if r.addr != nil {
			if m.log != nil {
				m.log.Warn("Refused a node's address as its own: not claimed for it in the ipcache, routes or encryption",
					"node", r.node, "address", r.addr.Addr, "reason", r.addr.Reason, "detail", r.addr.Detail)
			}
			if m.onAddressRefused != nil {
				m.onAddressRefused(r.node, *r.addr)
			}
			continue
		}
		if m.log != nil {
			m.log.Warn("Refused a node's pod CIDR: no route, no endpoints of the node in it",
				"node", r.node, "podCIDR", r.r.CIDR, "reason", r.r.Reason, "detail", r.r.Detail)
		}
		if m.onRejected != nil {
			m.onRejected(r.node, r.r)
		}
	}
}

// Rejected returns every peer's refused pod CIDRs, by node name.
func (m *Manager) Rejected() map[string][]Rejection {
	out := map[string][]Rejection{}
	for p := range m.nodes.All(m.db.ReadTxn()) {
		if len(p.Rejected) > 0 {
			out[p.Name] = p.Rejected
		}
	}
	return out
}

// updateRoutes recomputes the route of each of cidrs from the peers now in
// the table. Two peers naming one pod CIDR is a misconfiguration: the
// route goes to the first by name whatever order their events came in,
// and to the other when that one goes.
func (m *Manager) updateRoutes(wtxn statedb.WriteTxn, cidrs []netip.Prefix) error {
	if !m.installRoutes || len(cidrs) == 0 {
		return nil
	}
	for _, cidr := range cidrs {
		var want *Route
		for p := range m.nodes.All(wtxn) {
			if !slices.Contains(p.PodCIDRs, cidr) {
				continue
			}
			hop, ok := p.nextHop(cidr)
			if !ok {
				continue
			}
			if want == nil || p.Name < want.Node {
				want = &Route{Prefix: cidr, NextHop: hop, Node: p.Name}
			}
		}
		cur, _, found := m.routes.Get(wtxn, RoutePrefixIndex.Query(cidr))
		var err error
		switch {
		case want == nil && found:
			_, _, err = m.routes.Delete(wtxn, cur)
		case want == nil:
		case found && cur.NextHop == want.NextHop && cur.Node == want.Node:
		default:
			want.Status = reconciler.StatusPending()
			_, _, err = m.routes.Insert(wtxn, want)
		}
		if err != nil {
			return fmt.Errorf("route %s: %w", cidr, err)
		}
	}
	return nil
}

// Peers returns the known peers, by name.
func (m *Manager) Peers() []*Peer {
	return statedb.Collect(m.nodes.All(m.db.ReadTxn()))
}

// PeerRoutes returns the desired routes, by prefix.
func (m *Manager) PeerRoutes() []*Route {
	return statedb.Collect(m.routes.All(m.db.ReadTxn()))
}
