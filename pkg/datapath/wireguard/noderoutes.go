package wireguard

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// The node encryption's routing (--wireguard-encrypt-node): this node's
// own traffic to a peer's node address goes through the device, except
// the device's own datagrams, which go to that very address (the peer's
// endpoint) and must take the underlay. The device marks its UDP socket
// with NodeMark (the WireGuard fwmark); a first policy routing rule sends
// marked packets to the main table as before, a second sends the rest of
// what this node itself sends (iif lo: locally generated) to NodeTable,
// which holds one route per peer node address to the device. Forwarded
// packets (a pod's) take the main table: from_pod itself sends a pod's
// packets to another node's address to the device (lib/encrypt.h), and
// the other node's from_wireguard translates a NodePort reply among them
// back (docs/encryption.md).
const (
	// NodeMark is the device's firewall mark (its UDP socket's SO_MARK),
	// tested under itself as mask. No Tendril program sets skb marks.
	NodeMark = 0x5457
	// NodeTable is the routing table of the routes to the peers' node
	// addresses.
	NodeTable = 0x5457
	// NodeMarkRulePriority and NodeRulePriority are the rules': after
	// the local table's (0), so this node's own addresses stay local,
	// before main's (32766).
	NodeMarkRulePriority = 89
	NodeRulePriority     = 90
	// NodeExcludeRulePriority is the rules' that keep the API server's
	// address and port, when it sits on another node, out of the node
	// encryption ("iif lo to <addr> ipproto tcp dport <port> lookup
	// main"), before the rule to NodeTable.
	NodeExcludeRulePriority = 87
	// TunnelTable and TunnelRulePriority are the tunnel routing mode's:
	// the tunnel device's datagrams (UDP to the tunnel port, generated
	// here) to every other node's address go through the WireGuard
	// device (TunnelRoutes).
	TunnelTable        = 0x5458
	TunnelRulePriority = 88
	// NodeRouteProtocol marks the table's routes as the agent's.
	NodeRouteProtocol netlink.RouteProtocol = 0x57 // 'W'
)

// NodeRoutes keeps the rules and a table for a device, through a netlink
// handle of the agent's network namespace: NodeTable's for node
// encryption (TunnelPort 0), TunnelTable's for the tunnel's datagrams
// (TunnelRoutes).
type NodeRoutes struct {
	Handle *netlink.Handle
	Device string
	// TunnelPort, when set, makes these the tunnel's routes: the rule
	// "iif lo ipproto udp dport TunnelPort lookup TunnelTable".
	TunnelPort uint16
}

// TunnelRoutes are the routes that send the tunnel device's datagrams
// (VXLAN or Geneve to port, from this node) to the other nodes through
// the WireGuard device, so the encapsulated pod traffic leaves encrypted
// (the tunnel routing mode with encryption).
func TunnelRoutes(h *netlink.Handle, device string, port uint16) NodeRoutes {
	return NodeRoutes{Handle: h, Device: device, TunnelPort: port}
}

func (r NodeRoutes) table() int {
	if r.TunnelPort != 0 {
		return TunnelTable
	}
	return NodeTable
}

// rules are "fwmark NodeMark/NodeMark lookup main" and "iif lo lookup
// NodeTable" of a family.
func (r NodeRoutes) rules(family int) []*netlink.Rule {
	mark := netlink.NewRule()
	mark.Family = family
	mark.Priority = NodeMarkRulePriority
	mark.Table = unix.RT_TABLE_MAIN
	mark.Mark = NodeMark
	mask := uint32(NodeMark)
	mark.Mask = &mask
	local := netlink.NewRule()
	local.Family = family
	local.Priority = NodeRulePriority
	local.Table = NodeTable
	local.IifName = "lo"
	if r.TunnelPort != 0 {
		local.Priority = TunnelRulePriority
		local.Table = TunnelTable
		local.IPProto = unix.IPPROTO_UDP
		local.Dport = netlink.NewRulePortRange(r.TunnelPort, r.TunnelPort)
	}
	return []*netlink.Rule{mark, local}
}

// isOurs tells the rules apart from others at the same priorities.
func isOurs(ru netlink.Rule) bool {
	switch ru.Priority {
	case NodeMarkRulePriority:
		return ru.Table == unix.RT_TABLE_MAIN && ru.Mark == NodeMark && ru.Mask != nil && *ru.Mask == NodeMark && !ru.Invert
	case NodeRulePriority:
		return ru.Table == NodeTable && ru.IifName == "lo" && !ru.Invert
	case TunnelRulePriority:
		return ru.Table == TunnelTable && ru.IifName == "lo" && !ru.Invert
	case NodeExcludeRulePriority:
		return ru.Table == unix.RT_TABLE_MAIN && ru.IifName == "lo" && ru.Dst != nil && ru.IPProto == unix.IPPROTO_TCP &&
			ru.Dport != nil && !ru.Invert
	}
	return false
}

