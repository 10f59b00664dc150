package nodehealth

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"

	"github.com/tendril-net/tendril/api/v1/server"
	"github.com/tendril-net/tendril/pkg/freeport"
	"github.com/tendril-net/tendril/pkg/health"
	"github.com/tendril-net/tendril/pkg/lifecycle"
	"github.com/tendril-net/tendril/pkg/metrics"
	"github.com/tendril-net/tendril/pkg/nodemanager"
	"github.com/tendril-net/tendril/pkg/option"
	"github.com/tendril-net/tendril/pkg/status"
	tutil "github.com/tendril-net/tendril/pkg/testutil"
)

// world is what the cell takes from the rest of the agent: the nodes
// table (writable here, as the node manager holds it), the node's name,
// jobs, health, metrics.
type world struct {
	db      *statedb.DB
	nodes   statedb.RWTable[*nodemanager.Peer]
	checker *Checker
	table   statedb.Table[*Status]
	status  []status.Contribution
	api     []server.Registrar
	metrics *metrics.Server
	cfg     Config
}

type worldIn struct {
	cell.In
	DB       *statedb.DB
	Tables   nodemanager.Tables
	Checker  *Checker
	Table    statedb.Table[*Status]
	Status   status.In
	Handlers server.HandlersIn
	Metrics  *metrics.Server
	Config   Config
}

func newHive(t *testing.T, flags map[string]string, w *world) *hive.Hive {
	t.Helper()
	h := hive.New(
		cell.Invoke(func(lifecycle.InvokedAll) {}),
		statedb.Cell,
		job.Cell,
		cell.Provide(
			func() option.LocalNode { return option.LocalNode{Name: "node-a"} },
			nodemanager.NewTables,
			func(t nodemanager.Tables) statedb.Table[*nodemanager.Peer] { return t.Nodes },
			health.NewRegistry,
			func(log *slog.Logger) *metrics.Server { return metrics.New(metrics.Config{}, log) },
		),
		Cell,
		cell.Invoke(func(in worldIn) {
			if w != nil {
				*w = world{db: in.DB, nodes: in.Tables.Nodes, checker: in.Checker, table: in.Table,
					status: in.Status.Contributions, api: in.Handlers.Handlers, metrics: in.Metrics, cfg: in.Config}
			}
		}),
	)
	for k, v := range flags {
		h.Viper().Set(k, v)
	}
	return h
}

// TestInvalidConfigRefused: an invalid option fails Populate, marked as a
// configuration error and naming the option.
func TestInvalidConfigRefused(t *testing.T) {
	for _, tc := range []struct{ flag, value string }{
		{"health-check-interval", "0s"},
		{"health-check-interval", "-10s"},
		{"health-check-interval", "1ms"},
		{"health-port", "0"},
	} {
		err := newHive(t, map[string]string{tc.flag: tc.value}, nil).Populate(hivetest.Logger(t))
		if err == nil {
			t.Errorf("--%s=%s accepted", tc.flag, tc.value)
			continue
		}
		if !option.IsInvalid(err) || !strings.Contains(err.Error(), tc.flag+" ") {
			t.Errorf("--%s=%s: %v (invalid %v); want a configuration error naming the option", tc.flag, tc.value, err, option.IsInvalid(err))
		}
	}
}

// TestConfigDefaultsAndFlags: the defaults are Cilium's (on, the health
// endpoint on, port 4240) with a 10 s interval, and each flag reaches the
// config.
func TestConfigDefaultsAndFlags(t *testing.T) {
	for _, c := range []struct {
		flags map[string]string
		want  Config
	}{
		{nil, Config{EnableHealthChecking: true, HealthCheckInterval: 10 * time.Second, HealthPort: 4240, EnableEndpointHealthChecking: true}},
		{map[string]string{"enable-health-checking": "false", "health-check-interval": "3s", "health-port": "4241", "enable-endpoint-health-checking": "false"},
			Config{EnableHealthChecking: false, HealthCheckInterval: 3 * time.Second, HealthPort: 4241}},
	} {
		var w world
		if err := newHive(t, c.flags, &w).Populate(hivetest.Logger(t)); err != nil {
			t.Fatal(err)
		}
		if w.cfg != c.want {
			t.Errorf("flags %v: config %+v, want %+v", c.flags, w.cfg, c.want)
		}
	}
}

// TestOffProvidesNothing: with health checking off the table is nil
// (provided, so readers are built), there is no status section, and
// GET /v1/health says it is off; /v1/cluster/nodes still answers.
func TestOffProvidesNothing(t *testing.T) {
	var w world
	start(t, newHive(t, map[string]string{"enable-health-checking": "false"}, &w))
	if w.checker != nil || w.table != nil {
		t.Fatalf("checker %v, table %v with health checking off", w.checker, w.table)
	}
	if len(status.Sections(w.status)) != 0 {
		t.Fatalf("status sections %+v with health checking off", status.Sections(w.status))
	}
	h := apiServer(t, w.api)
	if code, body := get(t, h, "/v1/health", nil); code != http.StatusNotFound || !strings.Contains(body, "enable-health-checking") {
		t.Fatalf("GET /v1/health: %d %s", code, body)
	}
	if code, body := get(t, h, "/v1/cluster/nodes", nil); code != http.StatusOK || !strings.Contains(body, `"self":"node-a"`) {
		t.Fatalf("GET /v1/cluster/nodes: %d %s", code, body)
	}
}

