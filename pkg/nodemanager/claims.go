package nodemanager

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"time"

	"github.com/cilium/statedb"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tendril-net/tendril/pkg/identity"
	"github.com/tendril-net/tendril/pkg/ipcache"
)

// RemoteCache is where accepted claims of other nodes' endpoints go (the
// datapath's ipcache).
type RemoteCache interface {
	UpsertRemoteEndpoint(ip netip.Addr, e ipcache.Entry) error
	DeleteRemoteEndpoint(ip netip.Addr, src ipcache.Source, owner ipcache.Owner) error
}

// Claim is another node's statement that an address is one of its
// endpoints with an identity, as a TendrilEndpoint or a kvstore key makes
// it. Every field comes from an object that node wrote.
type Claim struct {
	IP netip.Addr
	// Identity as the object holds it (int64 in the CRD): checked for the
	// cluster range before it is narrowed.
	Identity int64
	// Node names the publishing node (kvstore keys), or NodeIP gives its
	// address (TendrilEndpoints: a node address or its router IP).
	Node   string
	NodeIP netip.Addr
	// Entry is the ipcache entry to make (source, owner, names, host IP);
	// its Identity is set from Identity once accepted.
	Entry ipcache.Entry
}

// Reasons a claim is refused; also the label of the rejection counter.
const (
	ClaimReasonIdentity    = "identity-not-cluster-scope"
	ClaimReasonUnknownNode = "unknown-node"
	ClaimReasonHostIP      = "host-ip-not-the-node"
	ClaimReasonNodeAddress = "node-address"
	ClaimReasonOutside     = "outside-node-pod-cidrs"
)

type claimKey struct {
	src   ipcache.Source
	owner ipcache.Owner
	ip    netip.Addr
}

type heldClaim struct {
	Claim
	// accepted: the claim is in the ipcache. reason: why not ("" while
	// the nodes are not known yet).
	accepted bool
	reason   string
}

// ClaimGate stands between the sources of other nodes' endpoints and the
// ipcache: a claim reaches the ipcache only if its identity is a
// cluster-scope one (not reserved, not node-local, in range without
// truncation) and its address lies inside the accepted pod CIDRs of the
// node that published it and is no node's own address. Refused claims
// are logged, counted and kept: when the nodes table changes (a node
// joins after its endpoints were seen, or loses a pod CIDR) every claim
// is judged again, and one that became valid (or invalid) is added to
// (or withdrawn from) the ipcache.
type ClaimGate struct {
	db    *statedb.DB
	nodes statedb.Table[*Peer]
	// noNodes: nothing fills the nodes table (see ClaimGateParams).
	noNodes    bool
	cache      RemoteCache
	log        *slog.Logger
	onRejected func(reason string)
	// settle batches bursts of node changes (start-up) into one pass.
	settle time.Duration

	mu     sync.Mutex
	claims map[claimKey]*heldClaim
	// view is the nodes as last read; ready once the nodes table's
	// sources have synced (at once when there is no source of nodes).
	view  *nodeView
	ready bool
	// synced are the sources' done functions waiting for ready.
	synced []func()
}

// ClaimGateParams builds a ClaimGate.
type ClaimGateParams struct {
	DB *statedb.DB
	// Nodes is the nodes table the claims are judged against (the
	// Manager's, written by the sources of nodes).
	Nodes statedb.Table[*Peer]
	// NoNodes says that nothing fills the nodes table (a kvstore without
	// Kubernetes): no claim can be tied to a node, so only its identity
	// is judged. Without it, an empty table refuses every claim as of an
	// unknown node.
	NoNodes bool
	Cache   RemoteCache
	Log     *slog.Logger
	// OnRejected, if set, is told the reason of each refusal (a counter).
	OnRejected func(reason string)
}

// NewClaimGate returns a gate; Run follows the nodes table.
func NewClaimGate(p ClaimGateParams) *ClaimGate {
	return &ClaimGate{db: p.DB, nodes: p.Nodes, noNodes: p.NoNodes, cache: p.Cache, log: p.Log, onRejected: p.OnRejected, settle: 50 * time.Millisecond,
		claims: map[claimKey]*heldClaim{}}
}

// nodeView indexes the peers for judging claims.
type nodeView struct {
	byName map[string]*Peer
	byIP   map[netip.Addr]*Peer
	peers  []*Peer
	// none: nothing fills the nodes table (no Kubernetes): no claim
	// can be tied to a node, only its identity judged.
	none bool
}

