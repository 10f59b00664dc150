package tunnel

import (
	"errors"
	"fmt"

	"github.com/spf13/pflag"

	"github.com/tendril-net/tendril/pkg/datapath/tunnel"
	"github.com/tendril-net/tendril/pkg/option"
)

// Routing modes (--routing-mode), Cilium's names.
const (
	// ModeNative: the host's routes carry pod traffic between nodes (each
	// node has a route to every other node's pod CIDR via that node).
	ModeNative = "native"
	// ModeTunnel: pod traffic between nodes is encapsulated to the node that
	// owns the destination; the underlay routes only the nodes' addresses.
	ModeTunnel = "tunnel"
)

// Config is the routing mode's configuration; the fields match the flag
// names.
type Config struct {
	// RoutingMode is native or tunnel.
	RoutingMode string
	// TunnelProtocol is the encapsulation in tunnel mode: vxlan or geneve.
	TunnelProtocol string
	// TunnelPort is the tunnel device's UDP port (0: the protocol's,
	// 8472 for VXLAN, 6081 for Geneve, as Cilium).
	TunnelPort uint16
}

// DefaultConfig routes natively; tunnel mode uses VXLAN.
func DefaultConfig() Config {
	return Config{RoutingMode: ModeNative, TunnelProtocol: string(tunnel.VXLAN)}
}

// Flags registers the options, with c's values as defaults.
func (c Config) Flags(fs *pflag.FlagSet) {
	fs.String("routing-mode", c.RoutingMode,
		"How pod traffic reaches other nodes: native (routes to their pod CIDRs) or tunnel (encapsulated to the owner node, the source identity in the tunnel header)")
	fs.String("tunnel-protocol", c.TunnelProtocol, "Encapsulation of the tunnel routing mode: vxlan or geneve")
	fs.Uint16("tunnel-port", c.TunnelPort, "UDP port of the tunnel device (0: 8472 for vxlan, 6081 for geneve)")
}

// validate is Validate, marked as a configuration error.
func (c Config) validate() error { return option.Invalid(c.Validate()) }

// Validate checks the values; each error names its option. The protocol
// is checked in native mode too, so that switching modes meets no error
// first seen then.
func (c Config) Validate() error {
	var errs []error
	if c.RoutingMode != ModeNative && c.RoutingMode != ModeTunnel {
		errs = append(errs, fmt.Errorf("routing-mode %q: must be %s or %s", c.RoutingMode, ModeNative, ModeTunnel))
	}
	if p := tunnel.Protocol(c.TunnelProtocol); p != tunnel.VXLAN && p != tunnel.Geneve {
		errs = append(errs, fmt.Errorf("tunnel-protocol %q: must be %s or %s", c.TunnelProtocol, tunnel.VXLAN, tunnel.Geneve))
	}
	return errors.Join(errs...)
}

// Tunneling: pod traffic between nodes is encapsulated.
func (c Config) Tunneling() bool { return c.RoutingMode == ModeTunnel }

// Protocol is the tunnel protocol.
func (c Config) Protocol() tunnel.Protocol { return tunnel.Protocol(c.TunnelProtocol) }

// Port is the tunnel device's UDP port.
func (c Config) Port() uint16 {
	if c.TunnelPort != 0 {
		return c.TunnelPort
	}
	if c.Protocol() == tunnel.Geneve {
		return tunnel.DefaultGenevePort
	}
	return tunnel.DefaultVXLANPort
}

// Device is the tunnel device's name ("" in native routing).
func (c Config) Device() string {
	if !c.Tunneling() {
		return ""
	}
	return tunnel.DeviceName(c.Protocol())
}

// Overhead is what the encapsulation adds to a pod's packet (0 native),
// over an IPv6 underlay when underlay6.
func (c Config) Overhead(underlay6 bool) int {
	if !c.Tunneling() {
		return 0
	}
	return tunnel.Overhead(c.Protocol(), underlay6)
}
