package identityapi

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/cilium/cilium/api/v1/models"
	"github.com/cilium/statedb"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tendril-net/tendril/api/v1/server"
	"github.com/tendril-net/tendril/pkg/endpoint"
	"github.com/tendril-net/tendril/pkg/identity"
	"github.com/tendril-net/tendril/pkg/identity/identitytable"
)

// serve registers the handlers on a real API server and serves it.
func serve(t *testing.T, h *Handlers) *httptest.Server {
	t.Helper()
	srv, err := server.New(server.DefaultConfig(), slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	h.Register(srv)
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(ts.Close)
	return ts
}

func get(t *testing.T, ts *httptest.Server, path, body string, out any) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, ts.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode == http.StatusOK && out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("GET %s: %v: %s", path, err, b)
		}
	}
	return resp.StatusCode
}

// TestIdentitiesFromTheTable: the API lists the reserved identities and
// the table's, finds one by ID and by labels, counts the endpoints per
// identity, and answers 404 for /v1/ip without the datapath.
func TestIdentitiesFromTheTable(t *testing.T) {
	alloc := identity.NewLocalAllocator()
	web, _, err := alloc.Allocate([]string{"k8s:app=web", "k8s:io.kubernetes.pod.namespace=shop"})
	if err != nil {
		t.Fatal(err)
	}
	tbl, err := identitytable.New(statedb.New(), alloc, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	eps := []*endpoint.Endpoint{{ID: 1, Identity: uint32(web.ID)}, {ID: 2, Identity: uint32(web.ID)}, {ID: 3, Identity: uint32(identity.Host)}}
	ts := serve(t, &Handlers{Identities: tbl, Endpoints: func() ([]*endpoint.Endpoint, error) { return eps, nil }})

	var all []*models.Identity
	if code := get(t, ts, "/v1/identity", "", &all); code != http.StatusOK {
		t.Fatalf("list: %d", code)
	}
	foundWeb, foundWorld := false, false
	for _, id := range all {
		foundWeb = foundWeb || id.ID == int64(web.ID)
		foundWorld = foundWorld || id.ID == int64(identity.World)
	}
	if !foundWeb || !foundWorld {
		t.Fatalf("list lacks web (%v) or world (%v): %d identities", foundWeb, foundWorld, len(all))
	}
	var one models.Identity
	if code := get(t, ts, "/v1/identity/"+web.ID.String(), "", &one); code != http.StatusOK || len(one.Labels) != 2 || one.LabelsSHA256 == "" {
		t.Fatalf("get: %d %+v", code, one)
	}
	var byLabels []*models.Identity
	if code := get(t, ts, "/v1/identity", `["k8s:app=web"]`, &byLabels); code != http.StatusOK || len(byLabels) != 1 || byLabels[0].ID != int64(web.ID) {
		t.Fatalf("by labels: %d %+v", code, byLabels)
	}
	if code := get(t, ts, "/v1/identity", `["k8s:app=none"]`, nil); code != http.StatusNotFound {
		t.Fatalf("unknown labels: %d, want 404", code)
	}
	if code := get(t, ts, "/v1/identity/60000", "", nil); code != http.StatusNotFound {
		t.Fatalf("unknown identity: %d, want 404", code)
	}
	var counts []*models.IdentityEndpoints
	if code := get(t, ts, "/v1/identity/endpoints", "", &counts); code != http.StatusOK || len(counts) != 2 ||
		counts[0].Identity.ID != int64(identity.Host) || counts[0].RefCount != 1 || counts[1].RefCount != 2 {
		t.Fatalf("endpoints per identity: %d %+v", code, counts)
	}
	if code := get(t, ts, "/v1/ip", "", nil); code != http.StatusNotFound {
		t.Fatalf("/v1/ip without the datapath: %d, want 404", code)
	}
	st := StatusSection(alloc, tbl)
	if len(st.Lines) != 2 || st.Lines[0].Value != "local" || st.Lines[1].Value != "1 cluster identities, 1 used on this node" {
		t.Fatalf("status section %+v", st)
	}
}
