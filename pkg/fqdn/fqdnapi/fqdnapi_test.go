package fqdnapi

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/cilium/cilium/api/v1/models"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tendril-net/tendril/api/v1/server"
	"github.com/tendril-net/tendril/pkg/fqdn"
	"github.com/tendril-net/tendril/pkg/policy/api"
)

func do(t *testing.T, method, url string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("%s %s: Content-Type %q", method, url, ct)
	}
	return resp.StatusCode, string(b)
}

func TestFQDNCacheAPI(t *testing.T) {
	c := fqdn.NewCache(time.Minute, nil)
	c.Add(7, "world.example.", []netip.Addr{netip.MustParseAddr("192.0.2.10")}, 300)
	c.Add(8, "api-1.example.", []netip.Addr{netip.MustParseAddr("198.51.100.1"), netip.MustParseAddr("192.0.2.11")}, 10)
	deleted := 0
	h := &Handlers{Cache: c, Deleted: func() { deleted++ }, Selectors: func() []api.FQDNSelector {
		return []api.FQDNSelector{{MatchName: "World.example"}, {MatchPattern: "api-*.example"}, {MatchName: "world.example"}}
	}}
	srv, err := server.New(server.DefaultConfig(), slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	h.Register(srv)
	ts := httptest.NewServer(srv.Handler())
	defer ts.Close()

	code, body := do(t, "GET", ts.URL+"/v1/fqdn/cache")
	var all []models.DNSLookup
	if code != 200 || json.Unmarshal([]byte(body), &all) != nil || len(all) != 2 {
		t.Fatalf("list: %d %s", code, body)
	}
	if all[0].EndpointID != 7 || all[0].Fqdn != "world.example." || all[0].TTL != 300 || all[0].Source != "lookup" || all[1].TTL != 60 {
		t.Fatalf("entries: %+v", all)
	}
	code, body = do(t, "GET", ts.URL+"/v1/fqdn/cache/cilium-local:8?cidr=192.0.2.0/24")
	var one []models.DNSLookup
	if code != 200 || json.Unmarshal([]byte(body), &one) != nil || len(one) != 1 || len(one[0].Ips) != 1 || one[0].Ips[0] != "192.0.2.11" {
		t.Fatalf("by endpoint and cidr: %d %s", code, body)
	}
	if code, _ = do(t, "GET", ts.URL+"/v1/fqdn/cache/9"); code != 404 {
		t.Errorf("endpoint without entries: %d, want 404", code)
	}
	for _, bad := range []string{"/v1/fqdn/cache?matchpattern=a%20b", "/v1/fqdn/cache?cidr=300.0.0.0/8", "/v1/fqdn/cache/x", "/v1/fqdn/cache/0", "/v1/fqdn/cache?source=other"} {
		if code, body = do(t, "GET", ts.URL+bad); code != 400 || !strings.Contains(body, "message") && !strings.Contains(body, " ") {
			t.Errorf("GET %s: %d %s, want 400 with a message", bad, code, body)
		}
	}
	code, body = do(t, "GET", ts.URL+"/v1/fqdn/names")
	var nm models.NameManager
	if code != 200 || json.Unmarshal([]byte(body), &nm) != nil || len(nm.FQDNPolicySelectors) != 2 || nm.FQDNPolicySelectors[1].RegexString != `^api-[-a-zA-Z0-9_]*\.example\.$` {
		t.Fatalf("names: %d %s", code, body)
	}
	if code, body = do(t, "DELETE", ts.URL+"/v1/fqdn/cache?matchpattern=*.bad%3F"); code != 400 {
		t.Errorf("delete with a bad pattern: %d %s", code, body)
	}
	if code, _ = do(t, "DELETE", ts.URL+"/v1/fqdn/cache?matchpattern=api-*.example"); code != 200 || deleted != 1 {
		t.Fatalf("delete: %d, deleted callbacks %d", code, deleted)
	}
	if l := c.Lookups(0, ""); len(l) != 1 || l[0].Name != "world.example" {
		t.Fatalf("after delete: %+v", l)
	}
}
