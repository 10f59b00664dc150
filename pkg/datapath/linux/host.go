package linux

import (
	"errors"
	"fmt"
	"log/slog"
	"net"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// HostDeviceName is the device that holds the node's router addresses.
const HostDeviceName = "tendril_host"

// HostPeerName is the other end of the host device's veth pair. A veth pair
// rather than a dummy device because kernels built without CONFIG_DUMMY
// (like the project's test machines) exist, and veth is always there for
// pods anyway.
const HostPeerName = "tendril_net"

// RouteProtocol marks the routes Tendril installs, so they can be told
// apart from routes of other owners (and listed after a restart).
const RouteProtocol netlink.RouteProtocol = 0x54 // 'T'

// Host configures one network namespace's (a node's) host networking.
type Host struct {
	handle *netlink.Handle
	sysctl Sysctl
	log    *slog.Logger
}

// NewHost works through handle (a netlink handle of the node's namespace)
// and writes sysctls in ns (the same namespace; the zero value or
// netns.None() means the caller's own).
func NewHost(handle *netlink.Handle, ns netns.NsHandle, log *slog.Logger) *Host {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Host{handle: handle, sysctl: Sysctl{NetNS: ns}, log: log}
}

// WithProcFS makes the host write its sysctls under procfs/sys instead of
// /proc/sys (Sysctl.ProcFS); it returns h.
func (h *Host) WithProcFS(procfs string) *Host {
	h.sysctl.ProcFS = procfs
	return h
}

// Sysctl returns the sysctl writer of this host's namespace.
func (h *Host) Sysctl() Sysctl { return h.sysctl }

// EnsureHostDevice creates tendril_host (a veth pair with tendril_net) when missing, puts
// routerV4/32 and routerV6/128 on it (either may be nil), removes other
// global addresses it carries (a router address of an earlier pod CIDR),
// brings it up and turns on forwarding for the families in use. It is
// idempotent: the agent calls it at every start.
func (h *Host) EnsureHostDevice(routerV4, routerV6 net.IP) (netlink.Link, error) {
	if routerV4 != nil && routerV4.To4() == nil {
		return nil, fmt.Errorf("host device: router IPv4 %s is not an IPv4 address", routerV4)
	}
	if routerV6 != nil && (routerV6.To4() != nil || routerV6.To16() == nil) {
		return nil, fmt.Errorf("host device: router IPv6 %s is not an IPv6 address", routerV6)
	}
	link, err := h.handle.LinkByName(HostDeviceName)
	var notFound netlink.LinkNotFoundError
	switch {
	case errors.As(err, &notFound):
		la := netlink.NewLinkAttrs()
		la.Name = HostDeviceName
		if err := h.handle.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: HostPeerName}); err != nil && !errors.Is(err, unix.EEXIST) {
			return nil, fmt.Errorf("create %s: %w", HostDeviceName, err)
		}
		if link, err = h.handle.LinkByName(HostDeviceName); err != nil {
			return nil, fmt.Errorf("look up %s after creating it: %w", HostDeviceName, err)
		}
		h.log.Info("Created host device", "device", HostDeviceName)
	case err != nil:
		return nil, fmt.Errorf("look up %s: %w", HostDeviceName, err)
	case link.Type() != "veth":
		return nil, fmt.Errorf("%s exists as a %s device, want veth", HostDeviceName, link.Type())
	}

	// IPv6 addresses on the device would go through duplicate address
	// detection, leaving the router address tentative (unusable as a
	// source) for a second after every start.
	if routerV6 != nil {
		if err := h.sysctl.Set("0", "net", "ipv6", "conf", HostDeviceName, "accept_dad"); err != nil {
			return nil, err
		}
	}
	// The device is the L7 hairpin's too (docs/policy-l7.md, "The node as
	// a source"): to_pod sends the node's own packets to a pod's port with
	// ingress HTTP rules to its ingress, for the proxy. Their source is a
	// local address, which the kernel drops as martian on a device that
	// does not accept local sources.
	if routerV4 != nil {
		if err := h.sysctl.Set("1", "net", "ipv4", "conf", HostDeviceName, "accept_local"); err != nil {
			return nil, err
		}
	}
	want := map[string]bool{}
	for _, ip := range []net.IP{routerV4, routerV6} {
		if ip == nil {
			continue
		}
		addr := &netlink.Addr{IPNet: hostPrefix(ip), Flags: unix.IFA_F_NODAD}
		want[addr.IPNet.String()] = true
		if err := h.handle.AddrReplace(link, addr); err != nil {
			return nil, fmt.Errorf("add router address %s to %s: %w", addr.IPNet, HostDeviceName, err)
		}
	}
	addrs, err := h.handle.AddrList(link, netlink.FAMILY_ALL)
	if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
		return nil, fmt.Errorf("list addresses of %s: %w", HostDeviceName, err)
	}
	for _, a := range addrs {
		if a.IP.IsLinkLocalUnicast() || want[a.IPNet.String()] {
			continue
		}
		if err := h.handle.AddrDel(link, &a); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) {
			return nil, fmt.Errorf("remove stale address %s from %s: %w", a.IPNet, HostDeviceName, err)
		}
		h.log.Info("Removed stale router address", "device", HostDeviceName, "address", a.IPNet)
	}
	// Both ends up, so the device has carrier and its addresses are
	// reachable as ordinary local addresses.
	peer, err := h.handle.LinkByName(HostPeerName)
	if err != nil {
		return nil, fmt.Errorf("look up %s: %w", HostPeerName, err)
	}
	for _, l := range []netlink.Link{peer, link} {
		if err := h.handle.LinkSetUp(l); err != nil {
			return nil, fmt.Errorf("set %s up: %w", l.Attrs().Name, err)
		}
	}
	if err := h.EnableForwarding(routerV4 != nil, routerV6 != nil); err != nil {
		return nil, err
	}
	return link, nil
}

