package agentflows

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/cilium/statedb"

	"github.com/tendril-net/tendril/pkg/loadbalancer"
	"github.com/tendril-net/tendril/pkg/loadbalancer/backendaddrs"
	"github.com/tendril-net/tendril/pkg/observer"
	"github.com/tendril-net/tendril/pkg/policy"
	"github.com/tendril-net/tendril/pkg/policy/api"
)

// TestMetricsConfigValidate: bad metric names, limits, export
// paths and filters are refused naming the flag.
func TestMetricsConfigValidate(t *testing.T) {
	ok := DefaultMetricsConfig()
	if err := ok.Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	for _, tc := range []struct {
		change func(*MetricsConfig)
		want   string
	}{
		{func(c *MetricsConfig) { c.Metrics = []string{"flow", "kafka"} }, `"kafka"`},
		{func(c *MetricsConfig) { c.MetricsMaxLabelValues = 0 }, "hubble-metrics-max-label-values"},
		{func(c *MetricsConfig) { c.ExportFilePath = "flows.json" }, "hubble-export-file-path"},
		{func(c *MetricsConfig) { c.ExportFilePath = "/tmp/f.json"; c.ExportFileMaxSizeMB = 0 }, "hubble-export-file-max-size-mb"},
		{func(c *MetricsConfig) { c.ExportFilePath = "/tmp/f.json"; c.ExportFileMaxBackups = -1 }, "hubble-export-file-max-backups"},
		{func(c *MetricsConfig) { c.ExportFilePath = "/tmp/f.json"; c.ExportAllowlist = `{"verdict":` }, "hubble-export-allowlist"},
		{func(c *MetricsConfig) { c.ExportFilePath = "/tmp/f.json"; c.ExportDenylist = `{"nope":1}` }, "hubble-export-denylist"},
		{func(c *MetricsConfig) {
			c.ExportFilePath = "/tmp/f.json"
			c.ExportAllowlist = `{"source_fqdn":["a.example"]}`
		}, "export filters"},
	} {
		c := DefaultMetricsConfig()
		tc.change(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: error %v, want one naming %s", c, err, tc.want)
		}
	}
	c := DefaultMetricsConfig()
	c.ExportFilePath, c.ExportAllowlist = "/tmp/f.json", `{"verdict":["DROPPED"]} {"source_pod":["kube-system/"]}`
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	x, err := c.exporterConfig()
	if err != nil || len(x.Allow) != 2 || x.MaxSizeBytes != 10<<20 || x.MaxBackups != 5 {
		t.Fatalf("exporter config %+v, %v", x, err)
	}
}

// followedKnowledge names services from tables, its backend address
// index brought up to date by each call of step.
func followedKnowledge(t testing.TB, tables *loadbalancer.Tables) (*nodeKnowledge, func()) {
	t.Helper()
	x := backendaddrs.New()
	f, err := backendaddrs.NewFollower(x, tables.DB, tables.Backends)
	if err != nil {
		t.Fatal(err)
	}
	k := &nodeKnowledge{services: &serviceKnowledge{db: tables.DB, frontends: tables.Frontends, backends: x}}
	return k, func() { f.Step(tables.DB.ReadTxn()) }
}

