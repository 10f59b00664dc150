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
		name  string
		setup func() map[string]string
		want  []string
	}{
		{"everything", func() map[string]string {
			return map[string]string{
				"kubeconfig":               writeKubeconfig(t), // the API server is reached only when the step starts
				"enable-datapath":          "true",
				"kvstore":                  agentkv.ModeEmbedded,
				"identity-allocation-mode": agentidentity.AllocationKVStore,
			}
		}, seedsOrder},
		{"standalone, no datapath", func() map[string]string {
			t.Setenv("KUBERNETES_SERVICE_HOST", "")
			return map[string]string{"enable-datapath": "false"}
		}, []string{"config", "endpoint-restore-ipam", "policy-restore", "regenerate-restored",
			"policy-regeneration", "metrics", "pprof", "api-server"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			flags := tt.setup()
			flags["state-dir"] = filepath.Join(dir, "state")
			flags["socket"] = filepath.Join(dir, "tendril.sock")
			flags["node-name"] = "node-a"
			a, err := newTestAgent(Deps{}, flags)
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
