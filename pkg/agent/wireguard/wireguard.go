// Package wireguard is the agent's cell for the transparent encryption of
// pod traffic between nodes (--enable-wireguard, docs/encryption.md). It
// keeps the node's private key in the state directory (mode 0600, kept
// across restarts) and publishes the public key in the node's TendrilNode
// (agentk8s.PublicKeys); it keeps one WireGuard device, the userspace
// implementation in a process of its own that outlives the agent
// (pkg/datapath/wireguard), found again by its control socket when the
// agent restarts; and a reconciler sets the device's peers from the nodes
// table: each other node with a valid key, its endpoint that node's own
// address, its allowed IPs the pod CIDRs the nodes table accepted for it.
// The nodes cell routes the peers' pod CIDRs to the device
// (nodes.EncryptionDevice), and the pods' MTU leaves room for the
// encryption (agentendpoints.EncryptionOverhead). With --wireguard-strict
// the reconciler also writes the datapath's strict mode maps: every other
// node's pod CIDR, marked with whether that node is a peer, and the
// device's ifindex; from_pod drops what would leave unencrypted. With
// --wireguard-encrypt-node it routes what this node sends to the peers'
// addresses through the device (dpwg.NodeRoutes) and writes those
// addresses to the same maps, so that from_pod sends the pods' packets to
// them to the device (the routes serve only the host's own), and in the tunnel
// routing mode the tunnel's datagrams (dpwg.TunnelRoutes): the device's
// own datagrams carry a firewall mark that keeps them out of those routes.
package wireguard

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"
	"github.com/vishvananda/netlink"
	"golang.zx2c4.com/wireguard/wgctrl"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/tendril-net/tendril/pkg/agent/agentendpoints"
	"github.com/tendril-net/tendril/pkg/agent/agentk8s"
	"github.com/tendril-net/tendril/pkg/agent/hostdev"
	"github.com/tendril-net/tendril/pkg/agent/nodes"
	"github.com/tendril-net/tendril/pkg/agent/tunnel"
	"github.com/tendril-net/tendril/pkg/datapath/loader"
	"github.com/tendril-net/tendril/pkg/datapath/maps"
	dpwg "github.com/tendril-net/tendril/pkg/datapath/wireguard"
	"github.com/tendril-net/tendril/pkg/datapath/wireguard/wgkey"
	"github.com/tendril-net/tendril/pkg/health"
	"github.com/tendril-net/tendril/pkg/lifecycle"
	"github.com/tendril-net/tendril/pkg/metrics"
	"github.com/tendril-net/tendril/pkg/nodemanager"
	"github.com/tendril-net/tendril/pkg/option"
)

// Cell is the encryption: its config, the device's reconciler
// (*Encryption, nil with encryption off), the public key to publish, the
// device the peers' pod CIDR routes go to, the MTU the encryption takes.
var Cell = cell.Module("wireguard", "Transparent encryption between nodes with WireGuard",
	cell.Provide(Config.validate),
	cell.Provide(lifecycle.Build[*Encryption]),
	cell.Config(DefaultConfig()),
	cell.Provide(newCell, publicKeys, routeDevice, tunnelEncrypted, mtuOverhead, statusContribution, apiHandlers),
)

// tunnelEncrypted tells the tunnel cell that the tunnel's datagrams must
// go through WireGuard (Geneve in eBPF refuses to run then: it sends its
// datagrams past the routes that take them to the device).
func tunnelEncrypted(c Config) tunnel.Encrypted { return tunnel.Encrypted(c.EnableWireguard) }

// routeDevice: the peers' pod CIDRs to the WireGuard device, in native
// routing. In tunnel mode they stay on the tunnel device, and the
// tunnel's datagrams to the other nodes go through the WireGuard device
// (dpwg.TunnelRoutes).
func routeDevice(c Config, t tunnel.Config) nodes.EncryptionDevice {
	if !c.EnableWireguard || t.Tunneling() {
		return ""
	}
	return nodes.EncryptionDevice(c.WireguardDevice)
}

func mtuOverhead(c Config) agentendpoints.EncryptionOverhead {
	if !c.EnableWireguard {
		return 0
	}
	return dpwg.Overhead
}

func publicKeys(e *Encryption) agentk8s.PublicKeys {
	if e == nil {
		return nil
	}
	return e
}

// Device is the WireGuard device as the reconciler drives it
// (wgDevice; a fake in the cell's tests).
type Device interface {
	dpwg.Client
	// Ensure finds the device running, or starts it.
	Ensure(ctx context.Context) error
}

