package hostdev

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/spf13/pflag"

	"github.com/tendril-net/tendril/pkg/option"
)

// Config is the host device programs' and masquerade's configuration.
type Config struct {
	// EnableMasquerade translates the source of pod traffic leaving the
	// node for outside the cluster to the node's address (on by default,
	// as Cilium's --enable-ipv4-masquerade: without it a pod cannot reach
	// a network that has no route to the pod CIDRs).
	EnableMasquerade bool
	// EnableNodePort serves NodePort, externalIP and load-balancer
	// frontends to clients outside the cluster in the host programs (on
	// by default; Cilium's --enable-node-port). The host programs attach
	// to the devices when masquerade or this needs them.
	EnableNodePort bool
	// Devices are the uplinks the host programs attach to; empty: the
	// devices of the default routes.
	Devices []string
	// NonMasqueradeCIDRs are destinations that keep the pod's address,
	// besides the cluster's pod CIDRs and every address the ipcache knows
	// as a pod's or a node's.
	NonMasqueradeCIDRs []string
	// MasqueradePortRange is the source ports (ICMP echo identifiers)
	// masqueraded flows get, "MIN-MAX".
	MasqueradePortRange string
	// LBMode is how a request from outside the cluster reaches a backend
	// on another node: LBModeSNAT (the source becomes this node's
	// address, the reply comes back through here) or LBModeDSR (direct
	// server return: the client's source is kept, the frontend travels to
	// the backend's node in an IPv4 option and the reply leaves that node
	// straight to the client). Cilium's --bpf-lb-mode; every node of a
	// cluster needs the same.
	LBMode string `mapstructure:"bpf-lb-mode"`
}

// Load-balancing modes (Config.LBMode).
const (
	LBModeSNAT = "snat"
	LBModeDSR  = "dsr"
)

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	return Config{EnableMasquerade: true, EnableNodePort: true, MasqueradePortRange: "61000-65535", LBMode: LBModeSNAT}
}

// Flags registers the options, with c's values as defaults.
func (c Config) Flags(fs *pflag.FlagSet) {
	fs.Bool("enable-masquerade", c.EnableMasquerade,
		"Masquerade pod traffic leaving the node for outside the cluster to the node's address, in eBPF at the --devices")
	fs.Bool("enable-node-port", c.EnableNodePort,
		"Serve NodePort, externalIP and load-balancer frontends to clients outside the cluster, in eBPF at the --devices")
	fs.StringSlice("devices", c.Devices,
		"Uplink devices the host programs (masquerade, services from outside, L2 announcements) attach to (default: with --kubeconfig the devices of the default routes; without, none)")
	fs.StringSlice("non-masquerade-cidrs", c.NonMasqueradeCIDRs,
		"Destinations pod traffic keeps its address to, besides the cluster's pod CIDRs and known pod and node addresses")
	fs.String("masquerade-port-range", c.MasqueradePortRange,
		"Source ports masqueraded flows get, MIN-MAX (reserved from the host's ephemeral ports)")
	fs.String("bpf-lb-mode", c.LBMode,
		"How a request from outside reaches a backend on another node: snat (source NATed to this node, replies back through it) or dsr (direct server return: client source kept, replies leave the backend's node; IPv4, every node the same)")
}

// validate is Validate, marked as a configuration error.
func (c Config) validate() error { return option.Invalid(c.Validate()) }

// Validate checks the values; each error names its option.
func (c Config) Validate() error {
	var errs []error
	if _, _, err := c.PortRange(); err != nil {
		errs = append(errs, err)
	}
	if _, err := c.NonMasqueradePrefixes(); err != nil {
		errs = append(errs, err)
	}
	if _, err := c.DSR(); err != nil {
		errs = append(errs, err)
	}
	for _, d := range c.Devices {
		if d == "" || strings.ContainsAny(d, " /") {
			errs = append(errs, fmt.Errorf("devices: %q is not a device name", d))
		}
	}
	return errors.Join(errs...)
}

// PortRange parses MasqueradePortRange.
func (c Config) PortRange() (min, max uint16, err error) {
	lo, hi, ok := strings.Cut(c.MasqueradePortRange, "-")
	a, err1 := strconv.ParseUint(strings.TrimSpace(lo), 10, 16)
	b, err2 := strconv.ParseUint(strings.TrimSpace(hi), 10, 16)
	if !ok || err1 != nil || err2 != nil || a < 1024 || b < a {
		return 0, 0, fmt.Errorf("masquerade-port-range %q: want MIN-MAX with 1024 <= MIN <= MAX <= 65535", c.MasqueradePortRange)
	}
	return uint16(a), uint16(b), nil
}

// HostPrograms reports whether the host device programs attach: for
// masquerade, for services from outside, or both.
func (c Config) HostPrograms() bool { return c.EnableMasquerade || c.EnableNodePort }

// DSR parses LBMode: whether remote backends are reached by direct
// server return.
func (c Config) DSR() (bool, error) {
	switch c.LBMode {
	case LBModeSNAT:
		return false, nil
	case LBModeDSR:
		return true, nil
	}
	return false, fmt.Errorf("bpf-lb-mode %q: want %s or %s", c.LBMode, LBModeSNAT, LBModeDSR)
}

// NonMasqueradePrefixes parses NonMasqueradeCIDRs.
func (c Config) NonMasqueradePrefixes() ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, s := range c.NonMasqueradeCIDRs {
		p, err := netip.ParsePrefix(strings.TrimSpace(s))
		if err != nil {
			return nil, fmt.Errorf("non-masquerade-cidrs: %w", err)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}
