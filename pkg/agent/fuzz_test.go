package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/cilium/hive/cell"

	"github.com/tendril-net/tendril/api/v1/server"
)

// bodyRoutes are the routes that decode a JSON body: a body that is not
// JSON must get a 4xx there.
var bodyRoutes = regexp.MustCompile(`^(PUT /v1/policy|PUT /v1/endpoint/[^/]+|PATCH /v1/endpoint/[^/]+(/config|/labels)?|PATCH /v1/config|POST /v1/policy/trace)$`)

// FuzzAPI feeds method, path and body through the agent's real API handler
// (every subsystem's routes, the recovery and metrics wrappers), served by
// an in-process agent without the datapath: no input may panic a handler
// or get a 5xx other than 503 (not ready), and a route that decodes a JSON
// body answers a body that is not JSON with a 4xx.
//
// Not fuzzed: POST /v1/cni/add (it creates veths in the machine's own
// namespace; the CNI configuration and arguments have their own targets in
// pkg/cni) and /v1/statedb/ (its change streams do not end).
func FuzzAPI(f *testing.F) {
	for _, s := range []struct{ method, path, body string }{
		{"GET", "/v1/healthz", ""},
		{"GET", "/v1/config", ""},
		{"PATCH", "/v1/config", `{"options":{"Debug":"Enabled"}}`},
		{"PATCH", "/v1/config", `{"options":`},
		{"PUT", "/v1/policy", `[{"endpointSelector":{"matchLabels":{"app":"web"}},"ingress":[{"fromEndpoints":[{"matchLabels":{"app":"lb"}}]}]}]`},
		{"PUT", "/v1/policy", `[{"endpointSelector":{},"ingress":[{"toPorts":[{"ports":[{"port":"99999"}]}]}]}]`},
		{"DELETE", "/v1/policy", `["k8s:app=web"]`},
		{"GET", "/v1/policy?labels=x", ""},
		{"POST", "/v1/policy/trace", `{"from":["k8s:app=lb"],"to":["k8s:app=web"],"dport":[{"port":"80","protocol":"TCP"}]}`},
		{"PUT", "/v1/endpoint/cilium-local:0", `{"container-id":"abc","container-interface-name":"eth0","interface-name":"tdrfake0","k8s-namespace":"ns","k8s-pod-name":"web","sync-build-endpoint":true,"state":"waiting-for-identity","addressing":{"ipv4":"10.77.0.9"}}`},
		{"PUT", "/v1/endpoint/cilium-local:0", `{"addressing":{"ipv4":"not-an-ip"}}`},
		{"PATCH", "/v1/endpoint/1/labels", `{"add":["k8s:app=x"]}`},
		{"PATCH", "/v1/endpoint/1/config", `{"options":{"Debug":"Enabled"}}`},
		{"GET", "/v1/endpoint/container-id:abc", ""},
		{"GET", "/v1/endpoint/1/log", ""},
		{"DELETE", "/v1/endpoint/1", ""},
		{"DELETE", "/v1/endpoint", `{"container-id":"abc"}`},
		{"POST", "/v1/ipam?family=ipv4&owner=ns/pod&expiration=true", ""},
		{"POST", "/v1/ipam/10.77.0.5", ""},
		{"DELETE", "/v1/ipam/10.77.0.5", ""},
		{"DELETE", "/v1/ipam/nonsense", ""},
		{"GET", "/v1/identity/1", ""},
		{"GET", "/v1/identity/abc", ""},
		{"GET", "/v1/service/1", ""},
		{"GET", "/v1/map/nat", ""},
		{"GET", "/v1/health", ""},
		{"GET", "/v1/cluster/nodes", ""},
		{"GET", "/v1/map/../../etc/passwd", ""},
		{"POST", "/v1/cni/gc", `{"config":{"cniVersion":"1.1.0","name":"n","type":"tendril-cni","cni.dev/valid-attachments":[]}}`},
		{"POST", "/v1/cni/del", `{"container-id":"c1","ifname":"eth0","config":{"cniVersion":"1.1.0","name":"n","type":"tendril-cni"}}`},
		{"POST", "/v1/cni/status", `{"config":"x"}`},
		{"FROB", "/v1/healthz", ""},
	} {
		f.Add(s.method, s.path, []byte(s.body))
	}
	h := startAPIHandler(f)
	f.Fuzz(func(t *testing.T, method, path string, body []byte) {
		lower := strings.ToLower(path)
		if strings.Contains(lower, "cni") && strings.Contains(lower, "add") || strings.Contains(lower, "statedb") || strings.Contains(lower, "%") {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, method, "http://agent"+path, bytes.NewReader(body))
		if err != nil || req.URL.Host != "agent" {
			return
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		code := rec.Code
		if code >= 500 && code != http.StatusServiceUnavailable {
			t.Fatalf("%s %s with body %q: %d %s", method, path, body, code, rec.Body)
		}
		if route := req.Method + " " + req.URL.Path; bodyRoutes.MatchString(route) && !json.Valid(body) && code/100 != 4 {
			t.Fatalf("%s %s with a body that is not JSON (%q): %d %s", method, path, body, code, rec.Body)
		}
	})
}

// startAPIHandler runs an in-process agent (no datapath, no host
// networking: it leaves the machine alone) and returns its API handler.
func startAPIHandler(f *testing.F) http.Handler {
	dir := f.TempDir()
	flags := testFlags(dir, map[string]string{
		"bpf-root":   filepath.Join("/sys/fs/bpf", "tendril-fuzz-"+filepath.Base(dir)),
		"ipv4-range": "10.77.0.0/24", "ipv6-range": "fd00:77::/120",
	})
	var api *server.Server
	a, err := newTestAgent(Deps{Log: slog.New(slog.DiscardHandler)}, flags, cell.Invoke(func(s *server.Server) { api = s }))
	if err != nil {
		f.Fatal(err)
	}
	if err := a.Start(context.Background()); err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { _ = a.Stop(context.Background()) })
	return api.Handler()
}