// StrictMaps are the datapath's strict mode and node encryption maps as
// the reconciler writes them (maps.EncryptMaps; a fake in the cell's
// tests).
type StrictMaps interface {
	SetDevice(ifindex int, strict, node bool, tunnelPort uint16) error
	SyncCIDRs(want map[netip.Prefix]bool, prune bool) error
	SyncNodeAddrs(want map[netip.Addr]bool, prune bool) error
}

// NodeRouter routes this node's traffic to the peers' node addresses
// through the device (dpwg.NodeRoutes; a fake in the cell's tests).
type NodeRouter interface {
	Sync(addrs []netip.Addr, exclude []netip.AddrPort, prune bool) (bool, error)
}

// ReplyTranslation gives the WireGuard device the host programs'
// reverse translation of NodePort replies (hostdev.Masquerade's
// AttachWireGuard; a fake in the cell's tests).
type ReplyTranslation interface {
	AttachWireGuard(ifindex int) error
}

// Strict is what the datapath's part of strict mode and of node
// encryption needs: the maps and the device's ifindex by its name; in the
// tunnel routing mode the tunnel's UDP port (0 in native routing).
type Strict struct {
	Maps       StrictMaps
	LinkIndex  func(name string) (int, error)
	TunnelPort uint16
}

// Encryption reconciles the device with the key and the nodes table.
type Encryption struct {
	cfg     Config
	keyPath string
	dev     Device
	db      *statedb.DB
	peers   statedb.Table[*nodemanager.Peer]
	log     *slog.Logger
	// strict is set with --wireguard-strict or --wireguard-encrypt-node
	// (and the datapath).
	strict *Strict
	// nodeRoutes is set with --wireguard-encrypt-node.
	nodeRoutes NodeRouter
	// replies is set with the datapath: the device's ingress gets
	// from_wireguard, which translates back the replies other nodes'
	// backends send through their devices (their node encryption).
	// linkIndex finds the device's ifindex by its name.
	replies   ReplyTranslation
	linkIndex func(name string) (int, error)
	// tunnelRoutes is set in the tunnel routing mode.
	tunnelRoutes NodeRouter
	// rules judge which of a node's addresses are its own
	// (nodemanager.Rules.OwnAddresses): the same pools, service CIDRs
	// and local pod CIDRs and addresses the nodes table judges pod CIDRs
	// against.
	rules nodemanager.Rules
	// apiServers are the API server's addresses and ports (the
	// kubernetes Service's endpoints; nil without Kubernetes): with node
	// encryption they are left out of it when they sit on another node.
	apiServers func() []netip.AddrPort

	mu  sync.Mutex
	key wgtypes.Key
	// keyChanged is closed (and replaced) when the key changes.
	keyChanged chan struct{}
	// skipped are the nodes left out of the peers, and why.
	skipped map[string]string
	// refusedAddrs are the addresses nodes claim that are not taken as
	// theirs, by node.
	refusedAddrs map[string]string
	lastErr      error
}

// New builds the reconciler: the key is read from keyPath, or made.
func New(cfg Config, keyPath string, dev Device, db *statedb.DB, peers statedb.Table[*nodemanager.Peer], log *slog.Logger) (*Encryption, error) {
	key, err := wgkey.LoadOrCreateKey(keyPath)
	if err != nil {
		return nil, err
	}
	return &Encryption{cfg: cfg, keyPath: keyPath, dev: dev, db: db, peers: peers, log: log,
		key: key, keyChanged: make(chan struct{})}, nil
}

// WireGuardPublicKey is this node's public key, to publish, and a channel
// closed when it changes (agentk8s.PublicKeys).
func (e *Encryption) WireGuardPublicKey() (string, <-chan struct{}) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.key.PublicKey().String(), e.keyChanged
}

// RotateKey makes a new key, sets it on the device and has it published.
// The peers keep sending to the old key's sessions until they learn the
// new one from the TendrilNode and handshake again: the sessions are
// re-established, the pods' connections are not reset (TCP retransmits
// across the gap).
func (e *Encryption) RotateKey(ctx context.Context) error {
	key, err := wgkey.RotateKey(e.keyPath)
	if err != nil {
		return err
	}
	e.mu.Lock()
	e.key = key
	close(e.keyChanged)
	e.keyChanged = make(chan struct{})
	e.mu.Unlock()
	e.log.Info("WireGuard key rotated", "public-key", key.PublicKey().String())
	return e.Reconcile(ctx)
}