func newNodeView(peers []*Peer) *nodeView {
	v := &nodeView{byName: map[string]*Peer{}, byIP: map[netip.Addr]*Peer{}, peers: peers}
	for _, p := range peers {
		v.byName[p.Name] = p
		// Only the addresses judged a node's (NodeIPs): one a node
		// claims inside another node's pod CIDR must neither refuse that
		// pod's claim as "a node's address" nor pass as the claimant's
		// host IP.
		for _, ip := range p.NodeIPs {
			v.byIP[ip] = p
		}
	}
	return v
}

// nodeOfIP is the peer with the address, or whose accepted pod CIDR holds
// it (its router IP, which a node without an InternalIP publishes).
func (v *nodeView) nodeOfIP(ip netip.Addr) *Peer {
	if p := v.byIP[ip]; p != nil {
		return p
	}
	for _, p := range v.peers {
		for _, c := range p.PodCIDRs {
			if c.Contains(ip) {
				return p
			}
		}
	}
	return nil
}

// CheckIdentity narrows an identity from another node's object: only the
// cluster-wide label identities are another node's to claim; reserved
// (host, world, remote-node, ...), node-local (CIDR) and anything out of
// range are refused, never truncated.
func CheckIdentity(id int64) (identity.NumericIdentity, error) {
	if id < int64(identity.MinCluster) || id > int64(identity.MaxCluster) {
		return 0, fmt.Errorf("identity %d outside the cluster range %d-%d", id, identity.MinCluster, identity.MaxCluster)
	}
	return identity.NumericIdentity(id), nil
}

// judge says why v refuses c ("" accepts it).
func (v *nodeView) judge(c Claim) (reason, detail string) {
	if _, err := CheckIdentity(c.Identity); err != nil {
		return ClaimReasonIdentity, err.Error()
	}
	if v.none {
		// kvstore without Kubernetes: no node registry to tie the
		// address to, so the identity is all that can be checked; the
		// etcd credentials are the boundary there (docs/kvstore.md).
		// Refusing would switch off cross-node identities in that mode.
		return "", ""
	}
	var p *Peer
	switch {
	case c.Node != "":
		p = v.byName[c.Node]
	case c.NodeIP.IsValid():
		p = v.nodeOfIP(c.NodeIP)
	}
	if p == nil {
		return ClaimReasonUnknownNode, fmt.Sprintf("no known node %s%s", c.Node, ipString(c.NodeIP))
	}
	if h := c.Entry.HostIP; h.IsValid() && v.byIP[h] != p && v.nodeOfIP(h) != p {
		return ClaimReasonHostIP, fmt.Sprintf("host IP %s is not an address of node %s", h, p.Name)
	}
	if owner := v.byIP[c.IP]; owner != nil {
		// A node's own address (and a host-network pod's, which is the
		// same) carries remote-node, claimed by the node itself.
		return ClaimReasonNodeAddress, "the address of node " + owner.Name
	}
	for _, cidr := range p.PodCIDRs {
		if cidr.Contains(c.IP) {
			return "", ""
		}
	}
	return ClaimReasonOutside, fmt.Sprintf("not in the accepted pod CIDRs %s of node %s", joinStrings(p.PodCIDRs), p.Name)
}

func ipString(ip netip.Addr) string {
	if ip.IsValid() {
		return ip.String()
	}
	return ""
}

// Upsert takes a claim (a new or changed object): it reaches the ipcache
// if it passes, and is held otherwise. Short: the ipcache write is
// queued.
func (g *ClaimGate) Upsert(c Claim) {
	g.mu.Lock()
	defer g.mu.Unlock()
	k := claimKey{src: c.Entry.Source, owner: c.Entry.Owner, ip: c.IP}
	h := g.claims[k]
	if h == nil {
		h = &heldClaim{}
		g.claims[k] = h
	}
	prevReason := h.reason
	h.Claim = c
	g.judgeLocked(h, prevReason, true)
}

// Delete drops a claim, withdrawing it from the ipcache if it was there.
func (g *ClaimGate) Delete(ip netip.Addr, src ipcache.Source, owner ipcache.Owner) {
	g.mu.Lock()
	defer g.mu.Unlock()
	k := claimKey{src: src, owner: owner, ip: ip}
	h := g.claims[k]
	delete(g.claims, k)
	if h == nil || !h.accepted {
		return
	}
	if err := g.cache.DeleteRemoteEndpoint(ip, src, owner); err != nil {
		g.log.Warn("ipcache: withdraw a remote claim", "ip", ip, "owner", owner, "error", err)
	}
}

