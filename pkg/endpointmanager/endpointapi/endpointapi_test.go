package endpointapi

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/cilium/cilium/api/v1/models"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tendril-net/tendril/api/v1/server"
	"github.com/tendril-net/tendril/pkg/endpoint"
	"github.com/tendril-net/tendril/pkg/endpointmanager"
)

// serve registers the handlers, over a real endpoint manager with its
// store in a temporary directory, on a real API server.
func serve(t *testing.T) (*httptest.Server, *endpointmanager.Manager) {
	t.Helper()
	store, err := endpoint.NewStore(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	mgr := endpointmanager.New(store, nil, nil)
	srv, err := server.New(server.DefaultConfig(), slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	h := &Handlers{
		Log:            slog.New(slog.DiscardHandler),
		Manager:        func() (*endpointmanager.Manager, error) { return mgr, nil },
		NodeAddressing: func() *models.NodeAddressing { return &models.NodeAddressing{} },
		ApplyPodLabels: func(context.Context, *endpoint.Endpoint) {},
		PolicyModel:    func(*endpoint.Endpoint) *models.EndpointPolicyStatus { return nil },
	}
	h.Register(srv)
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(ts.Close)
	return ts, mgr
}

func do(t *testing.T, ts *httptest.Server, method, path, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, ts.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestPutRejectsEndpointIDsOutOfRange: an ID in the body or the path that
// does not fit (above MaxID, above 65535, negative) is a 400 that names
// it, and creates nothing; before, "id": 65537 wrapped to endpoint 1.
func TestPutRejectsEndpointIDsOutOfRange(t *testing.T) {
	for _, c := range []struct{ path, id string }{
		{"/v1/endpoint/0", "65537"},
		{"/v1/endpoint/0", "65536"},
		{"/v1/endpoint/0", "4096"},
		{"/v1/endpoint/0", "-1"},
		{"/v1/endpoint/cilium-local:0", "70000"},
		{"/v1/endpoint/65537", "0"},
		{"/v1/endpoint/4096", "0"},
		{"/v1/endpoint/cilium-local:65537", "0"},
	} {
		ts, mgr := serve(t)
		body := `{"id":` + c.id + `,"container-id":"c1","addressing":{"ipv4":"10.0.0.5"}}`
		code, msg := do(t, ts, http.MethodPut, c.path, body)
		if code != http.StatusBadRequest {
			t.Errorf("PUT %s with id %s: %d %s, want 400", c.path, c.id, code, msg)
		}
		if eps := mgr.List(); len(eps) != 0 {
			t.Errorf("PUT %s with id %s created endpoint %d", c.path, c.id, eps[0].ID)
		}
	}
}

// TestPutBodyIDDisagreeingWithPath: a body ID that names another
// endpoint than the path's is a 400, not a silent choice of one.
func TestPutBodyIDDisagreeingWithPath(t *testing.T) {
	ts, mgr := serve(t)
	code, msg := do(t, ts, http.MethodPut, "/v1/endpoint/7", `{"id":8,"container-id":"c1","addressing":{"ipv4":"10.0.0.5"}}`)
	if code != http.StatusBadRequest {
		t.Errorf("PUT /v1/endpoint/7 with id 8: %d %s, want 400", code, msg)
	}
	if len(mgr.List()) != 0 {
		t.Errorf("an endpoint was created")
	}
	// The body's ID alone, and the same ID twice, are fine.
	for i, c := range []struct{ path, body string }{
		{"/v1/endpoint/0", `{"id":9,"container-id":"c2","addressing":{"ipv4":"10.0.0.6"}}`},
		{"/v1/endpoint/10", `{"id":10,"container-id":"c3","addressing":{"ipv4":"10.0.0.7"}}`},
	} {
		if code, msg := do(t, ts, http.MethodPut, c.path, c.body); code != http.StatusCreated {
			t.Errorf("PUT %d %s: %d %s, want 201", i, c.path, code, msg)
		}
	}
	for _, id := range []string{"9", "10"} {
		if _, err := mgr.Lookup(id); err != nil {
			t.Errorf("endpoint %s: %v", id, err)
		}
	}
}

// TestLabelsWithSeparatorsAreRejected: a label holding ';' or ',' (the
// separators of a label set's key and string form) is a 400 on every path
// that sets an endpoint's labels, and changes nothing.
func TestLabelsWithSeparatorsAreRejected(t *testing.T) {
	ts, mgr := serve(t)
	if code, msg := do(t, ts, http.MethodPut, "/v1/endpoint/5", `{"container-id":"c0","labels":["k8s:app=a"],"addressing":{"ipv4":"10.0.0.4"}}`); code != http.StatusCreated {
		t.Fatalf("PUT a good endpoint: %d %s", code, msg)
	}
	for _, bad := range []string{`k8s:app=a;k8s:role=admin`, `k8s:app=a,k8s:role=admin`, ``} {
		body := `{"container-id":"c1","labels":["` + bad + `"],"addressing":{"ipv4":"10.0.0.5"}}`
		if code, msg := do(t, ts, http.MethodPut, "/v1/endpoint/0", body); code != http.StatusBadRequest {
			t.Errorf("PUT with label %q: %d %s, want 400", bad, code, msg)
		}
		if code, msg := do(t, ts, http.MethodPatch, "/v1/endpoint/5", `{"labels":["`+bad+`"]}`); code != http.StatusBadRequest {
			t.Errorf("PATCH with label %q: %d %s, want 400", bad, code, msg)
		}
		if code, msg := do(t, ts, http.MethodPatch, "/v1/endpoint/5/labels", `{"user":["`+bad+`"]}`); code != http.StatusBadRequest {
			t.Errorf("PATCH labels with %q: %d %s, want 400", bad, code, msg)
		}
	}
	eps := mgr.List()
	if len(eps) != 1 || len(eps[0].Labels) != 1 || eps[0].Labels[0] != "k8s:app=a" {
		for _, ep := range eps {
			t.Errorf("endpoint %d has labels %q", ep.ID, ep.Labels)
		}
	}
}
