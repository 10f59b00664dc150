package tunnel

import (
	"log/slog"
	"net/netip"

	"github.com/vishvananda/netlink"
)

// Underlay6 is true when the node's tunnel underlay is IPv6: its peers
// reach it (and it them) at IPv6 addresses, so the encapsulation's outer
// header is IPv6, 20 bytes longer (the pods' and the carrier's MTU are
// 20 lower). The ipcache's tunnel endpoint of each node decides the
// outer family per packet in the datapath; this decides only the MTU.
type Underlay6 bool

// underlay decides Underlay6 once, when the agent starts, from the host's
// addresses (detectUnderlay6). In native routing it is false (no
// encapsulation); a host whose addresses cannot be read keeps the IPv4
// MTU, logged.
func underlay(c Config, log *slog.Logger) Underlay6 {
	if !c.Tunneling() {
		return false
	}
	addrs, err := netlink.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		log.Warn("Cannot read the host's addresses: assuming an IPv4 tunnel underlay", "error", err)
		return false
	}
	ips := make([]netip.Addr, 0, len(addrs))
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			ips = append(ips, ip.Unmap())
		}
	}
	u := detectUnderlay6(ips)
	log.Info("Tunnel underlay", "ipv6", u)
	return Underlay6(u)
}

// detectUnderlay6 is true when addrs (the host's) hold a global IPv6
// address and no global IPv4 one: a node with both is reached over IPv4,
// as the nodes' tunnel endpoints are then (the IPv4 address first). A
// global address is a unicast one outside loopback and link-local, ULA
// and RFC 1918 addresses included (a cluster's underlay mostly is one).
func detectUnderlay6(addrs []netip.Addr) bool {
	has6 := false
	for _, a := range addrs {
		if !a.IsGlobalUnicast() {
			continue
		}
		if a.Is4() || a.Is4In6() {
			return false
		}
		has6 = true
	}
	return has6
}
