package l2announcer

import (
	"cmp"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// defaultBits is the route's prefix length (0 for the default route).
func defaultBits(r netlink.Route) int {
	if r.Dst == nil {
		return 0
	}
	ones, _ := r.Dst.Mask.Size()
	return ones
}

// gateways are a route's IPv4 next hops (multipath ones too).
func gateways(r netlink.Route) []netip.Addr {
	var out []netip.Addr
	add := func(ip net.IP) {
		if a, ok := netip.AddrFromSlice(ip); ok && a.Unmap().Is4() && !a.IsUnspecified() {
			out = append(out, a.Unmap())
		}
	}
	add(r.Gw)
	for _, nh := range r.MultiPath {
		add(nh.Gw)
	}
	return out
}

// ReadDevices reads the named devices' index, MAC, IPv4 subnets and the
// gateways of the routes through them from the caller's network
// namespace; a device that is gone is skipped (the host programs' device
// list is read at the agent's start).
func ReadDevices(names []string) ([]Device, error) {
	var out []Device
	for _, n := range names {
		l, err := netlink.LinkByName(n)
		if err != nil {
			if errors.As(err, new(netlink.LinkNotFoundError)) {
				continue
			}
			return nil, fmt.Errorf("device %s: %w", n, err)
		}
		d := Device{Name: n, IfIndex: l.Attrs().Index, MAC: append(net.HardwareAddr(nil), l.Attrs().HardwareAddr...)}
		if len(d.MAC) != 6 {
			continue // not Ethernet: no ARP
		}
		addrs, err := netlink.AddrList(l, netlink.FAMILY_V4)
		if err != nil {
			return nil, fmt.Errorf("addresses of %s: %w", n, err)
		}
		for _, a := range addrs {
			ip, ok := netip.AddrFromSlice(a.IP)
			if !ok || a.IPNet == nil {
				continue
			}
			bits, _ := a.IPNet.Mask.Size()
			d.Prefixes = append(d.Prefixes, netip.PrefixFrom(ip.Unmap(), bits))
		}
		routes, err := netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{LinkIndex: d.IfIndex, Table: unix.RT_TABLE_UNSPEC},
			netlink.RT_FILTER_OIF|netlink.RT_FILTER_TABLE)
		if err != nil {
			return nil, fmt.Errorf("routes through %s: %w", n, err)
		}
		// The default route's next hop first: it is the one a refusal
		// names most often.
		slices.SortStableFunc(routes, func(a, b netlink.Route) int {
			return cmp.Compare(defaultBits(a), defaultBits(b))
		})
		for _, r := range routes {
			for _, gw := range gateways(r) {
				if !slices.Contains(d.Gateways, gw) {
					d.Gateways = append(d.Gateways, gw)
				}
			}
		}
		out = append(out, d)
	}
	return out, nil
}