// ensureRules adds the rules of a family that are missing.
func (r NodeRoutes) ensureRules(family int) error {
	have, err := r.Handle.RuleList(family)
	if err != nil {
		return fmt.Errorf("list rules: %w", err)
	}
	for _, want := range r.rules(family) {
		found := false
		for _, ru := range have {
			if ru.Priority == want.Priority && isOurs(ru) {
				found = true
				break
			}
		}
		if found {
			continue
		}
		if err := r.Handle.RuleAdd(want); err != nil {
			return fmt.Errorf("add rule priority %d (table %d): %w", want.Priority, want.Table, err)
		}
	}
	return nil
}

// Sync makes the table hold exactly one route per address to the device
// (nothing removed unless prune: before the agent knows every node, an
// absent node proves nothing) and the rule of each family in use. Each
// route names as its source the address the underlay would use to reach
// that node (this node's own address there), so the inner packet's source
// is an address the peer allows this node. It returns whether it changed
// anything.
//
// exclude are TCP addresses and ports this node's traffic to which stays
// off the device (the API server's on another node): a rule each, set
// before the routes, so that the route to that node never takes them;
// the ones not named any more are removed with prune.
func (r NodeRoutes) Sync(addrs []netip.Addr, exclude []netip.AddrPort, prune bool) (bool, error) {
	link, err := r.Handle.LinkByName(r.Device)
	if err != nil {
		return false, fmt.Errorf("node routes: device %s: %w", r.Device, err)
	}
	have, err := r.routes()
	if err != nil {
		return false, err
	}
	changed, err := r.syncExclusions(exclude, prune)
	if err != nil {
		return changed, err
	}
	want := map[netip.Prefix]bool{}
	var errs []error
	families := map[int]bool{}
	for _, a := range addrs {
		a = a.Unmap()
		dst := netip.PrefixFrom(a, a.BitLen())
		want[dst] = true
		src, err := r.underlaySource(a)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		family := unix.AF_INET
		if a.Is6() {
			family = unix.AF_INET6
		}
		families[family] = true
		if h, ok := have[dst]; ok && h.LinkIndex == link.Attrs().Index && h.Src.Equal(src.AsSlice()) {
			continue
		}
		route := &netlink.Route{Dst: prefixIPNet(dst), LinkIndex: link.Attrs().Index, Src: src.AsSlice(),
			Table: r.table(), Protocol: NodeRouteProtocol, Scope: netlink.SCOPE_LINK}
		if err := r.Handle.RouteReplace(route); err != nil {
			errs = append(errs, fmt.Errorf("node route %s dev %s: %w", dst, r.Device, err))
			continue
		}
		changed = true
	}
	// The rules after the routes: a rule over an empty table falls
	// through to main, but its routes would be used at once.
	for _, f := range []int{unix.AF_INET, unix.AF_INET6} {
		if families[f] {
			if err := r.ensureRules(f); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if prune {
		for dst, h := range have {
			if want[dst] {
				continue
			}
			if err := r.Handle.RouteDel(&h); err != nil && !errors.Is(err, unix.ESRCH) {
				errs = append(errs, fmt.Errorf("remove node route %s: %w", dst, err))
				continue
			}
			changed = true
		}
	}
	return changed, errors.Join(errs...)
}

// exclusionRule is "iif lo to ap's address ipproto tcp dport ap's port
// lookup main".
func exclusionRule(ap netip.AddrPort) *netlink.Rule {
	ru := netlink.NewRule()
	ru.Family = unix.AF_INET
	if ap.Addr().Is6() {
		ru.Family = unix.AF_INET6
	}
	ru.Priority = NodeExcludeRulePriority
	ru.Table = unix.RT_TABLE_MAIN
	ru.IifName = "lo"
	ru.Dst = prefixIPNet(netip.PrefixFrom(ap.Addr(), ap.Addr().BitLen()))
	ru.IPProto = unix.IPPROTO_TCP
	ru.Dport = netlink.NewRulePortRange(ap.Port(), ap.Port())
	return ru
}

// exclusionOf is the address and port an exclusion rule names.
func exclusionOf(ru netlink.Rule) (netip.AddrPort, bool) {
	a, ok := netip.AddrFromSlice(ru.Dst.IP)
	if !ok || ru.Dport == nil {
		return netip.AddrPort{}, false
	}
	return netip.AddrPortFrom(a.Unmap(), ru.Dport.Start), true
}

// syncExclusions adds the exclusion rules missing and, with prune,
// removes those not in exclude (none in the tunnel's routes).
func (r NodeRoutes) syncExclusions(exclude []netip.AddrPort, prune bool) (bool, error) {
	if r.TunnelPort != 0 {
		return false, nil
	}
	changed := false
	have := map[netip.AddrPort]netlink.Rule{}
	for _, f := range []int{unix.AF_INET, unix.AF_INET6} {
		rules, err := r.Handle.RuleList(f)
		if err != nil {
			return false, fmt.Errorf("list rules: %w", err)
		}
		for _, ru := range rules {
			if ru.Priority != NodeExcludeRulePriority || !isOurs(ru) {
				continue
			}
			if ap, ok := exclusionOf(ru); ok {
				have[ap] = ru
			}
		}
	}
	var errs []error
	want := map[netip.AddrPort]bool{}
	for _, ap := range exclude {
		ap = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
		want[ap] = true
		if _, ok := have[ap]; ok {
			continue
		}
		if err := r.Handle.RuleAdd(exclusionRule(ap)); err != nil {
			errs = append(errs, fmt.Errorf("add the rule keeping %s off the device: %w", ap, err))
			continue
		}
		changed = true
	}
	if prune {
		for ap, ru := range have {
			if want[ap] {
				continue
			}
			if err := r.Handle.RuleDel(&ru); err != nil && !errors.Is(err, unix.ENOENT) {
				errs = append(errs, fmt.Errorf("remove the rule keeping %s off the device: %w", ap, err))
				continue
			}
			changed = true
		}
	}
	return changed, errors.Join(errs...)
}

// underlaySource is the source address the main table picks towards a,
// asked with the device's mark (the path its datagrams take).
func (r NodeRoutes) underlaySource(a netip.Addr) (netip.Addr, error) {
	rs, err := r.Handle.RouteGetWithOptions(a.AsSlice(), &netlink.RouteGetOptions{Mark: NodeMark})
	if err != nil || len(rs) == 0 {
		return netip.Addr{}, fmt.Errorf("node route %s: no underlay route: %v", a, err)
	}
	src, ok := netip.AddrFromSlice(rs[0].Src)
	if !ok {
		return netip.Addr{}, fmt.Errorf("node route %s: the underlay route has no source address", a)
	}
	return src.Unmap(), nil
}

// routes are the table's routes, by destination.
func (r NodeRoutes) routes() (map[netip.Prefix]netlink.Route, error) {
	out := map[netip.Prefix]netlink.Route{}
	rs, err := r.Handle.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: r.table()}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return nil, fmt.Errorf("list node routes: %w", err)
	}
	for _, rt := range rs {
		if rt.Dst == nil {
			continue
		}
		a, ok := netip.AddrFromSlice(rt.Dst.IP)
		if !ok {
			continue
		}
		ones, _ := rt.Dst.Mask.Size()
		out[netip.PrefixFrom(a.Unmap(), ones)] = rt
	}
	return out, nil
}

