package cli

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tendril-net/tendril/api/v1/server"
	"github.com/tendril-net/tendril/pkg/agent/nodehealth"
)

// TestHealthCommand: `tendril health` asks the agent's GET /v1/health
// and prints a row per node and address with each probe's outcome, its
// latency, and the errors of the probes that failed; a node not probed
// yet says so; this node's own health endpoint comes first, marked
// local; -o json prints the API's body.
func TestHealthCommand(t *testing.T) {
	now := time.Now()
	resp := nodehealth.HealthResponse{Self: "node-a", Interval: "10s", Nodes: []nodehealth.NodeHealth{
		{Name: "node-b", Reachable: true, Probed: true, Addresses: []nodehealth.Address{{
			IP:   netip.MustParseAddr("172.31.0.2"),
			ICMP: nodehealth.Result{Reachable: true, Latency: 210 * time.Microsecond, Probed: now},
			HTTP: nodehealth.Result{Reachable: true, Latency: 1100 * time.Microsecond, Probed: now},
		}, {
			IP: netip.MustParseAddr("10.0.1.7"), HealthEndpoint: true,
			ICMP: nodehealth.Result{Reachable: true, Latency: 300 * time.Microsecond, Probed: now},
			HTTP: nodehealth.Result{Reachable: true, Latency: 1200 * time.Microsecond, Probed: now},
		}}},
		{Name: "node-c", Probed: true, Addresses: []nodehealth.Address{{
			IP:   netip.MustParseAddr("172.31.0.3"),
			ICMP: nodehealth.Result{Error: "no echo reply within 5s", Probed: now},
			HTTP: nodehealth.Result{Error: "GET /hello: no answer within 5s", Probed: now},
		}}},
		{Name: "node-d", Addresses: []nodehealth.Address{}},
	}, Local: &nodehealth.NodeHealth{Name: "node-a", Reachable: true, Probed: true, Addresses: []nodehealth.Address{{
		IP: netip.MustParseAddr("10.0.0.9"), HealthEndpoint: true,
		ICMP: nodehealth.Result{Reachable: true, Latency: 90 * time.Microsecond, Probed: now},
		HTTP: nodehealth.Result{Reachable: true, Latency: 800 * time.Microsecond, Probed: now},
	}}}}
	sock := filepath.Join(t.TempDir(), "tendril.sock")
	srv, err := server.New(server.Config{Socket: sock}, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	srv.Handle(http.MethodGet, "/v1/health", func(w http.ResponseWriter, _ *http.Request) error {
		server.WriteJSON(w, http.StatusOK, resp)
		return nil
	})
	if err := srv.Listen(); err != nil {
		t.Fatal(err)
	}
	if err := srv.Serve(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Stop(context.Background()) })

	run := func(args ...string) string {
		t.Helper()
		var out bytes.Buffer
		cmd := NewRootCommand()
		cmd.SetOut(&out)
		cmd.SetArgs(append([]string{"-H", "unix://" + sock, "health"}, args...))
		if err := cmd.Execute(); err != nil {
			t.Fatal(err)
		}
		return out.String()
	}
	out := run()
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 8 || lines[0] != "Node health from node-a (probed every 10s): 1/3 nodes reachable" {
		t.Fatalf("output:\n%s", out)
	}
	for i, want := range [][]string{
		{"NODE", "ADDRESS", "ICMP", "HTTP", "LATENCY"},
		{"node-a (local)", "10.0.0.9 (endpoint)", "ok", "ok", "90µs/800µs"},
		{"node-b", "172.31.0.2", "ok", "ok", "210µs/1.1ms"},
		{"node-b", "10.0.1.7 (endpoint)", "ok", "ok", "300µs/1.2ms"},
		{"node-c", "172.31.0.3", "unreachable", "unreachable", "-/-", "icmp: no echo reply within 5s; http: GET /hello: no answer within 5s"},
		{"node-d", "not probed yet"},
	} {
		for _, w := range want {
			if !strings.Contains(lines[2+i], w) {
				t.Fatalf("line %d %q lacks %q:\n%s", 2+i, lines[2+i], w, out)
			}
		}
	}
	if js := run("-o", "json"); !strings.Contains(js, `"self": "node-a"`) || !strings.Contains(js, `"error": "no echo reply within 5s"`) ||
		!strings.Contains(js, `"health-endpoint": true`) {
		t.Fatalf("-o json:\n%s", js)
	}
}
