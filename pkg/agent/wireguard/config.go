package wireguard

import (
	"errors"
	"fmt"

	"github.com/spf13/pflag"

	"github.com/tendril-net/tendril/pkg/agent/tunnel"
	dpwg "github.com/tendril-net/tendril/pkg/datapath/wireguard"
	"github.com/tendril-net/tendril/pkg/lifecycle"
	"github.com/tendril-net/tendril/pkg/option"
)

// Config is the encryption's configuration; the fields match the flag
// names.
type Config struct {
	// EnableWireguard encrypts pod traffic between nodes.
	EnableWireguard bool
	// WireguardStrict drops pod traffic to a remote node's pod CIDR that
	// would leave unencrypted (in the datapath: bpf/lib/encrypt.h).
	WireguardStrict bool
	// WireguardEncryptNode encrypts the nodes' own traffic to each other
	// too: the peers' node addresses routed through the device
	// (dpwg.NodeRoutes).
	WireguardEncryptNode bool
	// WireguardPort is the device's UDP port, the same on every node.
	WireguardPort uint16
	// WireguardDevice is the device's name. The userspace device's
	// control socket is /var/run/wireguard/<name>.sock, one per file
	// system: agents sharing one (the lab's nodes) need a name each.
	WireguardDevice string
	// WireguardDeviceExternal: the userspace device runs in a process
	// the agent does not start (the chart's wireguard-device container,
	// which the runtime does not restart with the agent's), so the agent
	// waits for it to answer instead of spawning one.
	WireguardDeviceExternal bool
}

// DefaultConfig: off, Cilium's port.
func DefaultConfig() Config {
	return Config{WireguardPort: dpwg.DefaultPort, WireguardDevice: dpwg.DefaultDevice}
}

// Flags registers the options, with c's values as defaults.
func (c Config) Flags(fs *pflag.FlagSet) {
	fs.Bool("enable-wireguard", c.EnableWireguard,
		"Encrypt pod traffic between nodes with WireGuard (the kernel's device, or the userspace implementation where the kernel has no module)")
	fs.Bool("wireguard-strict", c.WireguardStrict, "Drop pod traffic to another node's pod CIDR that would leave unencrypted (a route not through the WireGuard device, a node without a key)")
	fs.Bool("wireguard-encrypt-node", c.WireguardEncryptNode, "Encrypt the nodes' own traffic between them too (routed through the WireGuard device, except the device's own datagrams)")
	fs.Uint16("wireguard-port", c.WireguardPort, "UDP port of the WireGuard device, the same on every node")
	fs.String("wireguard-device", c.WireguardDevice, "Name of the WireGuard device")
	fs.Bool("wireguard-device-external", c.WireguardDeviceExternal,
		"The userspace WireGuard device is run by another process (the chart's wireguard-device container): wait for it to answer instead of starting one")
}

// validate is Validate, marked as a configuration error.
func (c Config) validate(t tunnel.Config) (lifecycle.Invoked, error) {
	return lifecycle.Invoked{}, option.Invalid(c.Validate(t))
}

// Validate checks the values against each other and the routing mode;
// each error names its option.
func (c Config) Validate(t tunnel.Config) error {
	var errs []error
	if c.WireguardPort == 0 {
		errs = append(errs, errors.New("wireguard-port: must not be 0"))
	}
	if n := len(c.WireguardDevice); n == 0 || n > 15 {
		errs = append(errs, fmt.Errorf("wireguard-device %q: must be 1 to 15 characters (a Linux interface name)", c.WireguardDevice))
	}
	if !c.EnableWireguard {
		if c.WireguardStrict || c.WireguardEncryptNode || c.WireguardDeviceExternal {
			errs = append(errs, errors.New("wireguard-strict, wireguard-encrypt-node and wireguard-device-external need enable-wireguard"))
		}
		return errors.Join(errs...)
	}
	return errors.Join(errs...)
}
