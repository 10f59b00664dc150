// Package k8sclient is the operator's Kubernetes client cell: it builds
// the core, Tendril and dynamic clients from --kubeconfig (or the
// in-cluster configuration), waits at start until the API server
// answers and installs the Tendril CRDs (as the agent does), so every
// later step can use them.
package k8sclient

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/spf13/pflag"

	"github.com/tendril-net/tendril/pkg/k8s"
	"github.com/tendril-net/tendril/pkg/k8s/crdinstall"
)

// Config says how to reach the API server. Field names match the flags
// (hive's convention: "k8s-client-qps" is K8sClientQPS).
type Config struct {
	Kubeconfig        string
	K8sAPIServer      string
	K8sClientQPS      float32
	K8sClientBurst    int
	K8sConnectTimeout time.Duration
	K8sInstallCRDs    bool
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	return Config{K8sClientQPS: 50, K8sClientBurst: 100, K8sConnectTimeout: 2 * time.Minute, K8sInstallCRDs: true}
}

// Flags registers the options.
func (c Config) Flags(fs *pflag.FlagSet) {
	fs.String("kubeconfig", c.Kubeconfig, "Kubeconfig of the cluster (empty: in-cluster config)")
	fs.String("k8s-api-server", c.K8sAPIServer, "Kubernetes API server URL (overrides the kubeconfig's)")
	fs.Float32("k8s-client-qps", c.K8sClientQPS, "Queries per second to the API server")
	fs.Int("k8s-client-burst", c.K8sClientBurst, "Burst of queries to the API server")
	fs.Duration("k8s-connect-timeout", c.K8sConnectTimeout, "How long the start waits for the API server to answer")
	fs.Bool("k8s-install-crds", c.K8sInstallCRDs, "Create or update the Tendril CRDs at start")
}

// Cell provides *k8s.Clients.
var Cell = cell.Module("k8s-client", "Kubernetes clients",
	cell.Config(DefaultConfig()),
	cell.Provide(newClients),
)

type params struct {
	cell.In
	Config    Config
	Log       *slog.Logger
	Lifecycle cell.Lifecycle
}

func newClients(p params) (*k8s.Clients, error) {
	kc := k8s.Config{Kubeconfig: p.Config.Kubeconfig, APIServer: p.Config.K8sAPIServer, QPS: p.Config.K8sClientQPS, Burst: p.Config.K8sClientBurst}
	if err := kc.Validate(); err != nil {
		return nil, fmt.Errorf("kubernetes client config: %w", err)
	}
	clients, err := k8s.NewClients(kc, "tendril-operator")
	if err != nil {
		return nil, fmt.Errorf("kubernetes clients: %w", err)
	}
	p.Lifecycle.Append(cell.Hook{OnStart: func(ctx cell.HookContext) error {
		if err := waitAPIServer(ctx, clients, p.Config.K8sConnectTimeout, p.Log); err != nil {
			return err
		}
		if !p.Config.K8sInstallCRDs {
			return nil
		}
		// Agents install them too; whichever starts first creates them,
		// the other finds them current.
		if _, err := crdinstall.Install(ctx, clients.Dynamic, p.Log); err != nil {
			return fmt.Errorf("install CRDs: %w", err)
		}
		return nil
	}})
	return clients, nil
}

// waitAPIServer retries the server version until it answers or timeout.
func waitAPIServer(ctx context.Context, c *k8s.Clients, timeout time.Duration, log *slog.Logger) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	delay := 200 * time.Millisecond
	for {
		v, err := c.Core.Discovery().ServerVersion()
		if err == nil {
			log.Info("Connected to the Kubernetes API server", "host", c.REST.Host, "version", v.GitVersion)
			return nil
		}
		log.Info("Waiting for the Kubernetes API server", "host", c.REST.Host, "error", err)
		select {
		case <-ctx.Done():
			return fmt.Errorf("kubernetes API server %s not reachable within %s: %w", c.REST.Host, timeout, err)
		case <-time.After(delay):
		}
		delay = min(2*delay, 5*time.Second)
	}
}
