package nodemanager

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"net"
	"net/netip"
	"sync"

	"github.com/cilium/statedb"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/tendril-net/tendril/pkg/datapath/linux"
	"github.com/tendril-net/tendril/pkg/reconcile"
)

// RouteProtocol marks routes to peer nodes' pod CIDRs. It differs from the
// endpoint routes' protocol so neither side mistakes the other's routes.
const RouteProtocol netlink.RouteProtocol = 0x55

// RouteBackend is the kernel's routing table as the routes reconciler
// sees it; a test injects failures through it.
type RouteBackend interface {
	// Replace installs (or changes) the route to dst via the next hop.
	Replace(dst netip.Prefix, via netip.Addr) error
	// Delete removes the route to dst; an absent route is not an error.
	Delete(dst netip.Prefix) error
	// List returns the routes the node manager owns (RouteProtocol).
	List() (map[netip.Prefix]netip.Addr, error)
}

// peerOps realize a peer: its node addresses (NodeIPs) claimed as
// remote-node in the ipcache, its health endpoint's addresses (those
// inside its accepted pod CIDRs) as the health identity on that node (so
// the tunnel knows where they are), its claims on addresses it no longer
// has (or no longer owns) withdrawn.
type peerOps struct {
	cache IPCache

	mu sync.Mutex
	// published are each node's claims made, so that an address a node
	// lost (or a deleted node's) is withdrawn.
	published map[string][]netip.Addr
}