// Reconcile makes the device hold the key and the peers the nodes table
// gives. Until the table is initialized (its sources have listed every
// node) peers are only added or updated, never removed: at an agent's
// restart the device still has every peer, and removing them until the
// table fills would cut the pods' traffic the device carries meanwhile.
func (e *Encryption) Reconcile(ctx context.Context) error {
	err := e.reconcile(ctx)
	e.mu.Lock()
	e.lastErr = err
	e.mu.Unlock()
	return err
}

func (e *Encryption) reconcile(ctx context.Context) error {
	if err := e.dev.Ensure(ctx); err != nil {
		if e.strict != nil {
			// No device: strict mode lets nothing for other nodes'
			// pods out until there is one again.
			err = errors.Join(err, e.strict.Maps.SetDevice(0, e.cfg.WireguardStrict, e.cfg.WireguardEncryptNode, e.strict.TunnelPort))
		}
		return err
	}
	txn := e.db.ReadTxn()
	initialized, _ := e.peers.Initialized(txn)
	e.mu.Lock()
	key := e.key
	e.mu.Unlock()
	all := statedb.Collect(e.peers.All(txn))
	want, skipped, refused := desiredPeers(all, key.PublicKey(), e.cfg.WireguardPort, e.rules)
	refusedAddrs := map[string]string{}
	for n, rs := range refused {
		refusedAddrs[n] = joinRejections(rs)
	}
	e.mu.Lock()
	for n, why := range skipped {
		if e.skipped[n] != why {
			e.log.Warn("Node left out of the WireGuard peers", "node", n, "reason", why)
		}
	}
	for n, why := range refusedAddrs {
		if e.refusedAddrs[n] != why {
			e.log.Warn("Node addresses not given to its WireGuard peer", "node", n, "addresses", why)
		}
	}
	e.skipped = skipped
	e.refusedAddrs = refusedAddrs
	e.mu.Unlock()
	if !initialized {
		cur, err := e.dev.Device(e.cfg.WireguardDevice)
		if err != nil {
			return fmt.Errorf("wireguard device %s: %w", e.cfg.WireguardDevice, err)
		}
		want = keepUnknown(want, cur.Peers)
	}
	mark := 0
	if e.cfg.WireguardEncryptNode || e.tunnelRoutes != nil {
		// The device's own datagrams carry the mark that keeps them
		// out of the node routes (dpwg.NodeRoutes): set before any
		// node route exists.
		mark = dpwg.NodeMark
	}
	changed, err := dpwg.Configure(e.dev, e.cfg.WireguardDevice, key, int(e.cfg.WireguardPort), mark, want)
	if err != nil {
		return errors.Join(err, e.syncStrict(all, nil, initialized))
	}
	if changed {
		e.log.Info("WireGuard peers set", "device", e.cfg.WireguardDevice, "peers", len(want), "nodes-synced", initialized)
	}
	return errors.Join(e.syncReplies(), e.syncNodeRoutes(want, initialized), e.syncTunnelRoutes(all, initialized), e.syncStrict(all, want, initialized))
}

// syncReplies gives the device's ingress from_wireguard (nothing without
// the datapath). Whatever this node's own flags: a peer with node
// encryption sends its backends' replies to this node's NodePort clients
// through its device, and they arrive here. At every reconcile, so a
// device started again (a new ifindex) gets it within one.
func (e *Encryption) syncReplies() error {
	if e.replies == nil {
		return nil
	}
	ifindex, err := e.linkIndex(e.cfg.WireguardDevice)
	if err != nil {
		return fmt.Errorf("wireguard device %s: %w", e.cfg.WireguardDevice, err)
	}
	return e.replies.AttachWireGuard(ifindex)
}

// syncTunnelRoutes sends the tunnel's datagrams to every other node's
// address through the device (nothing outside tunnel mode). Every node of
// the table, with a key or not: the device drops what it has no peer for,
// so a node without a key gets no encapsulated pod traffic rather than
// getting it in the clear. The rule selects only the tunnel's port, so
// the rest of this node's traffic to that node is not cut.
func (e *Encryption) syncTunnelRoutes(all []*nodemanager.Peer, initialized bool) error {
	if e.tunnelRoutes == nil {
		return nil
	}
	var addrs []netip.Addr
	for _, p := range all {
		addrs = append(addrs, p.IPs...)
	}
	slices.SortFunc(addrs, netip.Addr.Compare)
	changed, err := e.tunnelRoutes.Sync(slices.Compact(addrs), nil, initialized)
	if changed {
		e.log.Info("WireGuard tunnel routes set", "device", e.cfg.WireguardDevice, "nodes", len(all))
	}
	if err != nil {
		return fmt.Errorf("wireguard tunnel routes: %w", err)
	}
	return nil
}