// EnableForwarding turns on IP forwarding for the given families.
func (h *Host) EnableForwarding(v4, v6 bool) error {
	if v4 {
		if err := h.sysctl.Set("1", "net", "ipv4", "ip_forward"); err != nil {
			return err
		}
	}
	if v6 {
		if err := h.sysctl.Set("1", "net", "ipv6", "conf", "all", "forwarding"); err != nil {
			return err
		}
	}
	return nil
}

// ConfigureHostVeth prepares a pod's host-side veth:
//   - reverse path filtering off (the kernel uses the maximum of "all" and
//     the device's value, so this relaxes it only where "all" allows),
//     because a pod's source address is checked by the datapath;
//   - no duplicate address detection, so the veth's IPv6 link-local address
//     can be the source of neighbor solicitations for the pod at once;
//   - with routerV6, proxy NDP for the router address on the veth. IPv4
//     needs nothing: Linux answers ARP for any local address (the router
//     address on tendril_host) on every interface, but IPv6 answers
//     solicitations only for addresses of the receiving interface, and a
//     plugin that does not pin the router's neighbor entry in the pod (the
//     stock cilium-cni) relies on that answer.
func (h *Host) ConfigureHostVeth(ifname string, routerV6 net.IP) error {
	if err := h.sysctl.Set("0", "net", "ipv4", "conf", ifname, "rp_filter"); err != nil {
		return err
	}
	if err := h.sysctl.Set("0", "net", "ipv6", "conf", ifname, "accept_dad"); err != nil {
		// A kernel without IPv6 has no such file; IPv4 still works.
		h.log.Debug("Cannot turn off DAD on host veth", "interface", ifname, "error", err)
		return nil
	}
	if routerV6 == nil {
		return nil
	}
	if err := h.sysctl.Set("1", "net", "ipv6", "conf", ifname, "proxy_ndp"); err != nil {
		return err
	}
	link, err := h.handle.LinkByName(ifname)
	if err != nil {
		return fmt.Errorf("look up %s: %w", ifname, err)
	}
	proxy := &netlink.Neigh{LinkIndex: link.Attrs().Index, Family: unix.AF_INET6, Flags: netlink.NTF_PROXY, IP: routerV6}
	if err := h.handle.NeighSet(proxy); err != nil {
		return fmt.Errorf("proxy NDP for %s on %s: %w", routerV6, ifname, err)
	}
	return nil
}

