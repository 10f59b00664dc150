package agent

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/tendril-net/tendril/pkg/agent/agentidentity"
	"github.com/tendril-net/tendril/pkg/agent/agentkv"
)

// seedsOrder is the agent's start, in the order of ARCHITECTURE.md and the
// seeds: every step, with Kubernetes, the datapath and a kvstore.
var seedsOrder = []string{
	"config", "k8s-client", "bpf-maps", "lb-restore", "endpoint-restore-ipam", "k8s-node-writeback", "k8s-watchers",
	"kvstore", "identity-restore", "host-ips-ct-gc", "policy-restore", "regenerate-restored",
	"policy-regeneration", "metrics", "pprof", "hubble", "api-server",
}

// TestStartOrder: the hive built from the cells (their dependencies and
// the list's order) starts its steps in the seeds' order, with every
// subsystem on; without the optional ones, the others keep their order.
func TestStartOrder(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*Config)
		want   []string
	}{
		{"everything", func(c *Config) {
			c.Kubernetes.Client.Kubeconfig = writeKubeconfig(t) // the API server is reached only when the step starts
			c.Datapath.Enable = true
			c.KVStore.Mode = agentkv.ModeEmbedded
			c.Identity.AllocationMode = agentidentity.AllocationKVStore
		}, seedsOrder},
		{"standalone, no datapath", func(c *Config) {
			t.Setenv("KUBERNETES_SERVICE_HOST", "")
			c.Datapath.Enable = false
		}, []string{"config", "endpoint-restore-ipam", "policy-restore", "regenerate-restored",
			"policy-regeneration", "metrics", "pprof", "api-server"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			cfg := DefaultConfig()
			cfg.StateDir = filepath.Join(dir, "state")
			cfg.API.Socket = filepath.Join(dir, "tendril.sock")
			cfg.NodeName = "node-a"
			tt.mutate(&cfg)
			a, err := New(cfg, Deps{})
			if err != nil {
				t.Fatal(err)
			}
			if got := a.steps.Names(); !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("start order\n got %v\nwant %v", got, tt.want)
			}
		})
	}
}

// writeKubeconfig writes a kubeconfig naming an API server nobody serves.
func writeKubeconfig(t *testing.T) string {
	path := filepath.Join(t.TempDir(), "kubeconfig")
	doc := `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: x}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`
	if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}
