package nodemanager

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"time"
	"unique"

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

// claimReason is a refusal's reason as the gate holds it (one byte);
// claimReasons names each (the constants above), 0 accepting.
type claimReason uint8

var claimReasons = [...]string{"", ClaimReasonIdentity, ClaimReasonUnknownNode, ClaimReasonHostIP, ClaimReasonNodeAddress, ClaimReasonOutside}

func reasonCode(reason string) claimReason {
	for i, r := range claimReasons {
		if r == reason {
			return claimReason(i)
		}
	}
	panic("nodemanager: unknown claim reason " + reason)
}

// ownerKey is an owner's claims in a source: an object another node
// wrote (a TendrilEndpoint, a kvstore key).
type ownerKey struct {
	src   ipcache.Source
	owner ipcache.Owner
}

// heldClaim is one claim as the gate holds it: only what judging it again
// and making its ipcache entry need (the owner and source are its map
// key; the identity narrowed, as one out of range is never held), 128
// bytes where the Claim it comes from takes 184. An owner's claims are a
// list through next: one address is the common case, and costs no slice.
type heldClaim struct {
	ip, nodeIP, hostIP netip.Addr
	// node names the publishing node (kvstore), interned: the 50 or so
	// pods of a node share it.
	node            unique.Handle[string]
	name, namespace string
	next            *heldClaim
	identity        identity.NumericIdentity
	// accepted: the claim is in the ipcache. reason: why not (0 while
	// the nodes are not known yet).
	reason   claimReason
	accepted bool
}

func (h *heldClaim) nodeName() string {
	if h.node == (unique.Handle[string]{}) {
		return ""
	}
	return h.node.Value()
}

// entry is the ipcache entry of an accepted claim.
func (h *heldClaim) entry(k ownerKey) ipcache.Entry {
	return ipcache.Entry{Identity: h.identity, Source: k.src, Owner: k.owner, HostIP: h.hostIP, Name: h.name, Namespace: h.namespace}
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

	mu sync.Mutex
	// claims are the claims held, accepted or not, by owner.
	claims map[ownerKey]*heldClaim
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
		claims: map[ownerKey]*heldClaim{}}
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

