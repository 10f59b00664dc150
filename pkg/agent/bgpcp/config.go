package bgpcp

import (
	"github.com/spf13/pflag"
)

// Config is the BGP control plane's configuration (the flag is Cilium's).
type Config struct {
	// EnableBGPControlPlane runs a BGP speaker on the node, configured
	// by the TendrilBGPClusterConfigs that select it.
	EnableBGPControlPlane bool `mapstructure:"enable-bgp-control-plane"`
	// BGPSecretsNamespace holds the Secrets peer configs' authSecretRef
	// name; the agent reads Secrets there only.
	BGPSecretsNamespace string `mapstructure:"bgp-secrets-namespace"`
}

// DefaultConfig returns the defaults: off; Secrets in kube-system
// (Cilium's chart default).
func DefaultConfig() Config { return Config{BGPSecretsNamespace: "kube-system"} }

// Flags registers the options, with c's values as defaults.
func (c Config) Flags(fs *pflag.FlagSet) {
	fs.Bool("enable-bgp-control-plane", c.EnableBGPControlPlane,
		"Run a BGP speaker that announces this node's pod CIDRs and its Services' LoadBalancer addresses (from TendrilLoadBalancerIPPools) to the peers of the TendrilBGPClusterConfig selecting the node (needs Kubernetes)")
	fs.String("bgp-secrets-namespace", c.BGPSecretsNamespace,
		"Namespace of the Secrets that TendrilBGPPeerConfigs' authSecretRef names (key \"password\": the session's TCP MD5 password); the agent reads Secrets of this namespace only")
}