// syncNodeRoutes routes this node's traffic to the configured peers' node
// addresses through the device (nothing without --wireguard-encrypt-node).
// Only peers set on the device get a route: a node without a key is
// reached in the clear rather than not at all (the device would drop
// what it has no peer for, and the agent's own traffic to that node with
// it). Until the nodes table is initialized no route is removed, as no
// peer is.
func (e *Encryption) syncNodeRoutes(configured []dpwg.Peer, initialized bool) error {
	if e.nodeRoutes == nil {
		return nil
	}
	addrs := dpwg.NodeAddresses(configured)
	exclude := apiServerExclusions(e.apiServers, addrs)
	changed, err := e.nodeRoutes.Sync(addrs, exclude, initialized)
	if changed {
		e.log.Info("WireGuard node routes set", "device", e.cfg.WireguardDevice, "nodes", len(configured), "excluded", exclude)
	}
	if err != nil {
		return fmt.Errorf("wireguard-encrypt-node: %w", err)
	}
	return nil
}

// syncStrict writes strict mode's and node encryption's maps (nothing
// without either): every node's accepted pod CIDRs, marked as a peer's
// when the device has that node as a peer (configured: nil when the
// configuration failed, so no node counts as one); with node encryption
// the peers' own addresses (those OwnAddresses accepted: the ones the
// device has as their allowed IPs) marked as a peer's, and with strict
// mode too the other nodes' own addresses marked as no peer's (a pod
// gets nothing through to them); then the device's ifindex and flags.
// Until the nodes table is initialized nothing is removed: an entry left
// from before the restart can only drop or send to the device, never let
// something out in the clear.
func (e *Encryption) syncStrict(all []*nodemanager.Peer, configured []dpwg.Peer, initialized bool) error {
	if e.strict == nil {
		return nil
	}
	cidrs := map[netip.Prefix]bool{}
	if e.cfg.WireguardStrict {
		cidrs = strictCIDRs(all, configured)
	}
	if err := e.strict.Maps.SyncCIDRs(cidrs, initialized); err != nil {
		return fmt.Errorf("wireguard-strict: %w", err)
	}
	addrs := map[netip.Addr]bool{}
	if e.cfg.WireguardEncryptNode {
		addrs = nodeAddrs(all, configured, e.rules, e.cfg.WireguardStrict)
	}
	if err := e.strict.Maps.SyncNodeAddrs(addrs, initialized); err != nil {
		return fmt.Errorf("wireguard-encrypt-node: %w", err)
	}
	strict, node := e.cfg.WireguardStrict, e.cfg.WireguardEncryptNode
	ifindex, err := e.strict.LinkIndex(e.cfg.WireguardDevice)
	if err != nil {
		return errors.Join(fmt.Errorf("wireguard-strict: device %s: %w", e.cfg.WireguardDevice, err),
			e.strict.Maps.SetDevice(0, strict, node, e.strict.TunnelPort))
	}
	if err := e.strict.Maps.SetDevice(ifindex, strict, node, e.strict.TunnelPort); err != nil {
		return fmt.Errorf("wireguard-strict: %w", err)
	}
	return nil
}

// nodeAddrs are the node addresses from_pod sends to the device (node
// encryption): the configured peers' own addresses (the device has them
// as their allowed IPs, so they were judged that node's own by
// OwnAddresses), true. With strict mode also the own addresses of the
// nodes that are no peer (no key, a malformed or duplicate one), false:
// what a pod starts towards them is dropped instead of leaving in the
// clear. An address OwnAddresses refuses is in neither.
func nodeAddrs(all []*nodemanager.Peer, configured []dpwg.Peer, rules nodemanager.Rules, strict bool) map[netip.Addr]bool {
	out := map[netip.Addr]bool{}
	isPeer := map[string]bool{}
	for _, p := range configured {
		isPeer[p.Node] = true
		for _, a := range p.Addresses {
			out[a] = true
		}
	}
	if !strict {
		return out
	}
	own, _ := rules.OwnAddresses(all)
	for _, p := range all {
		if isPeer[p.Name] {
			continue
		}
		for _, a := range own[p.Name] {
			if _, ok := out[a]; !ok {
				out[a] = false
			}
		}
	}
	return out
}