// TestServiceKnowledge: a flow's address names the service of its
// frontend or, after the socket load balancer translated it, of its
// backend; the next lookup sees a changed table.
func TestServiceKnowledge(t *testing.T) {
	db := statedb.New()
	tables, err := loadbalancer.NewTables(db)
	if err != nil {
		t.Fatal(err)
	}
	w := loadbalancer.NewWriter(tables, "node-a")
	name := loadbalancer.ServiceName{Namespace: "shop", Name: "web"}
	if err := w.UpsertService(&loadbalancer.Service{Name: name, Type: "ClusterIP", Addresses: []netip.Addr{netip.MustParseAddr("10.96.0.10")},
		Ports: []loadbalancer.ServicePort{{Name: "http", Port: 80, Proto: loadbalancer.TCP}}}); err != nil {
		t.Fatal(err)
	}
	if err := w.SetBackends(name, "s1", []*loadbalancer.Backend{{Addr: netip.MustParseAddrPort("10.0.0.5:8080"), Proto: loadbalancer.TCP, PortName: "http", Ready: true, Serving: true}}); err != nil {
		t.Fatal(err)
	}
	k, step := followedKnowledge(t, tables)
	step()
	for _, tc := range []struct {
		addr  string
		proto uint8
		want  string
	}{
		{"10.96.0.10:80", loadbalancer.TCP, "shop/web"},
		{"10.0.0.5:8080", loadbalancer.TCP, "shop/web"},
		{"10.0.0.5:8080", loadbalancer.UDP, ""},
		{"10.0.0.5:9090", loadbalancer.TCP, ""},
		{"10.0.0.6:8080", loadbalancer.TCP, ""},
	} {
		s, ok := k.ServiceByAddr(netip.MustParseAddrPort(tc.addr), tc.proto)
		got := ""
		if ok {
			got = s.Namespace + "/" + s.Name
		}
		if got != tc.want {
			t.Errorf("%s/%d: %q, want %q", tc.addr, tc.proto, got, tc.want)
		}
	}
	// A backend listed by two services names the first by name, and
	// the other once the first no longer lists it.
	other := loadbalancer.ServiceName{Namespace: "shop", Name: "api"}
	if err := w.UpsertService(&loadbalancer.Service{Name: other, Type: "ClusterIP", Addresses: []netip.Addr{netip.MustParseAddr("10.96.0.11")},
		Ports: []loadbalancer.ServicePort{{Name: "http", Port: 80, Proto: loadbalancer.TCP}}}); err != nil {
		t.Fatal(err)
	}
	if err := w.SetBackends(other, "s2", []*loadbalancer.Backend{{Addr: netip.MustParseAddrPort("10.0.0.5:8080"), Proto: loadbalancer.TCP, PortName: "http", Ready: true, Serving: true}}); err != nil {
		t.Fatal(err)
	}
	step()
	if s, _ := k.ServiceByAddr(netip.MustParseAddrPort("10.0.0.5:8080"), loadbalancer.TCP); s.Name != "api" {
		t.Errorf("shared backend named %v, want shop/api (first by name)", s)
	}
	if err := w.SetBackends(other, "s2", nil); err != nil {
		t.Fatal(err)
	}
	step()
	if s, _ := k.ServiceByAddr(netip.MustParseAddrPort("10.0.0.5:8080"), loadbalancer.TCP); s.Name != "web" {
		t.Errorf("backend named %v after shop/api dropped it, want shop/web", s)
	}
	if err := w.DeleteService(name); err != nil {
		t.Fatal(err)
	}
	if s, ok := k.ServiceByAddr(netip.MustParseAddrPort("10.96.0.10:80"), loadbalancer.TCP); ok {
		t.Errorf("deleted service still named: %v", s)
	}
	// Without the services cell: nothing, no panic.
	if _, ok := (&nodeKnowledge{}).ServiceByAddr(netip.MustParseAddrPort("10.96.0.10:80"), loadbalancer.TCP); ok {
		t.Error("a service without the services")
	}
}

// TestDefaultDenyPolicies: a default-deny drop names the policies whose
// rules select the endpoint in the drop's direction, once each; a rule
// without that direction, or opting out of default deny, is not named.
func TestDefaultDenyPolicies(t *testing.T) {
	repo := policy.NewRepository()
	parse := func(doc string) api.Rules {
		t.Helper()
		rs, err := api.ParseRules([]byte(doc))
		if err != nil {
			t.Fatal(err)
		}
		return rs
	}
	if _, err := repo.ReplaceSource("k8s/CiliumNetworkPolicy/shop/db", "shop", parse(`[
		{"endpointSelector":{"matchLabels":{"app":"db"}},"labels":["k8s:io.cilium.k8s.policy.name=db","k8s:io.cilium.k8s.policy.namespace=shop"],
		 "ingress":[{"fromEndpoints":[{"matchLabels":{"app":"web"}}]}]},
		{"endpointSelector":{"matchLabels":{"app":"db"}},"labels":["k8s:io.cilium.k8s.policy.name=db","k8s:io.cilium.k8s.policy.namespace=shop"],
		 "ingress":[{"fromEndpoints":[{"matchLabels":{"app":"batch"}}]}]}]`)); err != nil {
		t.Fatal(err)
	}
	if _, err := repo.ReplaceSource("k8s/CiliumNetworkPolicy/shop/db-egress", "shop", parse(`[
		{"endpointSelector":{"matchLabels":{"app":"db"}},"labels":["k8s:io.cilium.k8s.policy.name=db-egress","k8s:io.cilium.k8s.policy.namespace=shop"],
		 "egress":[{"toEndpoints":[{"matchLabels":{"app":"dns"}}]}]}]`)); err != nil {
		t.Fatal(err)
	}
	if _, err := repo.ReplaceSource("k8s/CiliumNetworkPolicy/shop/audit", "shop", parse(`[
		{"endpointSelector":{"matchLabels":{"app":"db"}},"labels":["k8s:io.cilium.k8s.policy.name=audit","k8s:io.cilium.k8s.policy.namespace=shop"],
		 "enableDefaultDeny":{"ingress":false},"ingressDeny":[{"fromEndpoints":[{"matchLabels":{"app":"x"}}]}]}]`)); err != nil {
		t.Fatal(err)
	}
	rules, _ := repo.Rules(nil)
	var ids []uint32
	for _, r := range rules {
		ids = append(ids, r.ID)
	}
	k := &nodeKnowledge{repo: repo, defaultDeny: &defaultDenying{repo: repo},
		selecting: func(ep uint16) ([]uint32, bool) { return ids, ep == 7 }}
	names := func(ps []observer.Policy) string {
		var out []string
		for _, p := range ps {
			out = append(out, p.Namespace+"/"+p.Name)
		}
		return strings.Join(out, ",")
	}
	if got := names(k.DefaultDenyPolicies(7, true)); got != "shop/db" {
		t.Errorf("ingress: %q, want shop/db (once; not the audit policy, which opts out)", got)
	}
	if got := names(k.DefaultDenyPolicies(7, false)); got != "shop/db-egress" {
		t.Errorf("egress: %q", got)
	}
	if got := k.DefaultDenyPolicies(8, true); got != nil {
		t.Errorf("an endpoint not resolved yet: %v", got)
	}
	// The repository changes: the next drop sees it.
	if _, err := repo.ReplaceSource("k8s/CiliumNetworkPolicy/shop/db", "shop", nil); err != nil {
		t.Fatal(err)
	}
	if got := names(k.DefaultDenyPolicies(7, true)); got != "" {
		t.Errorf("after the policy's delete: %q", got)
	}
}

