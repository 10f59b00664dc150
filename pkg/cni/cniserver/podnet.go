package cniserver

import (
	"errors"
	"fmt"
	"log/slog"
	"net"

	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// podLink is the pod side of a veth pair as created.
type podLink struct {
	mac   net.HardwareAddr
	index int
	mtu   int
}

// podHandle opens a routing-netlink handle inside the pod's namespace, so no
// thread has to switch namespaces to configure the pod. Only
// NETLINK_ROUTE: each socket of a handle costs two namespace switches of a
// locked thread to open.
func podHandle(podNS ns.NetNS) (*netlink.Handle, error) {
	h, err := netlink.NewHandleAt(netns.NsHandle(podNS.Fd()), unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("netlink handle in %s: %w", podNS.Path(), err)
	}
	return h, nil
}

// createVeth creates the pair in one request: hostName in the node's
// namespace (nl) and its peer, already named ifname, inside the pod's (ph).
// Creating the peer in place (rather than moving and renaming it) leaves no
// half-moved device behind when something fails. The common path is a
// single request with no look-ups before it: every request waits for the
// kernel's routing-netlink lock, which 50 concurrent ADDs share.
func createVeth(nl, ph *netlink.Handle, hostName, ifname string, mtu int, podNS ns.NetNS, log *slog.Logger) (netlink.Link, *podLink, error) {
	la := netlink.NewLinkAttrs()
	la.Name = hostName
	if mtu > 0 {
		la.MTU = mtu
	}
	veth := &netlink.Veth{LinkAttrs: la, PeerName: ifname, PeerNamespace: netlink.NsFd(int(podNS.Fd()))}
	if mtu > 0 {
		veth.PeerMTU = uint32(mtu)
	}
	err := nl.LinkAdd(veth)
	if errors.Is(err, unix.EEXIST) {
		// A veth left by an ADD of this attachment that was never followed
		// by DEL (the runtime asks again): removing its host side removes
		// its pod side too; start from a clean slate.
		log.Info("Removing leftover veth of this attachment", "interface", hostName)
		if derr := deleteLink(nl, hostName); derr != nil {
			return nil, nil, fmt.Errorf("remove leftover host veth: %w", derr)
		}
		err = nl.LinkAdd(veth)
		if errors.Is(err, unix.EEXIST) {
			if _, perr := ph.LinkByName(ifname); perr == nil {
				return nil, nil, fmt.Errorf("interface %s already exists in %s and is not this plugin's", ifname, podNS.Path())
			}
		}
	}
	if err != nil {
		return nil, nil, fmt.Errorf("add veth %s (peer %s in %s): %w", hostName, ifname, podNS.Path(), err)
	}
	host, err := nl.LinkByName(hostName)
	if err != nil {
		return nil, nil, fmt.Errorf("look up %s: %w", hostName, err)
	}
	peer, err := ph.LinkByName(ifname)
	if err != nil {
		return host, nil, fmt.Errorf("look up %s in %s: %w", ifname, podNS.Path(), err)
	}
	return host, &podLink{mac: peer.Attrs().HardwareAddr, index: peer.Attrs().Index, mtu: peer.Attrs().MTU}, nil
}

// configurePod sets up the pod's side through ph: loopback up, the
// interface up, the pod addresses as /32 and /128, a permanent neighbor
// entry for each router address pointing at the host veth's MAC (so the pod
// needs no ARP or NDP answer for an address that is not on the veth), a
// link route to the router address and, with defaultRoute, the default
// route through it. A second attachment of a container gets no default
// route: it would take the pod's traffic away from the first.
func configurePod(ph *netlink.Handle, ifname string, a *addresses, hostMAC net.HardwareAddr, pod *podLink, defaultRoute bool) error {
	lo, err := ph.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("look up lo: %w", err)
	}
	if err := ph.LinkSetUp(lo); err != nil {
		return fmt.Errorf("set lo up: %w", err)
	}
	// The index is known: no look-up before the change.
	link := &netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: pod.index, Name: ifname}}
	if err := ph.LinkSetUp(link); err != nil {
		return fmt.Errorf("set %s up: %w", ifname, err)
	}
	for _, f := range a.families() {
		addr := &netlink.Addr{IPNet: &net.IPNet{IP: f.ip, Mask: net.CIDRMask(f.bits, f.bits)}}
		if f.family == unix.AF_INET6 {
			// Without NODAD the address stays tentative for about a
			// second and cannot be a source address yet.
			addr.Flags = unix.IFA_F_NODAD
		}
		if err := ph.AddrAdd(link, addr); err != nil {
			return fmt.Errorf("add %s to %s: %w", addr.IPNet, ifname, err)
		}
		neigh := &netlink.Neigh{LinkIndex: pod.index, Family: f.family, State: netlink.NUD_PERMANENT, IP: f.router, HardwareAddr: hostMAC}
		if err := ph.NeighSet(neigh); err != nil {
			return fmt.Errorf("neighbor %s -> %s on %s: %w", f.router, hostMAC, ifname, err)
		}
		routes := []*netlink.Route{{LinkIndex: pod.index, Dst: &net.IPNet{IP: f.router, Mask: net.CIDRMask(f.bits, f.bits)}, Scope: netlink.SCOPE_LINK}}
		if defaultRoute {
			routes = append(routes, &netlink.Route{LinkIndex: pod.index, Dst: f.zero(), Gw: f.router})
		}
		for _, r := range routes {
			if err := ph.RouteReplace(r); err != nil {
				return fmt.Errorf("route %s via %v dev %s: %w", r.Dst, r.Gw, ifname, err)
			}
		}
	}
	return nil
}

