package agent

import (
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"

	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"

	"github.com/tendril-net/tendril/pkg/agent/agentidentity"
	"github.com/tendril-net/tendril/pkg/agent/agentkv"
	"github.com/tendril-net/tendril/pkg/agent/epattach"
	"github.com/tendril-net/tendril/pkg/agent/l2announcer"
	"github.com/tendril-net/tendril/pkg/agent/nodehealth"
	agentprefilter "github.com/tendril-net/tendril/pkg/agent/prefilter"
	"github.com/tendril-net/tendril/pkg/identity/identitytable"
	"github.com/tendril-net/tendril/pkg/ipcache"
	"github.com/tendril-net/tendril/pkg/ipcache/kvpublisher"
	"github.com/tendril-net/tendril/pkg/k8s/endpointpub"
	"github.com/tendril-net/tendril/pkg/k8s/policystatus"
	"github.com/tendril-net/tendril/pkg/loadbalancer"
	"github.com/tendril-net/tendril/pkg/nodemanager"
	"github.com/tendril-net/tendril/pkg/policy/policycidr"
	"github.com/tendril-net/tendril/pkg/status"
)

// seedsOrder is the agent's start, in the order of ARCHITECTURE.md and the
// seeds: every step, with Kubernetes, the datapath and a kvstore.
var seedsOrder = []string{
	"config", "k8s-client", "bpf-maps", "lb-restore", "endpoint-restore-ipam", "k8s-node-writeback", "k8s-watchers",
	"kvstore", "identity-restore", "host-ips-ct-gc", "policy-restore", "regenerate-restored",
	// The proxies after the restored endpoints' policy: a proxy started
	// before it refused the names the pods' DNS rules allow (no resolved
	// policy, no rules), where the datapath's fallback (no proxy
	// listening) would have let them through; TestPrivilegedLabFQDNPolicy
	// saw a REFUSED for an allowed name 14 ms after a restarted agent's
	// proxies began to listen.
	"policy-regeneration", "l7-proxies", "metrics", "pprof", "hubble", "api-server",
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
				"kvstore":                  agentkv.ModeEtcd,
				"kvstore-endpoints":        "http://127.0.0.1:1", // never dialled: the kvstore step does not run
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
			var contributions []status.Contribution
			a, err := newTestAgent(Deps{}, flags, cell.Invoke(func(in status.In) { contributions = in.Contributions }))
			if err != nil {
				t.Fatal(err)
			}
			if got := a.steps.Names(); !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("start order\n got %v\nwant %v", got, tt.want)
			}
			// Each subsystem owns its status section's order key; two
			// equal keys would leave their order to the cell list.
			seen := map[int]bool{}
			for _, c := range contributions {
				if c.Section == nil {
					continue
				}
				if seen[c.Order] {
					t.Errorf("two status sections have the order key %d", c.Order)
				}
				seen[c.Order] = true
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

// TestEveryTableIsTyped: with every subsystem on, each table in the
// database is some cell's typed output, which any other cell can receive
// by its type; none is reached only by its name.
func TestEveryTableIsTyped(t *testing.T) {
	dir := t.TempDir()
	flags := map[string]string{
		"kubeconfig":               writeKubeconfig(t),
		"enable-datapath":          "true",
		"kvstore":                  agentkv.ModeEtcd,
		"kvstore-endpoints":        "http://127.0.0.1:1", // never dialled: the kvstore step does not run
		"identity-allocation-mode": agentidentity.AllocationKVStore,
		"enable-l2-announcements":  "true",
		"enable-xdp-prefilter":     "true",
		"state-dir":                filepath.Join(dir, "state"),
		"socket":                   filepath.Join(dir, "tendril.sock"),
		"node-name":                "node-a",
	}
	var typed, registered []string
	_, err := newTestAgent(Deps{}, flags, cell.Invoke(func(in typedTables) {
		for _, tbl := range []interface{ Name() statedb.TableName }{
			in.Identities.Table(), in.PolicyCIDRs.Table(), in.Endpoints.Table(), in.IPCache.Table(),
			in.Nodes, in.Routes, in.Services, in.Backends, in.Frontends,
			in.PolicyStatus, in.EndpointPublications, in.KVAddresses, in.L2Announcements, in.NodeHealth, in.Redirects,
			in.Prefilter.List().Table(),
		} {
			typed = append(typed, tbl.Name())
		}
		for _, meta := range in.DB.GetTables(in.DB.ReadTxn()) {
			registered = append(registered, meta.Name())
		}
	}))
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(typed)
	slices.Sort(registered)
	if !slices.Equal(typed, registered) {
		t.Fatalf("typed outputs %v\nregistered tables %v", typed, registered)
	}
}

// typedTables is every table by its type, as a cell receives it.
type typedTables struct {
	cell.In

	DB                   *statedb.DB
	Identities           *identitytable.Table
	PolicyCIDRs          *policycidr.Table
	Endpoints            *epattach.Table
	IPCache              *ipcache.IPCache
	Nodes                statedb.Table[*nodemanager.Peer]
	Routes               statedb.Table[*nodemanager.Route]
	Services             statedb.Table[*loadbalancer.Service]
	Backends             statedb.Table[*loadbalancer.Backend]
	Frontends            statedb.Table[*loadbalancer.Frontend]
	PolicyStatus         statedb.Table[*policystatus.Report]
	EndpointPublications statedb.Table[*endpointpub.Desired]
	KVAddresses          statedb.Table[*kvpublisher.Key]
	L2Announcements      statedb.Table[*l2announcer.Announcement]
	NodeHealth           statedb.Table[*nodehealth.Status]
	Redirects            statedb.Table[*loadbalancer.LocalRedirect]
	Prefilter            *agentprefilter.Prefilter
}
