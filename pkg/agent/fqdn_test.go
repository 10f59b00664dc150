package agent

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	flowpb "github.com/cilium/cilium/api/v1/flow"
	"github.com/cilium/cilium/api/v1/models"
	"github.com/cilium/hive/cell"

	"github.com/tendril-net/tendril/pkg/agent/agentflows"
	"github.com/tendril-net/tendril/pkg/agent/agentfqdn"
	"github.com/tendril-net/tendril/pkg/client"
)

// The FQDN cache saved in the state dir is restored when the agent starts
// and served on the v1 API (/v1/fqdn/cache); an expired entry is not.
func TestFQDNCacheRestoredAndServed(t *testing.T) {
	dir := t.TempDir()
	flags := testFlags(dir, nil)
	if err := os.MkdirAll(flags["state-dir"], 0o700); err != nil {
		t.Fatal(err)
	}
	future, past := time.Now().Add(time.Hour).UTC().Format(time.RFC3339), time.Now().Add(-time.Hour).UTC().Format(time.RFC3339)
	saved := `{"version":1,"lookups":[
	  {"endpointID":7,"name":"world.example","ips":["192.0.2.10"],"ttl":3600,"lookupTime":"` + past + `","expires":"` + future + `"},
	  {"endpointID":7,"name":"old.example","ips":["192.0.2.11"],"ttl":60,"lookupTime":"` + past + `","expires":"` + past + `"}]}`
	if err := os.WriteFile(filepath.Join(flags["state-dir"], "fqdn-cache.json"), []byte(saved), 0o600); err != nil {
		t.Fatal(err)
	}
	a, err := newTestAgent(Deps{Log: testLogger(t)}, flags)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Stop(context.Background()) })
	c, err := client.New("unix://" + flags["socket"])
	if err != nil {
		t.Fatal(err)
	}
	var got []models.DNSLookup
	if err := c.Do(context.Background(), http.MethodGet, "/fqdn/cache", nil, nil, nil, &got); err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Fqdn != "world.example." || got[0].EndpointID != 7 || len(got[0].Ips) != 1 || got[0].Ips[0] != "192.0.2.10" {
		t.Fatalf("restored cache: %+v", got)
	}
	var names models.NameManager
	if err := c.Do(context.Background(), http.MethodGet, "/fqdn/names", nil, nil, nil, &names); err != nil {
		t.Fatal(err)
	}
}

// The FQDN cell's DNS proxy configuration publishes its L7 flows into the
// flows cell's observer: a flow handed to it is counted among the flows
// the node's Hubble serves.
func TestFQDNProxyFlowsReachTheObserver(t *testing.T) {
	dir := t.TempDir()
	flags := testFlags(dir, map[string]string{"enable-datapath": "true"})
	var mgr *agentfqdn.Manager
	var flows *agentflows.Module
	if _, err := newTestAgent(Deps{Log: testLogger(t)}, flags, cell.Invoke(func(m *agentfqdn.Manager, f *agentflows.Module) {
		mgr, flows = m, f
	})); err != nil {
		t.Fatal(err)
	}
	if flows == nil {
		t.Fatal("no flows module with the datapath on")
	}
	seen := func() string {
		for _, l := range flows.StatusSection().Lines {
			if l.Key == "flows seen" {
				return l.Value
			}
		}
		return ""
	}
	if s := seen(); !strings.HasPrefix(s, "0 ") {
		t.Fatalf("flows seen before: %q", s)
	}
	cfg := mgr.ProxyConfig()
	if cfg.Flow == nil || cfg.Learned == nil {
		t.Fatalf("proxy configuration without its hooks: flow %v, learned %v", cfg.Flow != nil, cfg.Learned != nil)
	}
	cfg.Flow(&flowpb.Flow{IP: &flowpb.IP{Source: "10.1.0.2", Destination: "10.1.0.3"},
		L7: &flowpb.Layer7{Type: flowpb.L7FlowType_RESPONSE, Record: &flowpb.Layer7_Dns{Dns: &flowpb.DNS{Query: "world.example."}}}})
	if s := seen(); !strings.HasPrefix(s, "1 ") {
		t.Fatalf("flows seen after the proxy's flow: %q", s)
	}
}

// --tofqdns-proxy-port reaches the FQDN cell, whose port the L7 cell
// gives the DNS proxy (agentl7's redirectConfig); without it, 0 (a free
// port at each start).
func TestFQDNProxyPortFlag(t *testing.T) {
	for flag, want := range map[string]uint16{"": 0, "10053": 10053} {
		dir := t.TempDir()
		extra := map[string]string{}
		if flag != "" {
			extra["tofqdns-proxy-port"] = flag
		}
		var mgr *agentfqdn.Manager
		if _, err := newTestAgent(Deps{Log: testLogger(t)}, testFlags(dir, extra), cell.Invoke(func(m *agentfqdn.Manager) { mgr = m })); err != nil {
			t.Fatal(err)
		}
		if got := mgr.ProxyPort(); got != want {
			t.Errorf("--tofqdns-proxy-port %q: the DNS proxy's port %d, want %d", flag, got, want)
		}
	}
	if _, err := newTestAgent(Deps{Log: testLogger(t)}, testFlags(t.TempDir(), map[string]string{"tofqdns-proxy-port": "65536"})); err == nil || !strings.Contains(err.Error(), "tofqdns-proxy-port") {
		t.Errorf("--tofqdns-proxy-port 65536: %v, want an error naming the flag", err)
	}
}