// checkPod verifies the pod side against the result of ADD.
func checkPod(ph *netlink.Handle, ifname string, prev *current.Result) error {
	link, err := ph.LinkByName(ifname)
	if err != nil {
		return fmt.Errorf("interface %s: %w", ifname, err)
	}
	if link.Attrs().Flags&net.FlagUp == 0 {
		return fmt.Errorf("interface %s is down", ifname)
	}
	for i, intf := range prev.Interfaces {
		if intf.Sandbox != "" && intf.Name == ifname && intf.Mac != "" && intf.Mac != link.Attrs().HardwareAddr.String() {
			return fmt.Errorf("interface %s has MAC %s, ADD reported %s (interface %d)", ifname, link.Attrs().HardwareAddr, intf.Mac, i)
		}
	}
	addrs, err := ph.AddrList(link, netlink.FAMILY_ALL)
	if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
		return fmt.Errorf("list addresses of %s: %w", ifname, err)
	}
	have := map[string]bool{}
	for _, a := range addrs {
		have[a.IPNet.String()] = true
	}
	if len(prev.IPs) == 0 {
		return errors.New("prevResult holds no addresses")
	}
	for _, ipc := range prev.IPs {
		if !have[ipc.Address.String()] {
			return fmt.Errorf("address %s missing on %s", ipc.Address.String(), ifname)
		}
	}
	routes, err := ph.RouteList(link, netlink.FAMILY_ALL)
	if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
		return fmt.Errorf("list routes of %s: %w", ifname, err)
	}
	for _, want := range prev.Routes {
		if !hasRoute(routes, want.Dst, want.GW) {
			return fmt.Errorf("route %s via %s missing in the pod", want.Dst.String(), want.GW)
		}
	}
	return nil
}

// hasRoute reports whether routes hold one to dst (via gw, when given).
func hasRoute(routes []netlink.Route, dst net.IPNet, gw net.IP) bool {
	ones, _ := dst.Mask.Size()
	for _, r := range routes {
		rOnes := 0
		if r.Dst != nil {
			rOnes, _ = r.Dst.Mask.Size()
		}
		dstMatch := (r.Dst == nil && ones == 0) || (r.Dst != nil && r.Dst.IP.Equal(dst.IP) && rOnes == ones)
		if dstMatch && (gw == nil || gw.Equal(r.Gw)) {
			return true
		}
	}
	return false
}

// deleteLink removes an interface of the node's namespace; a missing one is
// not an error.
func deleteLink(nl *netlink.Handle, name string) error {
	link, err := nl.LinkByName(name)
	var notFound netlink.LinkNotFoundError
	if errors.As(err, &notFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("look up %s: %w", name, err)
	}
	if err := nl.LinkDel(link); err != nil && !errors.Is(err, unix.ENODEV) {
		return fmt.Errorf("delete %s: %w", name, err)
	}
	return nil
}