func (o *peerOps) Update(_ context.Context, _ statedb.ReadTxn, _ statedb.Revision, p *Peer) error {
	var errs []error
	for _, cidr := range p.PodCIDRs {
		if _, ok := p.nextHop(cidr); !ok {
			errs = append(errs, fmt.Errorf("node %s: no address of the family of pod CIDR %s", p.Name, cidr))
		}
	}
	if o.cache == nil {
		return errors.Join(errs...)
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	health := map[netip.Addr]netip.Addr{} // address: its node's address
	if host, ok := p.primaryNodeIP(); ok {
		for _, ip := range p.HealthEndpointIPs() {
			if !containsAddr(p.NodeIPs, ip) {
				health[ip] = host
			}
		}
	}
	var kept []netip.Addr
	for _, ip := range o.published[p.Name] {
		if _, ok := health[ip]; ok || containsAddr(p.NodeIPs, ip) {
			continue
		}
		if err := o.cache.DeleteRemoteNode(p.Name, ip); err != nil {
			errs = append(errs, fmt.Errorf("ipcache: withdraw remote node %s %s: %w", p.Name, ip, err))
			kept = append(kept, ip) // withdrawn at the retry
		}
	}
	// Only the addresses judged a node's: a pod's, a service's or this
	// node's address claimed by a node would get the remote-node
	// identity (and what policies allow remote-node) on that node's word
	// alone.
	for _, ip := range p.NodeIPs {
		if err := o.cache.UpsertRemoteNode(p.Name, ip); err != nil {
			errs = append(errs, fmt.Errorf("ipcache: remote node %s %s: %w", p.Name, ip, err))
			continue
		}
		kept = append(kept, ip)
	}
	for ip, host := range health {
		if err := o.cache.UpsertRemoteHealth(p.Name, ip, host); err != nil {
			errs = append(errs, fmt.Errorf("ipcache: health endpoint of node %s %s: %w", p.Name, ip, err))
			continue
		}
		kept = append(kept, ip)
	}
	o.published[p.Name] = kept
	return errors.Join(errs...)
}

func (o *peerOps) Delete(_ context.Context, _ statedb.ReadTxn, _ statedb.Revision, p *Peer) error {
	if o.cache == nil {
		return nil
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	var errs []error
	var kept []netip.Addr
	for _, ip := range append(o.published[p.Name], p.IPs...) {
		if containsAddr(kept, ip) {
			continue
		}
		if err := o.cache.DeleteRemoteNode(p.Name, ip); err != nil {
			errs = append(errs, fmt.Errorf("ipcache: withdraw remote node %s %s: %w", p.Name, ip, err))
			kept = append(kept, ip)
		}
	}
	if len(kept) == 0 {
		delete(o.published, p.Name)
	} else {
		o.published[p.Name] = kept
	}
	return errors.Join(errs...)
}

func (o *peerOps) Prune(context.Context, statedb.ReadTxn, iter.Seq2[*Peer, statedb.Revision]) error {
	return nil
}

func containsAddr(xs []netip.Addr, x netip.Addr) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// routeOps write the routes table to the kernel, and prune the routes of
// RouteProtocol that no object backs: routes of peers that went while the
// agent was down.
func routeOps(backend RouteBackend, log *slog.Logger) reconcile.PrefixOps[*Route] {
	return reconcile.PrefixOps[*Route]{
		Prefix: func(r *Route) netip.Prefix { return r.Prefix },
		Kernel: reconcile.PrefixKernel[*Route]{
			Put:    func(dst netip.Prefix, r *Route) error { return backend.Replace(dst, r.NextHop) },
			Delete: backend.Delete,
			// The backend's error says what it listed.
			List: func() (iter.Seq2[netip.Prefix, []any], error) {
				have, err := backend.List()
				if err != nil {
					return nil, err
				}
				return func(yield func(netip.Prefix, []any) bool) {
					for dst, via := range have {
						if !yield(dst, []any{"via", via}) {
							return
						}
					}
				}, nil
			},
		},
		Entry: "route",
		Pruned: func(gone []reconcile.Stale) {
			for _, s := range gone {
				log.Info("Pruned a stale route to a node's pod CIDR", append([]any{"prefix", s.Prefix}, s.Attrs...)...)
			}
		},
	}
}

// NetlinkRoutes is the RouteBackend over a netlink handle of the network
// namespace to route in. Handle is called at each operation: the agent's
// handle is opened by a start step that runs after the reconciler is
// registered.
type NetlinkRoutes struct {
	Handle func() *netlink.Handle
	// Device, when set, routes the pod CIDRs to this device instead of
	// via the peer's address: the tunnel routing mode's device
	// (pkg/agent/tunnel), whose program encapsulates to the peer, so the
	// underlay needs no route to any pod CIDR. Looked up by name at each
	// operation (the device may be created after the reconciler starts:
	// the route then fails and is retried).
	Device string
}

// Replace implements RouteBackend.
func (n NetlinkRoutes) Replace(dst netip.Prefix, via netip.Addr) error {
	r := &netlink.Route{Dst: prefixNet(dst), Gw: net.IP(via.AsSlice()), Protocol: RouteProtocol, Table: unix.RT_TABLE_MAIN}
	if n.Device != "" {
		l, err := n.Handle().LinkByName(n.Device)
		if err != nil {
			return fmt.Errorf("route %s to device %s: %w", dst, n.Device, err)
		}
		r.Gw, r.LinkIndex, r.Scope = nil, l.Attrs().Index, netlink.SCOPE_LINK
		// The host's own packets to the peer's pods leave from the
		// address this node reaches the peer's node with: the address
		// the peer knows as this node's. The device has no address of
		// its own, so without one IPv6's source selection took the
		// longest matching prefix, the router address inside this
		// node's pod CIDR, which no other node knows: the peer dropped
		// the replies (no tunnel endpoint for it), and the IPv6 health
		// probes to its health endpoint failed.
		src, err := n.sourceTowards(via)
		if err != nil {
			return fmt.Errorf("route %s to device %s: %w", dst, n.Device, err)
		}
		r.Src = src.AsSlice()
	}
	if err := n.Handle().RouteReplace(r); err != nil {
		return fmt.Errorf("route %s via %s: %w", dst, via, err)
	}
	return nil
}

// sourceTowards is the source address the kernel picks for a packet to
// addr (the peer's node address) by the underlay's routes.
func (n NetlinkRoutes) sourceTowards(addr netip.Addr) (netip.Addr, error) {
	routes, err := n.Handle().RouteGet(net.IP(addr.AsSlice()))
	if err != nil {
		return netip.Addr{}, fmt.Errorf("source address towards %s: %w", addr, err)
	}
	for _, r := range routes {
		if src, ok := netip.AddrFromSlice(r.Src); ok && src.IsValid() && !src.IsUnspecified() {
			return src.Unmap(), nil
		}
	}
	return netip.Addr{}, fmt.Errorf("source address towards %s: the kernel names none", addr)
}

// Delete implements RouteBackend.
func (n NetlinkRoutes) Delete(dst netip.Prefix) error {
	r := &netlink.Route{Dst: prefixNet(dst), Protocol: RouteProtocol, Table: unix.RT_TABLE_MAIN}
	if err := n.Handle().RouteDel(r); err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("delete route %s: %w", dst, err)
	}
	return nil
}

// List implements RouteBackend.
func (n NetlinkRoutes) List() (map[netip.Prefix]netip.Addr, error) {
	routes, err := linux.RoutesByProtocol(n.Handle(), RouteProtocol)
	if err != nil {
		return nil, fmt.Errorf("list node routes: %w", err)
	}
	out := map[netip.Prefix]netip.Addr{}
	for _, r := range routes {
		if r.Dst == nil {
			continue
		}
		dst, ok := netipPrefix(r.Dst)
		if !ok {
			continue
		}
		via, _ := netip.AddrFromSlice(r.Gw)
		out[dst] = via.Unmap()
	}
	return out, nil
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