// strictCIDRs are the pod CIDRs that must leave encrypted: every node's
// in the table, true when the node is one of the device's peers. A node
// without a key (or with a malformed or duplicate one) is in it too,
// false: under strict mode it gets nothing.
func strictCIDRs(all []*nodemanager.Peer, configured []dpwg.Peer) map[netip.Prefix]bool {
	isPeer := map[string]bool{}
	for _, p := range configured {
		isPeer[p.Node] = true
	}
	out := map[netip.Prefix]bool{}
	for _, p := range all {
		for _, c := range p.PodCIDRs {
			out[c.Masked()] = isPeer[p.Name]
		}
	}
	return out
}

// desiredPeers are the peers the nodes table gives: every node with a
// valid key (checked as the TendrilNode was read) and a pod CIDR the
// table accepted. The endpoint is the node's own address (the first of
// the pod CIDRs' first family; the table's addresses come from the Node
// and its TendrilNode), the allowed IPs exactly the accepted pod CIDRs
// and the node's own addresses, so a node can neither receive nor send
// for another's pods. The node's addresses are there for what comes back
// from it: a pod's packet to another node's address leaves in the clear
// (only the pod CIDRs are routed to the device), but the node's answer
// to the pod is routed into its device, and the receiving device drops
// an inner source its peer is not allowed. A key two
// nodes publish is given to neither (WireGuard would merge them into one
// peer and its allowed IPs), nor is this node's own key.
func desiredPeers(all []*nodemanager.Peer, own wgtypes.Key, port uint16, rules nodemanager.Rules) ([]dpwg.Peer, map[string]string, map[string][]nodemanager.AddressRejection) {
	skipped := map[string]string{}
	byKey := map[string][]string{}
	for _, p := range all {
		if p.WireGuardKey != "" {
			byKey[p.WireGuardKey] = append(byKey[p.WireGuardKey], p.Name)
		}
	}
	// The addresses come from objects each node writes for itself: only
	// those no one else owns go into the allowed IPs and the node routes
	// (one two nodes claim: WireGuard would move it to whichever peer
	// was set last, and with node encryption this node's traffic to it
	// would go to that one; one of this node's pods or addresses, of
	// another node's pods, of the pools or the services: that node could
	// send as it and, with node encryption, receive this node's traffic
	// to it).
	ownAddrs, refused := rules.OwnAddresses(all)
	var out []dpwg.Peer
	for _, p := range all {
		switch {
		case p.KeyError != "":
			skipped[p.Name] = "malformed key: " + p.KeyError
			continue
		case p.WireGuardKey == "":
			skipped[p.Name] = "no key published"
			continue
		case len(byKey[p.WireGuardKey]) > 1:
			skipped[p.Name] = fmt.Sprintf("key published by %d nodes %v", len(byKey[p.WireGuardKey]), byKey[p.WireGuardKey])
			continue
		case p.WireGuardKey == own.PublicKey().String() || p.WireGuardKey == own.String():
			skipped[p.Name] = "publishes this node's key"
			continue
		case len(p.PodCIDRs) == 0:
			skipped[p.Name] = "no accepted pod CIDR"
			continue
		}
		key, err := wgkey.ParsePublicKey(p.WireGuardKey)
		if err != nil { // checked when read; again, as the last gate
			skipped[p.Name] = "malformed key: " + err.Error()
			continue
		}
		ep, ok := endpoint(p, ownAddrs[p.Name])
		if !ok {
			skipped[p.Name] = "no node address of its own"
			if len(refused[p.Name]) > 0 {
				skipped[p.Name] += ": " + joinRejections(refused[p.Name])
			}
			continue
		}
		allowed := slices.Clone(p.PodCIDRs)
		var addrs []netip.Addr
		for _, ip := range ownAddrs[p.Name] {
			allowed = append(allowed, netip.PrefixFrom(ip, ip.BitLen()))
			addrs = append(addrs, ip)
		}
		out = append(out, dpwg.Peer{Node: p.Name, PublicKey: key, Endpoint: netip.AddrPortFrom(ep, port),
			AllowedIPs: allowed, Addresses: addrs})
	}
	return out, skipped, refused
}

// apiServerExclusions are the API server's addresses and ports that the
// node routes would send through the device (it sits on another node):
// they are left out, as Cilium leaves control-plane nodes out of node
// encryption, so that this node reaches the API server, and learns the
// keys there, even while the device cannot reach that node (a key not
// yet known on either side, a rotation, the device being restarted).
func apiServerExclusions(apiServers func() []netip.AddrPort, routed []netip.Addr) []netip.AddrPort {
	if apiServers == nil {
		return nil
	}
	var out []netip.AddrPort
	for _, ap := range apiServers() {
		ap = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
		if slices.Contains(routed, ap.Addr()) {
			out = append(out, ap)
		}
	}
	slices.SortFunc(out, netip.AddrPort.Compare)
	return slices.Compact(out)
}