// BenchmarkServiceByAddrAfterChange: one service of many changes its
// backends, then a flow names a service by a backend address — what each
// change costs the flows. `-benchtime` iterations of change + lookup at
// 10,000 services of 10 backends; the change alone is reported beside it
// (change-ns) so the lookup's share is the difference.
func BenchmarkServiceByAddrAfterChange(b *testing.B) {
	const services = 10000
	db := statedb.New()
	tables, err := loadbalancer.NewTables(db)
	if err != nil {
		b.Fatal(err)
	}
	w := loadbalancer.NewWriter(tables, "node-a")
	backends := func(first netip.Addr) []*loadbalancer.Backend {
		var out []*loadbalancer.Backend
		for i := 0; i < 10; i++ {
			out = append(out, &loadbalancer.Backend{Addr: netip.AddrPortFrom(first, 8080), Proto: loadbalancer.TCP, PortName: "http", Ready: true, Serving: true})
			first = first.Next()
		}
		return out
	}
	ip := netip.MustParseAddr("10.96.0.10")
	pod := netip.MustParseAddr("10.1.0.0")
	for i := 0; i < services; i++ {
		name := loadbalancer.ServiceName{Namespace: "bench", Name: fmt.Sprintf("svc-%d", i)}
		if err := w.UpsertService(&loadbalancer.Service{Name: name, Type: "ClusterIP", Addresses: []netip.Addr{ip},
			Ports: []loadbalancer.ServicePort{{Name: "http", Port: 80, Proto: loadbalancer.TCP}}}); err != nil {
			b.Fatal(err)
		}
		if err := w.SetBackends(name, "s1", backends(pod)); err != nil {
			b.Fatal(err)
		}
		ip = ip.Next()
		for j := 0; j < 10; j++ {
			pod = pod.Next()
		}
	}
	k, step := followedKnowledge(b, tables)
	step()
	changed := loadbalancer.ServiceName{Namespace: "bench", Name: "svc-0"}
	lookup := netip.AddrPortFrom(netip.MustParseAddr("10.1.0.50"), 8080) // a backend of svc-5
	if s, ok := k.ServiceByAddr(lookup, loadbalancer.TCP); !ok || s.Name != "svc-5" {
		b.Fatalf("lookup: %v %v", s, ok)
	}
	moved := netip.MustParseAddr("10.200.0.0")
	var changeNs time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		if err := w.SetBackends(changed, "s1", backends(moved)); err != nil {
			b.Fatal(err)
		}
		step()
		changeNs += time.Since(t0)
		if _, ok := k.ServiceByAddr(lookup, loadbalancer.TCP); !ok {
			b.Fatal("lookup failed")
		}
		moved = moved.Next()
	}
	b.ReportMetric(float64(changeNs.Nanoseconds())/float64(b.N), "change-ns")
}
