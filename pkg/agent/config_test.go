package agent

import (
	"math"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/cilium/hive/cell"

	"github.com/tendril-net/tendril/api/v1/server"
	"github.com/tendril-net/tendril/pkg/agent/agentflows"
	"github.com/tendril-net/tendril/pkg/agent/agentidentity"
	"github.com/tendril-net/tendril/pkg/agent/agentk8s"
	"github.com/tendril-net/tendril/pkg/agent/agentkv"
	"github.com/tendril-net/tendril/pkg/agent/agentservices"
	"github.com/tendril-net/tendril/pkg/labels"
)

// TestFlagsDecodeIntoTheCellsConfigs: a value set on a flag reaches its
// cell's config through the hive's decoding (viper and mapstructure) as
// the flag parsed it, for every kind of flag the cells declare: lists
// (label patterns, regexps with commas and spaces, kept whole), maps, a
// float32, a uint32, a uint64 and an int64 past 32 bits, durations, and
// defaults of each.
func TestFlagsDecodeIntoTheCellsConfigs(t *testing.T) {
	var (
		id    agentidentity.Config
		kv    agentkv.Options
		k8s   agentk8s.Config
		flows agentflows.Config
		svc   agentservices.Config
		api   server.Config
	)
	flags := testFlags(t.TempDir(), map[string]string{
		"identity-labels-exclude":       "a{1, 2}",
		"kvstore":                       agentkv.ModeEtcd,
		"kvstore-endpoints":             "http://127.0.0.1:1,http://127.0.0.1:2",
		"kvstore-opt":                   "etcd.listLimit=50,etcd.lockStaleTimeout=30s",
		"kvstore-lease-ttl":             "90s",
		"k8s-client-qps":                "2.5",
		"k8s-service-cidr":              "10.96.0.0/12",
		"hubble-max-concurrent-streams": "7",
		"hubble-metrics":                "",
		"maglev-hash-seed":              "18446744073709551615",
		"api-max-body-bytes":            "8589934592",
		"hubble-tls-client-ca-files":    "/etc/hubble certs/ca.pem",
	})
	a := New(cell.Invoke(func(i agentidentity.Config, o agentkv.Options, k agentk8s.Config, f agentflows.Config, s agentservices.Config, c server.Config) {
		id, kv, k8s, flows, svc, api = i, o, k, f, s, c
	}))
	fs := newFlagSet(a)
	for name, v := range flags {
		if err := fs.Set(name, v); err != nil {
			t.Fatal(err)
		}
	}
	// A list flag given twice, and a pattern holding a space. A list of
	// one value holding a space stays one value too (exclude above, and
	// the hubble CA file below).
	for _, v := range []string{"x{1,2}", "team id"} {
		if err := fs.Set("identity-labels-include", v); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.Populate(Deps{Flags: fs}); err != nil {
		t.Fatal(err)
	}
	checks := []struct {
		name      string
		got, want any
	}{
		{"identity-labels-include", id.Labels.Include, []string{"x{1,2}", "team id"}},
		{"identity-labels-exclude", id.Labels.Exclude, []string{"a{1, 2}"}},
		{"identity-labels-keep (default)", id.Labels.Keep, labels.DefaultKeepPatterns()},
		{"identity-allocation-mode (default)", id.AllocationMode, agentidentity.AllocationCRD},
		{"kvstore", kv.Mode, agentkv.ModeEtcd},
		{"kvstore-endpoints", kv.Client.Endpoints, []string{"http://127.0.0.1:1", "http://127.0.0.1:2"}},
		{"kvstore-opt", kv.Client.Options, map[string]string{"etcd.listLimit": "50", "etcd.lockStaleTimeout": "30s"}},
		{"kvstore-lease-ttl", kv.Client.LeaseTTL, 90 * time.Second},
		{"kvstore-connect-timeout (default)", kv.Client.ConnectTimeout, 2 * time.Minute},
		{"k8s-client-qps", k8s.Client.QPS, float32(2.5)},
		{"k8s-client-burst (default)", k8s.Client.Burst, 100},
		{"k8s-service-cidr", k8s.ServiceCIDRs, []string{"10.96.0.0/12"}},
		{"cluster-pool-ipv4-cidr (default)", len(k8s.ClusterPoolIPv4), 0},
		{"hubble-max-concurrent-streams", flows.MaxConcurrentStreams, uint32(7)},
		{"hubble-tls-client-ca-files", flows.TLSClientCAFiles, []string{"/etc/hubble certs/ca.pem"}},
		{"hubble-metrics (emptied)", len(flows.MetricsExport.Metrics), 0},
		{"maglev-hash-seed", svc.MaglevHashSeed, uint64(math.MaxUint64)},
		{"api-max-body-bytes", api.MaxBodyBytes, int64(8 << 30)},
		{"socket", api.Socket, flags["socket"]},
	}
	for _, c := range checks {
		if !reflect.DeepEqual(c.got, c.want) {
			t.Errorf("%s: decoded %#v, want %#v", c.name, c.got, c.want)
		}
	}
	if !slices.Equal(agentflows.DefaultConfig().MetricsExport.Metrics, flowsDefaultMetrics(t)) {
		t.Errorf("hubble-metrics default changed")
	}
}

// flowsDefaultMetrics is hubble-metrics as an agent with the defaults
// decodes it.
func flowsDefaultMetrics(t *testing.T) []string {
	var flows agentflows.Config
	a := New(cell.Invoke(func(f agentflows.Config) { flows = f }))
	if err := a.Populate(Deps{Flags: newFlagSet(a)}); err != nil {
		t.Fatal(err)
	}
	return flows.MetricsExport.Metrics
}
