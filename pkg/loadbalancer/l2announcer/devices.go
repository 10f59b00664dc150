package l2announcer

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
)

// ReadDevices reads the named devices' index, MAC and IPv4 subnets from
// the caller's network namespace; a device that is gone is skipped (the
// host programs' device list is read at the agent's start).
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
		out = append(out, d)
	}
	return out, nil
}