// EndpointRoute returns the route of one pod address to its host-side veth.
func EndpointRoute(ip net.IP, ifindex int) *netlink.Route {
	return &netlink.Route{
		Dst:       hostPrefix(ip),
		LinkIndex: ifindex,
		Scope:     netlink.SCOPE_LINK,
		Protocol:  RouteProtocol,
		Table:     unix.RT_TABLE_MAIN,
	}
}

// UpsertEndpointRoute routes ip (as /32 or /128) to the host-side veth with
// index ifindex, replacing a route of the same prefix (an earlier pod that
// had the address).
func (h *Host) UpsertEndpointRoute(ip net.IP, ifindex int) error {
	if ip == nil {
		return fmt.Errorf("endpoint route: no address")
	}
	if ifindex <= 0 {
		return fmt.Errorf("endpoint route for %s: invalid interface index %d", ip, ifindex)
	}
	r := EndpointRoute(ip, ifindex)
	if err := h.handle.RouteReplace(r); err != nil {
		return fmt.Errorf("route %s to interface %d: %w", r.Dst, ifindex, err)
	}
	return nil
}

// DeleteEndpointRoute removes the route of ip. With ifindex > 0 only a
// route through that interface is removed (so deleting an old endpoint does
// not remove the route of a newer one that got the same address); with 0,
// any Tendril route of the prefix. A missing route is not an error: the
// kernel drops routes with their interface.
func (h *Host) DeleteEndpointRoute(ip net.IP, ifindex int) error {
	if ip == nil {
		return fmt.Errorf("delete endpoint route: no address")
	}
	routes, err := h.EndpointRoutes()
	if err != nil {
		return err
	}
	dst := hostPrefix(ip).String()
	for _, r := range routes {
		if r.Dst == nil || r.Dst.String() != dst || (ifindex > 0 && r.LinkIndex != ifindex) {
			continue
		}
		if err := h.handle.RouteDel(&r); err != nil && !errors.Is(err, unix.ESRCH) && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("delete route %s: %w", dst, err)
		}
	}
	return nil
}

// EndpointRoutes lists the routes Tendril installed (both families).
func (h *Host) EndpointRoutes() ([]netlink.Route, error) {
	routes, err := RoutesByProtocol(h.handle, RouteProtocol)
	if err != nil {
		return nil, fmt.Errorf("list endpoint routes: %w", err)
	}
	return routes, nil
}

// RoutesByProtocol lists the main table's routes of one protocol (both
// families). A dump interrupted by a concurrent change is retried: callers
// decide from the list which routes to delete.
func RoutesByProtocol(h *netlink.Handle, proto netlink.RouteProtocol) ([]netlink.Route, error) {
	filter := &netlink.Route{Protocol: proto, Table: unix.RT_TABLE_MAIN}
	var out []netlink.Route
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		var routes []netlink.Route
		var err error
		for range 5 {
			routes, err = h.RouteListFiltered(fam, filter, netlink.RT_FILTER_PROTOCOL|netlink.RT_FILTER_TABLE)
			if !errors.Is(err, netlink.ErrDumpInterrupted) {
				break
			}
		}
		if err != nil {
			return nil, err
		}
		out = append(out, routes...)
	}
	return out, nil
}

// LinkExists reports whether an interface of that name exists.
func (h *Host) LinkExists(ifname string) (bool, error) {
	_, err := h.handle.LinkByName(ifname)
	var notFound netlink.LinkNotFoundError
	switch {
	case err == nil:
		return true, nil
	case errors.As(err, &notFound):
		return false, nil
	default:
		return false, fmt.Errorf("look up interface %s: %w", ifname, err)
	}
}

// hostPrefix is ip as a single-address prefix (/32 or /128).
func hostPrefix(ip net.IP) *net.IPNet {
	if v4 := ip.To4(); v4 != nil {
		return &net.IPNet{IP: v4, Mask: net.CIDRMask(32, 32)}
	}
	return &net.IPNet{IP: ip.To16(), Mask: net.CIDRMask(128, 128)}
}

// HostPrefix is ip as a single-address prefix (/32 or /128).
func HostPrefix(ip net.IP) *net.IPNet { return hostPrefix(ip) }