// TestCellProbesOverLoopback: the cell's responder answers GET /hello
// with the node's name, and its prober (the real ICMP and HTTP probes)
// finds a node whose address is loopback reachable through it; the
// result is in the typed table, the status, the API and the metrics.
func TestCellProbesOverLoopback(t *testing.T) {
	port, err := freeport.Loopback()
	if err != nil {
		t.Fatal(err)
	}
	var w world
	start(t, newHive(t, map[string]string{"health-port": strconv.Itoa(port), "health-check-interval": "200ms"}, &w))
	if w.table == nil || w.table.Name() != TableName {
		t.Fatalf("node-health table %v", w.table)
	}

	hello := "http://127.0.0.1:" + strconv.Itoa(port) + "/hello"
	var body string
	tutil.Eventually(t, 10*time.Second, "the responder", func() bool {
		resp, err := http.Get(hello)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		body = string(b)
		return resp.StatusCode == http.StatusOK
	})
	if strings.TrimSpace(body) != "node-a" {
		t.Fatalf("GET /hello answered %q, want the node's name", body)
	}

	wtxn := w.db.WriteTxn(w.nodes)
	if _, _, err := w.nodes.Insert(wtxn, &nodemanager.Peer{Name: "node-lo", IPs: []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("::1")}}); err != nil {
		t.Fatal(err)
	}
	wtxn.Commit()
	tutil.Eventually(t, 10*time.Second, "node-lo reachable on both addresses (IPv4 and IPv6)", func() bool {
		st, _, ok := w.table.Get(w.db.ReadTxn(), StatusByNode.Query("node-lo"))
		return ok && len(st.Addresses) == 2 && st.Addresses[0].Reachable() && st.Addresses[1].Reachable()
	})

	secs := status.Sections(w.status)
	if len(secs) != 1 || secs[0].Title != "Node health" || !strings.HasPrefix(secs[0].Lines[0].Value, "1/1 reachable") {
		t.Fatalf("status %+v", secs)
	}
	for _, typ := range []string{"icmp", "http"} {
		if v, ok := gauge(t, w.metrics, "tendril_node_connectivity_status", map[string]string{
			"source_node": "node-a", "target_node": "node-lo", "type": typ, "address_type": "node"}); !ok || v != 1 {
			t.Fatalf("tendril_node_connectivity_status{type=%q} = %v (found %v), want 1", typ, v, ok)
		}
		if v, ok := gauge(t, w.metrics, "tendril_node_connectivity_latency_seconds", map[string]string{
			"source_node": "node-a", "target_node": "node-lo", "type": typ, "address_type": "node"}); !ok || v <= 0 {
			t.Fatalf("tendril_node_connectivity_latency_seconds{type=%q} = %v (found %v), want > 0", typ, v, ok)
		}
	}
	var hr HealthResponse
	h := apiServer(t, w.api)
	code, raw := get(t, h, "/v1/health", nil)
	if err := json.Unmarshal([]byte(raw), &hr); code != http.StatusOK || err != nil {
		t.Fatalf("GET /v1/health: %d %s (%v)", code, raw, err)
	}
	if hr.Self != "node-a" || len(hr.Nodes) != 1 || !hr.Nodes[0].Reachable || !hr.Nodes[0].Addresses[0].HTTP.Reachable {
		t.Fatalf("GET /v1/health: %+v", hr)
	}
}

func start(t *testing.T, h *hive.Hive) {
	t.Helper()
	log := hivetest.Logger(t)
	if err := h.Start(log, context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := h.Stop(log, context.Background()); err != nil {
			t.Error(err)
		}
	})
}

// apiServer serves the registrars through the agent's API server's
// routing, as an http.Handler.
func apiServer(t *testing.T, regs []server.Registrar) http.Handler {
	s, err := server.New(server.Config{Socket: "/nonexistent/test.sock"}, hivetest.Logger(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range regs {
		r(s)
	}
	return s.Handler()
}

func get(t *testing.T, h http.Handler, path string, header http.Header) (int, string) {
	t.Helper()
	req := httptest.NewRequest(http.MethodGet, path, nil)
	for k, v := range header {
		req.Header[k] = v
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec.Code, rec.Body.String()
}

// gauge is the value of the gauge name with exactly these labels in the
// agent's registry.
func gauge(t *testing.T, m *metrics.Server, name string, labels map[string]string) (float64, bool) {
	t.Helper()
	fams, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
	next:
		for _, mt := range f.GetMetric() {
			if len(mt.GetLabel()) != len(labels) {
				continue
			}
			for _, l := range mt.GetLabel() {
				if labels[l.GetName()] != l.GetValue() {
					continue next
				}
			}
			return mt.GetGauge().GetValue(), true
		}
	}
	return 0, false
}