func joinRejections(rs []nodemanager.AddressRejection) string {
	var out string
	for i, r := range rs {
		if i > 0 {
			out += ", "
		}
		out += r.String()
	}
	return out
}

// endpoint is where the peer's datagrams go: the first of the node's own
// addresses (OwnAddresses) of its first pod CIDR's family, else its first.
func endpoint(p *nodemanager.Peer, own []netip.Addr) (netip.Addr, bool) {
	v4 := p.PodCIDRs[0].Addr().Is4()
	for _, ip := range own {
		if ip.Is4() == v4 {
			return ip, true
		}
	}
	if len(own) > 0 {
		return own[0], true
	}
	return netip.Addr{}, false
}

// keepUnknown adds to want the device's peers want does not name (by
// key), unchanged: before the nodes table is complete, absence proves
// nothing.
func keepUnknown(want []dpwg.Peer, have []wgtypes.Peer) []dpwg.Peer {
	named := map[wgtypes.Key]bool{}
	for _, p := range want {
		named[p.PublicKey] = true
	}
	for _, h := range have {
		if named[h.PublicKey] || h.Endpoint == nil {
			continue
		}
		ap := h.Endpoint.AddrPort()
		p := dpwg.Peer{Node: "(not yet listed)", PublicKey: h.PublicKey, Endpoint: netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())}
		for _, n := range h.AllowedIPs {
			a, _ := netip.AddrFromSlice(n.IP)
			ones, _ := n.Mask.Size()
			p.AllowedIPs = append(p.AllowedIPs, netip.PrefixFrom(a.Unmap(), ones))
		}
		want = append(want, p)
	}
	return want
}

// run reconciles at every change of the nodes table, and every recheck
// (the device's process may have gone: it is started again).
func (e *Encryption) run(ctx context.Context, h cell.Health) error {
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		_, watch := e.peers.AllWatch(e.db.ReadTxn())
		initialized, initWatch := e.peers.Initialized(e.db.ReadTxn())
		if initialized {
			// The channel stays closed once the table is initialized:
			// waiting on it would reconcile in a loop without a pause.
			initWatch = nil
		}
		if err := e.Reconcile(ctx); err != nil {
			h.Degraded("reconcile", err)
			e.log.Warn("WireGuard device not reconciled, will retry", "error", err)
		} else {
			h.OK("peers set")
		}
		t.Reset(recheck)
		select {
		case <-ctx.Done():
			return nil
		case <-watch:
		case <-initWatch:
		case <-t.C:
		}
	}
}

// recheck is how often the device is checked without a change.
const recheck = 10 * time.Second

type params struct {
	cell.In

	Config    Config
	Agent     option.Agent
	EPConfig  agentendpoints.Config
	Tunnel    tunnel.Config
	Log       *slog.Logger
	Lifecycle cell.Lifecycle
	Jobs      job.Registry
	Health    *health.Registry
	DB        *statedb.DB
	Nodes     statedb.Table[*nodemanager.Peer]
	// K8s and Client give the rules a node's addresses are judged by
	// and the API server's endpoints (Client is nil without Kubernetes).
	K8s     agentk8s.Config
	Client  *agentk8s.Client
	Metrics *metrics.Server `optional:"true"`
	// Loader is nil without the datapath (then no strict mode).
	Loader *loader.Loader
	// Masq holds the host device programs (nil without the datapath):
	// from_wireguard comes from it.
	Masq *hostdev.Masquerade `optional:"true"`
}

