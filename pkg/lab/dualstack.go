package lab

import (
	"fmt"
	"net"
	"os"
	"strconv"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/tendril-net/tendril/pkg/controlplane"
)

// IP families of a lab (lab up --ip-family). With IPFamilyDual every node,
// the world and (routed topology) the world's router side get an IPv6
// address beside their IPv4 one, kube-controller-manager hands each Node
// an IPv6 pod CIDR beside its IPv4 one, the API server has an IPv6
// service CIDR, and the agents take both: the pods get an address of each
// family. The underlay between the nodes stays IPv4 for the tunnel
// (VXLAN over the nodes' IPv4 addresses carries IPv6 pod packets too);
// native routing routes each IPv6 pod CIDR via the peer's IPv6 address.
const (
	IPFamilyIPv4 = "ipv4"
	IPFamilyDual = "dual"
)

// The lab's IPv6 addressing, unique local addresses (RFC 4193) for what
// is the cluster's and documentation addresses (RFC 3849) for the world.
const (
	// NodeSubnet6Prefix: flat topology, node N at NodeSubnet6Prefix+(10+N)
	// (the digits read as hex), the world's gateway at
	// NodeSubnet6Prefix+"1", all in one /64.
	NodeSubnet6Prefix = "fd00:172:30::"
	NodeSubnet6Bits   = 64
	// routedSubnet6Prefix: routed topology, node N alone in
	// routedSubnet6Prefix+N+"::/64" at ::11, the world at ::1.
	routedSubnet6Prefix = "fd00:172:30:"
	// ClusterCIDR6 is what node IPAM splits into a /64 per node.
	ClusterCIDR6 = "fd00:10:244::/56"
	podCIDR6Bits = 64
	// ServiceCIDR6 is the API server's IPv6 service CIDR (a /112: the
	// API server refuses an IPv6 service range wider than /108).
	ServiceCIDR6 = "fd00:10:96::/112"
	// WorldGateway6 is the world's IPv6 address on the lab bridge (flat).
	WorldGateway6 = NodeSubnet6Prefix + "1"
	// WorldServerIP6 and WorldClientIP6 are the world's server and client
	// in IPv6 (the server answers on WorldServerPorts there too).
	WorldServerIP6 = "2001:db8:100::1"
	WorldClientIP6 = "2001:db8:100::2"
)

// ValidateIPFamily checks lab up's --ip-family ("" is IPFamilyIPv4).
func ValidateIPFamily(f string) error {
	switch f {
	case "", IPFamilyIPv4, IPFamilyDual:
		return nil
	}
	return fmt.Errorf("--ip-family %q: must be %s or %s", f, IPFamilyIPv4, IPFamilyDual)
}

// Dual reports whether the lab is dual stack.
func (s *State) Dual() bool { return s.IPFamily == IPFamilyDual }

// nodeAddressing6 is node i's (from 1) IPv6 address and gateway.
func nodeAddressing6(topology string, i int) (address, gateway string) {
	if topology == TopologyRouted {
		sub := routedSubnet6Prefix + strconv.Itoa(i) + "::"
		return sub + "11", sub + "1"
	}
	return NodeSubnet6Prefix + strconv.Itoa(10+i), WorldGateway6
}

// addr6 is an IPv6 address with its prefix length, without duplicate
// address detection: the lab's addresses are its own to give, and an
// address left tentative for a second would fail the first packets.
func addr6(ip string, bits int) *netlink.Addr {
	return &netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP(ip), Mask: net.CIDRMask(bits, 128)}, Flags: unix.IFA_F_NODAD}
}

// addNodeIPv6 gives a dual-stack lab's node its IPv6 address on eth0 and
// its IPv6 default route via the world.
func addNodeIPv6(n Node) error {
	h, err := handleAt(n.Netns)
	if err != nil {
		return err
	}
	defer h.Close()
	eth0, err := h.LinkByName("eth0")
	if err != nil {
		return fmt.Errorf("%s: eth0: %w", n.Netns, err)
	}
	if err := h.AddrAdd(eth0, addr6(n.Address6, NodeSubnet6Bits)); err != nil {
		return fmt.Errorf("%s: address %s on eth0: %w", n.Netns, n.Address6, err)
	}
	r := &netlink.Route{LinkIndex: eth0.Attrs().Index, Gw: net.ParseIP(n.Gateway6), Family: netlink.FAMILY_V6}
	if err := h.RouteReplace(r); err != nil {
		return fmt.Errorf("%s: IPv6 default route via %s: %w", n.Netns, n.Gateway6, err)
	}
	return nil
}

// addWorldIPv6 gives a dual-stack lab's world its IPv6 addresses: the
// gateway of each node's IPv6 subnet on eth0 (one, the flat topology's,
// or one per node, the routed topology's: then it forwards IPv6 between
// them, as it does IPv4), the server's and client's on its loopback.
func addWorldIPv6(w *World, nodes []Node) error {
	h, err := handleAt(w.Netns)
	if err != nil {
		return err
	}
	defer h.Close()
	eth0, err := h.LinkByName("eth0")
	if err != nil {
		return fmt.Errorf("%s: eth0: %w", w.Netns, err)
	}
	gws := map[string]bool{}
	for _, n := range nodes {
		if gws[n.Gateway6] {
			continue
		}
		gws[n.Gateway6] = true
		if err := h.AddrAdd(eth0, addr6(n.Gateway6, NodeSubnet6Bits)); err != nil {
			return fmt.Errorf("%s: address %s on eth0: %w", w.Netns, n.Gateway6, err)
		}
	}
	lo, err := h.LinkByName(WorldDevice)
	if err != nil {
		return fmt.Errorf("%s: %s: %w", w.Netns, WorldDevice, err)
	}
	for _, ip := range []string{w.ServerIP6, w.ClientIP6} {
		if err := h.AddrAdd(lo, addr6(ip, 128)); err != nil {
			return fmt.Errorf("%s: address %s on %s: %w", w.Netns, ip, WorldDevice, err)
		}
	}
	if len(gws) < 2 {
		return nil
	}
	return InNetns(NetnsPath(w.Netns), func() error {
		if err := os.WriteFile("/proc/sys/net/ipv6/conf/all/forwarding", []byte("1"), 0o644); err != nil {
			return fmt.Errorf("%s: IPv6 forwarding: %w", w.Netns, err)
		}
		return nil
	})
}

// serviceCIDRs are the API server's service CIDRs, comma-separated.
func serviceCIDRs(st *State) string {
	if st.Dual() {
		return controlplane.ServiceCIDR + "," + ServiceCIDR6
	}
	return controlplane.ServiceCIDR
}
