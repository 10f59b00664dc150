package wireguard

import (
	"fmt"
	"net"
	"net/netip"
	"slices"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// Client is the part of wgctrl's client the configuration uses (a fake in
// the agent's tests).
type Client interface {
	Device(name string) (*wgtypes.Device, error)
	ConfigureDevice(name string, cfg wgtypes.Config) error
}

// Peer is one other node as the device needs it.
type Peer struct {
	// Node names the peer (logs, status).
	Node      string
	PublicKey wgtypes.Key
	// Endpoint is the node's address and WireGuard port.
	Endpoint netip.AddrPort
	// AllowedIPs are the inner addresses the peer may send from and that
	// are sent to it: its pod CIDRs (and its addresses with
	// --wireguard-encrypt-node).
	AllowedIPs []netip.Prefix
	// Addresses are the node's own addresses (in AllowedIPs too): with
	// --wireguard-encrypt-node this node's traffic to them is routed
	// through the device (NodeRoutes).
	Addresses []netip.Addr
}

// Configure makes device name hold key, port, the firewall mark of its
// UDP socket (NodeMark with --wireguard-encrypt-node, else 0) and exactly
// peers, by the
// difference with what it holds: a peer whose key, endpoint and allowed
// IPs are unchanged is not touched (its session and counters stay), a
// changed one is updated in place (allowed IPs replaced), a peer no
// longer wanted is removed. Replacing every peer each time would drop the
// sessions and make every node handshake again. It returns whether it
// changed anything.
func Configure(c Client, name string, key wgtypes.Key, port, mark int, peers []Peer) (bool, error) {
	cur, err := c.Device(name)
	if err != nil {
		return false, fmt.Errorf("wireguard device %s: %w", name, err)
	}
	var cfg wgtypes.Config
	if cur.PrivateKey != key {
		cfg.PrivateKey = &key
	}
	if cur.ListenPort != port {
		cfg.ListenPort = &port
	}
	if cur.FirewallMark != mark {
		cfg.FirewallMark = &mark
	}
	have := make(map[wgtypes.Key]wgtypes.Peer, len(cur.Peers))
	for _, p := range cur.Peers {
		have[p.PublicKey] = p
	}
	want := make(map[wgtypes.Key]bool, len(peers))
	for _, p := range peers {
		want[p.PublicKey] = true
		if h, ok := have[p.PublicKey]; ok && samePeer(h, p) {
			continue
		}
		ep := net.UDPAddrFromAddrPort(p.Endpoint)
		pc := wgtypes.PeerConfig{PublicKey: p.PublicKey, Endpoint: ep, ReplaceAllowedIPs: true}
		for _, a := range p.AllowedIPs {
			pc.AllowedIPs = append(pc.AllowedIPs, prefixNet(a))
		}
		cfg.Peers = append(cfg.Peers, pc)
	}
	for k := range have {
		if !want[k] {
			cfg.Peers = append(cfg.Peers, wgtypes.PeerConfig{PublicKey: k, Remove: true})
		}
	}
	if cfg.PrivateKey == nil && cfg.ListenPort == nil && cfg.FirewallMark == nil && len(cfg.Peers) == 0 {
		return false, nil
	}
	if err := c.ConfigureDevice(name, cfg); err != nil {
		return false, fmt.Errorf("configure wireguard device %s: %w", name, err)
	}
	return true, nil
}

func samePeer(h wgtypes.Peer, p Peer) bool {
	if h.Endpoint == nil || h.Endpoint.AddrPort() != p.Endpoint {
		// wgctrl reads an IPv4 endpoint as an IPv4-mapped address or a
		// plain one depending on the device: compare unmapped.
		if h.Endpoint == nil {
			return false
		}
		ap := h.Endpoint.AddrPort()
		if netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()) != p.Endpoint {
			return false
		}
	}
	got := make([]netip.Prefix, 0, len(h.AllowedIPs))
	for _, n := range h.AllowedIPs {
		a, _ := netip.AddrFromSlice(n.IP)
		ones, _ := n.Mask.Size()
		got = append(got, netip.PrefixFrom(a.Unmap(), ones))
	}
	wantIPs := slices.Clone(p.AllowedIPs)
	cmpPrefix := func(a, b netip.Prefix) int {
		if c := a.Addr().Compare(b.Addr()); c != 0 {
			return c
		}
		return a.Bits() - b.Bits()
	}
	slices.SortFunc(got, cmpPrefix)
	slices.SortFunc(wantIPs, cmpPrefix)
	return slices.Equal(got, wantIPs)
}

func prefixNet(p netip.Prefix) net.IPNet {
	bits := 32
	if p.Addr().Is6() {
		bits = 128
	}
	return net.IPNet{IP: p.Masked().Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), bits)}
}