func newCell(p params) (*Encryption, error) {
	if p.Config.WireguardStrict && p.Loader == nil {
		return nil, errors.New("wireguard-strict: needs the datapath (enable-datapath)")
	}
	datapathOn := p.Config.EnableWireguard && (p.Config.WireguardStrict || p.Config.WireguardEncryptNode)
	if p.Loader != nil && !datapathOn {
		// The maps are pinned: a node that ran in strict mode (or
		// with node encryption) before leaves it only when told so.
		// After the loader's start hook (this constructor takes the
		// loader): the maps are open.
		p.Lifecycle.Append(cell.Hook{OnStart: func(cell.HookContext) error {
			m, err := maps.NewEncryptMaps(p.Loader.MapReplacements())
			if err == nil {
				err = errors.Join(m.SetDevice(0, false, false, 0), m.SyncCIDRs(nil, true), m.SyncNodeAddrs(nil, true))
			}
			if err != nil {
				return fmt.Errorf("wireguard: strict mode off: %w", err)
			}
			return nil
		}})
	}
	tunneling := p.Config.EnableWireguard && p.Tunnel.Tunneling()
	if (p.Loader != nil || p.Config.EnableWireguard) && (!p.Config.WireguardEncryptNode || !tunneling) {
		// The rules and the tables stay when the agent stops: a node
		// leaves node encryption (or the tunnel's) only when told so.
		p.Lifecycle.Append(cell.Hook{OnStart: func(cell.HookContext) error {
			h, err := netlink.NewHandle()
			if err != nil {
				return fmt.Errorf("wireguard: routes off: %w", err)
			}
			defer h.Close()
			if !p.Config.WireguardEncryptNode {
				if err := (dpwg.NodeRoutes{Handle: h, Device: p.Config.WireguardDevice}).Remove(); err != nil {
					return fmt.Errorf("wireguard: node encryption off: %w", err)
				}
			}
			if !tunneling {
				if err := dpwg.TunnelRoutes(h, p.Config.WireguardDevice, 1).Remove(); err != nil {
					return fmt.Errorf("wireguard: tunnel encryption off: %w", err)
				}
			}
			return nil
		}})
	}
	if !p.Config.EnableWireguard {
		return nil, nil
	}
	dev := &wgDevice{name: p.Config.WireguardDevice, mtu: p.EPConfig.MTU - dpwg.Overhead,
		external: p.Config.WireguardDeviceExternal, logPath: filepath.Join(p.Agent.StateDir, "wireguard-device.log"), log: p.Log}
	e, err := New(p.Config, filepath.Join(p.Agent.StateDir, wgkey.KeyFile), dev, p.DB, p.Nodes, p.Log)
	if err != nil {
		return nil, fmt.Errorf("wireguard: %w", err)
	}
	if p.Client != nil {
		if e.rules, err = agentk8s.PeerRules(p.K8s, p.Client); err != nil {
			return nil, fmt.Errorf("wireguard: %w", err)
		}
		e.apiServers = p.Client.APIServerEndpoints
	}
	p.Lifecycle.Append(cell.Hook{
		OnStart: func(hc cell.HookContext) error {
			if datapathOn && p.Loader != nil {
				m, err := maps.NewEncryptMaps(p.Loader.MapReplacements())
				if err != nil {
					return fmt.Errorf("wireguard-strict: %w", err)
				}
				// Written by the first reconcile, right after the
				// start (before jobs run): after a restart the
				// pinned maps hold what the last agent wrote
				// meanwhile, so the traffic the device still
				// carries is not cut.
				e.strict = &Strict{Maps: m, LinkIndex: linkIndex}
				if tunneling {
					// The pods' packets leave as the tunnel's
					// datagrams: strict mode checks their route.
					e.strict.TunnelPort = p.Tunnel.Port()
				}
			}
			if p.Masq != nil {
				e.replies, e.linkIndex = p.Masq, linkIndex
			}
			if p.Config.WireguardEncryptNode || tunneling {
				h, err := netlink.NewHandle()
				if err != nil {
					return fmt.Errorf("wireguard routes: %w", err)
				}
				if p.Config.WireguardEncryptNode {
					e.nodeRoutes = dpwg.NodeRoutes{Handle: h, Device: p.Config.WireguardDevice}
				}
				if tunneling {
					e.tunnelRoutes = dpwg.TunnelRoutes(h, p.Config.WireguardDevice, p.Tunnel.Port())
				}
			}
			// The device first (found running, or started), so the
			// routes the nodes cell puts to it find it.
			if err := dev.Ensure(hc); err != nil {
				return fmt.Errorf("wireguard: %w", err)
			}
			e.log.Info("WireGuard encryption on", "device", p.Config.WireguardDevice, "port", p.Config.WireguardPort,
				"public-key", e.key.PublicKey().String())
			return nil
		},
		OnStop: func(cell.HookContext) error {
			// The device and its process stay: pod traffic between
			// nodes keeps flowing, encrypted, while the agent is down.
			return dev.close()
		},
	})
	jobs := p.Jobs.NewGroup(p.Health.Scope("wireguard"), job.WithLogger(p.Log))
	jobs.Add(job.OneShot("wireguard-peers", e.run))
	if p.Metrics != nil {
		p.Metrics.Registry.MustRegister(newCollector(e))
	}
	return e, nil
}

