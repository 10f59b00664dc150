package bgpcp

import (
	"github.com/spf13/pflag"
)

// Config is the BGP control plane's configuration (the flag is Cilium's).
type Config struct {
	// EnableBGPControlPlane runs a BGP speaker on the node, configured
	// by the TendrilBGPClusterConfigs that select it.
	EnableBGPControlPlane bool `mapstructure:"enable-bgp-control-plane"`
}

// DefaultConfig returns the defaults: off.
func DefaultConfig() Config { return Config{} }

// Flags registers the options, with c's values as defaults.
func (c Config) Flags(fs *pflag.FlagSet) {
	fs.Bool("enable-bgp-control-plane", c.EnableBGPControlPlane,
		"Run a BGP speaker that announces this node's pod CIDRs and its Services' LoadBalancer addresses (from TendrilLoadBalancerIPPools) to the peers of the TendrilBGPClusterConfig selecting the node (needs Kubernetes)")
}