// Remove deletes the rules and the table's routes (node encryption off):
// this node's traffic takes the main table again.
func (r NodeRoutes) Remove() error {
	var errs []error
	for _, f := range []int{unix.AF_INET, unix.AF_INET6} {
		rules, err := r.Handle.RuleList(f)
		if err != nil {
			errs = append(errs, fmt.Errorf("list rules: %w", err))
			continue
		}
		for _, ru := range rules {
			// The mark rule is shared by both tables' users: it goes
			// when the other's rule is not there.
			// The exclusions are node encryption's.
			exclusion := ru.Priority == NodeExcludeRulePriority && r.TunnelPort == 0
			if !isOurs(ru) || (ru.Table != r.table() && ru.Priority != NodeMarkRulePriority && !exclusion) ||
				(ru.Priority == NodeMarkRulePriority && r.otherRuleIn(rules)) {
				continue
			}
			if err := r.Handle.RuleDel(&ru); err != nil {
				errs = append(errs, fmt.Errorf("remove rule priority %d: %w", ru.Priority, err))
			}
		}
	}
	have, err := r.routes()
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	for dst, h := range have {
		if err := r.Handle.RouteDel(&h); err != nil && !errors.Is(err, unix.ESRCH) {
			errs = append(errs, fmt.Errorf("remove node route %s: %w", dst, err))
		}
	}
	return errors.Join(errs...)
}

// otherRuleIn tells whether the other table's rule is among rules.
func (r NodeRoutes) otherRuleIn(rules []netlink.Rule) bool {
	for _, ru := range rules {
		if isOurs(ru) && ru.Priority != NodeMarkRulePriority && ru.Priority != NodeExcludeRulePriority && ru.Table != r.table() {
			return true
		}
	}
	return false
}

// NodeAddresses are the peers' node addresses to route through the device,
// sorted, without duplicates.
func NodeAddresses(peers []Peer) []netip.Addr {
	var out []netip.Addr
	for _, p := range peers {
		out = append(out, p.Addresses...)
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out)
}

func prefixIPNet(p netip.Prefix) *net.IPNet {
	n := prefixNet(p)
	return &n
}