// linkIndex is the ifindex of the link named name, in the agent's
// network namespace.
func linkIndex(name string) (int, error) {
	l, err := netlink.LinkByName(name)
	if err != nil {
		return 0, err
	}
	return l.Attrs().Index, nil
}

// wgDevice is the device through wgctrl: found running (a kernel device,
// or a userspace one's process), waited for (external), or made: the
// kernel's where it has the module (dpwg.CreateKernel), else the agent's
// own binary in a process of its own (dpwg.Spawn). Both kinds are driven
// by the same wgctrl calls.
type wgDevice struct {
	name string
	mtu  int
	// external: another process serves the device (waited for, never
	// spawned).
	external bool
	logPath  string
	log      *slog.Logger

	mu     sync.Mutex
	client *wgctrl.Client
}

func (d *wgDevice) wg() (*wgctrl.Client, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.client == nil {
		c, err := wgctrl.New()
		if err != nil {
			return nil, fmt.Errorf("wgctrl: %w", err)
		}
		d.client = c
	}
	return d.client, nil
}

func (d *wgDevice) Ensure(ctx context.Context) error {
	c, err := d.wg()
	if err != nil {
		return err
	}
	switch {
	case dpwg.Running(c, d.name):
	case d.external:
		// The device container starts beside the agent's: wait for it.
		// A process of our own would hold the name and the container's
		// would fail; and ours would die with the agent's container.
		ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		defer cancel()
		if err := dpwg.WaitRunning(ctx, c, d.name); err != nil {
			return err
		}
		d.log.Info("WireGuard device found (run by another process, or the kernel's)", "device", d.name)
	default:
		// The kernel's device where it has the module: no process to
		// keep alive; else the userspace one in a process of its own.
		kernel, err := dpwg.CreateKernel(d.name, d.mtu)
		if err != nil {
			return err
		}
		if kernel {
			d.log.Info("WireGuard device made in the kernel", "device", d.name, "mtu", d.mtu)
			break
		}
		exe, err := os.Executable()
		if err != nil {
			return fmt.Errorf("wireguard device: own binary: %w", err)
		}
		ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		pid, err := dpwg.Spawn(ctx, c, d.name, []string{exe, dpwg.ServeSubcommand, "--name", d.name, "--mtu", strconv.Itoa(d.mtu)}, d.logPath)
		if err != nil {
			return err
		}
		d.log.Info("WireGuard device started (userspace, its own process)", "device", d.name, "pid", pid, "mtu", d.mtu)
	}
	// A device found running was made by someone else's flags (the
	// device container's, an agent with another MTU): the MTU is ours.
	if err := dpwg.SetMTU(d.name, d.mtu); err != nil {
		return err
	}
	return nil
}

func (d *wgDevice) Device(name string) (*wgtypes.Device, error) {
	c, err := d.wg()
	if err != nil {
		return nil, err
	}
	return c.Device(name)
}

func (d *wgDevice) ConfigureDevice(name string, cfg wgtypes.Config) error {
	c, err := d.wg()
	if err != nil {
		return err
	}
	return c.ConfigureDevice(name, cfg)
}

func (d *wgDevice) close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.client == nil {
		return nil
	}
	err := d.client.Close()
	d.client = nil
	return err
}

// State is the device as `tendril status` shows it.
type State struct {
	Device    string
	PublicKey string
	Port      int
	Peers     []wgtypes.Peer
	// Nodes names each peer's node by its key.
	Nodes   map[wgtypes.Key]string
	Skipped map[string]string
	// RefusedAddrs are the addresses nodes claim that are not given to
	// their peers, by node.
	RefusedAddrs map[string]string
	Err          error
}

// State reads the device.
func (e *Encryption) State() State {
	e.mu.Lock()
	st := State{Device: e.cfg.WireguardDevice, PublicKey: e.key.PublicKey().String(), Port: int(e.cfg.WireguardPort),
		Skipped: e.skipped, RefusedAddrs: e.refusedAddrs, Err: e.lastErr, Nodes: map[wgtypes.Key]string{}}
	e.mu.Unlock()
	for p := range e.peers.All(e.db.ReadTxn()) {
		if k, err := wgkey.ParsePublicKey(p.WireGuardKey); err == nil {
			st.Nodes[k] = p.Name
		}
	}
	d, err := e.dev.Device(e.cfg.WireguardDevice)
	if err != nil {
		st.Err = errors.Join(st.Err, err)
		return st
	}
	st.Peers = d.Peers
	return st
}