// judgeLocked decides h against the current view and makes the ipcache
// follow; changed: the claim itself changed (an accepted one is written
// again). A refusal is logged and counted when its reason is new.
func (g *ClaimGate) judgeLocked(h *heldClaim, prevReason string, changed bool) {
	var reason, detail string
	switch {
	case g.ready:
		reason, detail = g.view.judge(h.Claim)
	default:
		// The nodes are not all known yet: only the identity is judged;
		// the rest waits for the nodes' initial listing.
		if _, err := CheckIdentity(h.Identity); err != nil {
			reason, detail = ClaimReasonIdentity, err.Error()
		} else {
			h.reason = ""
			g.withdrawLocked(h)
			return
		}
	}
	if reason != "" {
		h.reason = reason
		g.withdrawLocked(h)
		if reason != prevReason || changed {
			g.log.Warn("Refused another node's endpoint claim: not in the ipcache",
				"source", h.Entry.Source, "owner", h.Entry.Owner, "ip", h.IP, "identity", h.Identity,
				"node", h.Node, "nodeIP", ipString(h.NodeIP), "reason", reason, "detail", detail)
			if g.onRejected != nil {
				g.onRejected(reason)
			}
		}
		return
	}
	h.reason = ""
	if h.accepted && !changed {
		return
	}
	e := h.Entry
	e.Identity = identity.NumericIdentity(h.Identity)
	if err := g.cache.UpsertRemoteEndpoint(h.IP, e); err != nil {
		g.log.Warn("ipcache: remote claim", "ip", h.IP, "owner", e.Owner, "error", err)
		return
	}
	h.accepted = true
}

func (g *ClaimGate) withdrawLocked(h *heldClaim) {
	if !h.accepted {
		return
	}
	h.accepted = false
	if err := g.cache.DeleteRemoteEndpoint(h.IP, h.Entry.Source, h.Entry.Owner); err != nil {
		g.log.Warn("ipcache: withdraw a remote claim", "ip", h.IP, "owner", h.Entry.Owner, "error", err)
	}
}

// Synced calls done once the source's initial listing has been judged
// against the nodes' initial listing: the ipcache's prune may then run
// (its initializer), and no accepted claim of the listing is missing.
func (g *ClaimGate) Synced(done func()) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.ready {
		done()
		return
	}
	g.synced = append(g.synced, done)
}

// Run follows the nodes table until ctx ends: each change (bursts
// batched) judges every held claim again. Without a source of nodes
// (NoNodes) every claim is judged on its identity alone, at once.
func (g *ClaimGate) Run(ctx context.Context) error {
	if g.noNodes {
		g.setView(&nodeView{none: true}, true)
		<-ctx.Done()
		return nil
	}
	for {
		txn := g.db.ReadTxn()
		objs, watch := g.nodes.AllWatch(txn)
		var peers []*Peer
		for p := range objs {
			peers = append(peers, p)
		}
		init, initWatch := g.nodes.Initialized(txn)
		g.setView(newNodeView(peers), init)
		if !init {
			watch = mergeWatch(ctx, watch, initWatch)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-watch:
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(g.settle):
		}
	}
}

// mergeWatch closes when either channel does (or ctx ends).
func mergeWatch(ctx context.Context, a, b <-chan struct{}) <-chan struct{} {
	out := make(chan struct{})
	go func() {
		select {
		case <-a:
		case <-b:
		case <-ctx.Done():
		}
		close(out)
	}()
	return out
}

// setView judges every claim against the new view; once ready, the
// sources waiting in Synced are done.
func (g *ClaimGate) setView(v *nodeView, ready bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.view, g.ready = v, ready
	for _, h := range g.claims {
		g.judgeLocked(h, h.reason, false)
	}
	if ready {
		for _, done := range g.synced {
			done()
		}
		g.synced = nil
	}
}

// ClaimsRejectedCounter registers the counter of other nodes' endpoint
// claims one source had refused (tendril_ipcache_remote_claims_rejected_total
// {source, reason}) and returns its increment, for OnRejected; with a nil
// registry it counts nowhere.
func ClaimsRejectedCounter(reg prometheus.Registerer, source string) func(reason string) {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "tendril", Subsystem: "ipcache", Name: "remote_claims_rejected_total",
		Help:        "Other nodes' endpoint claims (TendrilEndpoints, kvstore addresses) refused before the ipcache, by reason.",
		ConstLabels: prometheus.Labels{"source": source},
	}, []string{"reason"})
	if reg != nil {
		reg.MustRegister(c)
	}
	return func(reason string) { c.WithLabelValues(reason).Inc() }
}
