// Package k8s builds the agent's Kubernetes clients (core, Tendril CRDs,
// dynamic) from a kubeconfig or the in-cluster configuration. Generated
// code for the Tendril CRDs lives below it (apis/, client/); watchers and
// the CRD installer are packages of their own.
package k8s

import (
	"errors"
	"fmt"
	"os"

	"github.com/spf13/pflag"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	tendrilclient "github.com/tendril-net/tendril/pkg/k8s/client/clientset/versioned"
)

// Config says how to reach the API server.
type Config struct {
	// Kubeconfig is a kubeconfig file; empty uses the in-cluster config
	// when the agent runs in a pod, and standalone mode otherwise.
	Kubeconfig string
	// APIServer overrides the server address of the kubeconfig.
	APIServer string `mapstructure:"k8s-api-server"`
	// QPS and Burst bound the agent's request rate.
	QPS   float32 `mapstructure:"k8s-client-qps"`
	Burst int     `mapstructure:"k8s-client-burst"`
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	return Config{QPS: 50, Burst: 100}
}

// Flags registers the options, with c's values as defaults.
func (c Config) Flags(fs *pflag.FlagSet) {
	fs.String("kubeconfig", c.Kubeconfig, "Kubeconfig of the cluster (empty: in-cluster config when in a pod, else standalone mode)")
	fs.String("k8s-api-server", c.APIServer, "Kubernetes API server URL (overrides the kubeconfig's)")
	fs.Float32("k8s-client-qps", c.QPS, "Queries per second to the API server")
	fs.Int("k8s-client-burst", c.Burst, "Burst of queries to the API server")
}

// Validate checks the values.
func (c *Config) Validate() error {
	if c.QPS <= 0 {
		return fmt.Errorf("k8s-client-qps: must be positive, got %v", c.QPS)
	}
	if c.Burst <= 0 {
		return fmt.Errorf("k8s-client-burst: must be positive, got %d", c.Burst)
	}
	if c.Kubeconfig != "" {
		if _, err := os.Stat(c.Kubeconfig); err != nil {
			return fmt.Errorf("kubeconfig: %w", err)
		}
	}
	return nil
}

// Enabled reports whether the agent runs with Kubernetes: a kubeconfig, an
// API server address, or the in-cluster environment.
func (c *Config) Enabled() bool {
	return c.Kubeconfig != "" || c.APIServer != "" || os.Getenv("KUBERNETES_SERVICE_HOST") != ""
}

// Clients are the agent's API clients, sharing one rest.Config.
type Clients struct {
	REST    *rest.Config
	Core    kubernetes.Interface
	Tendril tendrilclient.Interface
	Dynamic dynamic.Interface
}

// NewClients builds the clients; it does not contact the server.
func NewClients(cfg Config, userAgent string) (*Clients, error) {
	rc, err := restConfig(cfg)
	if err != nil {
		return nil, err
	}
	rc.QPS, rc.Burst = cfg.QPS, cfg.Burst
	rc.UserAgent = userAgent
	return NewClientsForConfig(rc)
}

// NewClientsForConfig builds the clients from a rest.Config.
func NewClientsForConfig(rc *rest.Config) (*Clients, error) {
	core, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("core client: %w", err)
	}
	td, err := tendrilclient.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("tendril client: %w", err)
	}
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("dynamic client: %w", err)
	}
	return &Clients{REST: rc, Core: core, Tendril: td, Dynamic: dyn}, nil
}

func restConfig(cfg Config) (*rest.Config, error) {
	if cfg.Kubeconfig == "" && cfg.APIServer == "" {
		rc, err := rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("in-cluster config: %w", err)
		}
		return rc, nil
	}
	rules := &clientcmd.ClientConfigLoadingRules{ExplicitPath: cfg.Kubeconfig}
	overrides := &clientcmd.ConfigOverrides{}
	if cfg.APIServer != "" {
		overrides.ClusterInfo.Server = cfg.APIServer
	}
	rc, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, overrides).ClientConfig()
	if err != nil {
		if errors.Is(err, clientcmd.ErrEmptyConfig) {
			return nil, fmt.Errorf("kubeconfig %q: no cluster configured", cfg.Kubeconfig)
		}
		return nil, fmt.Errorf("load kubeconfig %q: %w", cfg.Kubeconfig, err)
	}
	return rc, nil
}