// judge says why v refuses h ("" accepts it); h's identity is a cluster
// one (checked when the claim came).
func (v *nodeView) judge(h *heldClaim) (reason, detail string) {
	if v.none {
		// kvstore without Kubernetes: no node registry to tie the
		// address to, so the identity is all that can be checked; the
		// etcd credentials are the boundary there (docs/kvstore.md).
		// Refusing would switch off cross-node identities in that mode.
		return "", ""
	}
	var p *Peer
	node := h.nodeName()
	switch {
	case node != "":
		p = v.byName[node]
	case h.nodeIP.IsValid():
		p = v.nodeOfIP(h.nodeIP)
	}
	if p == nil {
		return ClaimReasonUnknownNode, fmt.Sprintf("no known node %s%s", node, ipString(h.nodeIP))
	}
	if hip := h.hostIP; hip.IsValid() && v.byIP[hip] != p && v.nodeOfIP(hip) != p {
		return ClaimReasonHostIP, fmt.Sprintf("host IP %s is not an address of node %s", hip, p.Name)
	}
	if owner := v.byIP[h.ip]; owner != nil {
		// A node's own address (and a host-network pod's, which is the
		// same) carries remote-node, claimed by the node itself.
		return ClaimReasonNodeAddress, "the address of node " + owner.Name
	}
	for _, cidr := range p.PodCIDRs {
		if cidr.Contains(h.ip) {
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
// queued. A claim whose identity another node may not claim is refused
// at once and not held (no node change makes it valid); the claim its
// owner made on the address before is withdrawn.
func (g *ClaimGate) Upsert(c Claim) {
	g.mu.Lock()
	defer g.mu.Unlock()
	k := ownerKey{src: c.Entry.Source, owner: c.Entry.Owner}
	id, err := CheckIdentity(c.Identity)
	if err != nil {
		if h := g.unlinkLocked(k, c.IP); h != nil {
			g.withdrawLocked(k, h)
		}
		g.refuseLocked(k, c.IP, c.Identity, c.Node, c.NodeIP, ClaimReasonIdentity, err.Error())
		return
	}
	h := g.claims[k]
	for h != nil && h.ip != c.IP {
		h = h.next
	}
	if h == nil {
		h = &heldClaim{ip: c.IP, next: g.claims[k]}
		g.claims[k] = h
	}
	h.nodeIP, h.hostIP, h.identity = c.NodeIP, c.Entry.HostIP, id
	h.node = unique.Handle[string]{}
	if c.Node != "" {
		h.node = unique.Make(c.Node)
	}
	h.name, h.namespace = c.Entry.Name, c.Entry.Namespace
	g.judgeLocked(k, h, h.reason, true)
}

// unlinkLocked takes owner k's claim on ip out of the held claims.
func (g *ClaimGate) unlinkLocked(k ownerKey, ip netip.Addr) *heldClaim {
	var prev *heldClaim
	for h := g.claims[k]; h != nil; prev, h = h, h.next {
		if h.ip != ip {
			continue
		}
		switch {
		case prev != nil:
			prev.next = h.next
		case h.next != nil:
			g.claims[k] = h.next
		default:
			delete(g.claims, k)
		}
		h.next = nil
		return h
	}
	return nil
}

// Delete drops a claim, withdrawing it from the ipcache if it was there.
func (g *ClaimGate) Delete(ip netip.Addr, src ipcache.Source, owner ipcache.Owner) {
	g.mu.Lock()
	defer g.mu.Unlock()
	k := ownerKey{src: src, owner: owner}
	if h := g.unlinkLocked(k, ip); h != nil {
		g.withdrawLocked(k, h)
	}
}

// Retain drops owner's claims in src on the addresses keep refuses (an
// object that no longer lists them, or is gone: keep refusing all),
// withdrawing them from the ipcache: a source that replaces an object's
// claims keeps no list of its own of what the object claimed before.
func (g *ClaimGate) Retain(src ipcache.Source, owner ipcache.Owner, keep func(netip.Addr) bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	k := ownerKey{src: src, owner: owner}
	var drop []netip.Addr
	for h := g.claims[k]; h != nil; h = h.next {
		if !keep(h.ip) {
			drop = append(drop, h.ip)
		}
	}
	for _, ip := range drop {
		g.withdrawLocked(k, g.unlinkLocked(k, ip))
	}
}

// judgeLocked decides h against the current view and makes the ipcache
// follow; changed: the claim itself changed (an accepted one is written
// again). A refusal is logged and counted when its reason is new.
func (g *ClaimGate) judgeLocked(k ownerKey, h *heldClaim, prev claimReason, changed bool) {
	if !g.ready {
		// The nodes are not all known yet: the claim waits for the
		// nodes' initial listing (its identity was judged already).
		h.reason = 0
		g.withdrawLocked(k, h)
		return
	}
	reason, detail := g.view.judge(h)
	if reason != "" {
		code := reasonCode(reason)
		h.reason = code
		g.withdrawLocked(k, h)
		if code != prev || changed {
			g.refuseLocked(k, h.ip, int64(h.identity), h.nodeName(), h.nodeIP, reason, detail)
		}
		return
	}
	h.reason = 0
	if h.accepted && !changed {
		return
	}
	if err := g.cache.UpsertRemoteEndpoint(h.ip, h.entry(k)); err != nil {
		g.log.Warn("ipcache: remote claim", "ip", h.ip, "owner", k.owner, "error", err)
		return
	}
	h.accepted = true
}

// refuseLocked logs and counts a refusal.
func (g *ClaimGate) refuseLocked(k ownerKey, ip netip.Addr, id int64, node string, nodeIP netip.Addr, reason, detail string) {
	g.log.Warn("Refused another node's endpoint claim: not in the ipcache",
		"source", k.src, "owner", k.owner, "ip", ip, "identity", id,
		"node", node, "nodeIP", ipString(nodeIP), "reason", reason, "detail", detail)
	if g.onRejected != nil {
		g.onRejected(reason)
	}
}

func (g *ClaimGate) withdrawLocked(k ownerKey, h *heldClaim) {
	if !h.accepted {
		return
	}
	h.accepted = false
	if err := g.cache.DeleteRemoteEndpoint(h.ip, k.src, k.owner); err != nil {
		g.log.Warn("ipcache: withdraw a remote claim", "ip", h.ip, "owner", k.owner, "error", err)
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
	for k, first := range g.claims {
		for h := first; h != nil; h = h.next {
			g.judgeLocked(k, h, h.reason, false)
		}
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
