package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/cilium/api/v1/models"
	"github.com/cilium/hive/cell"
	"github.com/spf13/pflag"

	"github.com/tendril-net/tendril/api/v1/ext"
	"github.com/tendril-net/tendril/pkg/agent/agentdatapath"
	"github.com/tendril-net/tendril/pkg/agent/agentendpoints"
	"github.com/tendril-net/tendril/pkg/agent/agentkv"
	"github.com/tendril-net/tendril/pkg/agent/agentpolicy"
	"github.com/tendril-net/tendril/pkg/agent/realizer"
	"github.com/tendril-net/tendril/pkg/client"
	"github.com/tendril-net/tendril/pkg/freeport"
	"github.com/tendril-net/tendril/pkg/identity"
	"github.com/tendril-net/tendril/pkg/metrics"
	"github.com/tendril-net/tendril/pkg/option"
)

// testAgent is an agent with the objects its tests inspect, taken from its
// hive.
type testAgent struct {
	*Agent
	endpoints  *agentendpoints.Module
	policy     *agentpolicy.Module
	kvstore    *agentkv.Module
	datapath   *agentdatapath.Module
	realizer   *realizer.Realizer
	metrics    *metrics.Server
	identities identity.Allocator
	// socket is the API socket of an agent startAgent started.
	socket string
}

// newTestAgent builds an agent the way the command does: its cells'
// flags registered on a flag set, set to flags (name: value, as on the
// command line; a list's values separated by commas), then the hive
// populated.
func newTestAgent(deps Deps, flags map[string]string, extra ...cell.Cell) (*testAgent, error) {
	ta := &testAgent{}
	a := New(append(extra, cell.Invoke(func(e *agentendpoints.Module, p *agentpolicy.Module, kv *agentkv.Module, dp *agentdatapath.Module,
		r *realizer.Realizer, m *metrics.Server, ids identity.Allocator) {
		ta.endpoints, ta.policy, ta.kvstore, ta.datapath, ta.realizer, ta.metrics, ta.identities = e, p, kv, dp, r, m, ids
	}))...)
	fs := newFlagSet(a)
	for _, name := range slices.Sorted(maps.Keys(flags)) {
		if err := fs.Set(name, flags[name]); err != nil {
			return nil, fmt.Errorf("--%s=%s: %w", name, flags[name], err)
		}
	}
	if deps.Flags == nil {
		deps.Flags = fs
	}
	if err := a.Populate(deps); err != nil {
		return nil, err
	}
	ta.Agent = a
	return ta, nil
}

// newFlagSet is a flag set with a's flags, as the command's.
func newFlagSet(a *Agent) *pflag.FlagSet {
	fs := pflag.NewFlagSet("tendril-agent", pflag.ContinueOnError)
	a.RegisterFlags(fs)
	return fs
}

// testFlags are the flags of an in-process test agent: its own state dir,
// API socket and bpffs root under dir, no metrics listener, node-a, the
// machine's own network namespace left alone and no datapath; more are
// set over them.
func testFlags(dir string, more map[string]string) map[string]string {
	flags := map[string]string{
		"state-dir":               filepath.Join(dir, "state"),
		"socket":                  filepath.Join(dir, "run", "tendril.sock"),
		"bpf-root":                filepath.Join("/sys/fs/bpf", "tendril-test-"+filepath.Base(dir)),
		"prometheus-serve-addr":   "",
		"node-name":               "node-a",
		"install-host-networking": "false",
		"enable-datapath":         "false",
		// The health responder listens on every address of the
		// machine's namespace: not on the port of an agent running there.
		"health-port": freeHealthPort(),
	}
	maps.Copy(flags, more)
	return flags
}

// freeHealthPort is a TCP port nothing listens on and the kernel does
// not hand out as a source port, for an agent's --health-port.
func freeHealthPort() string {
	port, err := freeport.Loopback()
	if err != nil {
		panic(fmt.Sprintf("a free health port: %v", err))
	}
	return strconv.Itoa(port)
}

// startAgent runs an agent in-process with its own state dir and socket,
// the flags of more, and the extra cells.
func startAgent(t *testing.T, more map[string]string, extra ...cell.Cell) (*testAgent, *client.Client) {
	t.Helper()
	flags := testFlags(t.TempDir(), more)
	a, err := newTestAgent(Deps{Log: testLogger(t)}, flags, extra...)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Stop(context.Background()) })
	a.socket = flags["socket"]
	c, err := client.New("unix://" + flags["socket"])
	if err != nil {
		t.Fatal(err)
	}
	return a, c
}

func TestHealthzThroughSocket(t *testing.T) {
	_, c := startAgent(t, nil)
	ctx := context.Background()
	var st ext.StatusResponse
	if err := c.Do(ctx, http.MethodGet, "/healthz", nil, nil, nil, &st); err != nil {
		t.Fatal(err)
	}
	if st.Cilium == nil || st.Cilium.State != models.StatusStateOk {
		t.Fatalf("cilium state = %+v", st.Cilium)
	}
	if st.Tendril == nil || st.Tendril.NodeName != "node-a" {
		t.Fatalf("tendril status = %+v", st.Tendril)
	}
	names := map[string]bool{}
	var order []string
	for _, s := range st.Tendril.Bootstrap.Steps {
		names[s.Name] = true
		order = append(order, s.Name)
	}
	for _, want := range []string{"config", "metrics", "api-server"} {
		if !names[want] {
			t.Errorf("bootstrap stats lack step %s: %+v", want, st.Tendril.Bootstrap.Steps)
		}
	}
	// The steps started in the seeds' order (standalone, no datapath).
	want := []string{"config", "endpoint-restore-ipam", "policy-restore", "regenerate-restored",
		"policy-regeneration", "metrics", "pprof", "api-server"}
	if strings.Join(order, " ") != strings.Join(want, " ") {
		t.Errorf("bootstrap steps started in the order %v, want %v", order, want)
	}
	// The sections come in their order keys' order (pkg/status), as
	// `tendril status` always printed them; a section a new subsystem
	// adds may sit anywhere between them.
	var titles []string
	for _, s := range st.Tendril.Sections {
		if slices.Contains([]string{"Services", "Node health", "IPAM", "Identities"}, s.Title) {
			titles = append(titles, s.Title)
		}
	}
	if got, want := strings.Join(titles, ", "), "Services, Node health, IPAM, Identities"; got != want {
		t.Errorf("status sections %s, want %s", got, want)
	}
	if st.Tendril.Bootstrap.Total <= 0 {
		t.Errorf("bootstrap total %v", st.Tendril.Bootstrap.Total)
	}
	for _, m := range st.Tendril.Modules {
		if m.Level != "Ok" || m.Since.IsZero() {
			t.Errorf("module %+v not ok", m)
		}
	}
	// brief answers only the overall state.
	var brief ext.StatusResponse
	if err := c.Do(ctx, http.MethodGet, "/healthz", nil, http.Header{"Brief": {"true"}}, nil, &brief); err != nil {
		t.Fatal(err)
	}
	if brief.Tendril != nil || brief.Cilium.State != models.StatusStateOk {
		t.Fatalf("brief = %+v", brief)
	}
	err := c.Do(ctx, http.MethodGet, "/healthz", nil, http.Header{"Brief": {"maybe"}}, nil, &brief)
	assertAPIError(t, err, 400, "header brief")
}

// TestHealthzReportsAttachMode: the v1 status's attach-mode is the one the
// agent attaches with.
func TestHealthzReportsAttachMode(t *testing.T) {
	for _, tc := range []struct {
		flag string
		want models.AttachMode
	}{{"tcx", models.AttachModeTcx}, {"tc", models.AttachModeTc}} {
		_, c := startAgent(t, map[string]string{"datapath-attach-mode": tc.flag})
		var st ext.StatusResponse
		if err := c.Do(context.Background(), http.MethodGet, "/healthz", nil, nil, nil, &st); err != nil {
			t.Fatal(err)
		}
		if st.AttachMode != tc.want {
			t.Errorf("--datapath-attach-mode=%s: attach-mode %q, want %q", tc.flag, st.AttachMode, tc.want)
		}
	}
}

// TestHealthzNamesAnAttachModeFallback: when the kernel made the agent
// fall back from tcx to tc (the datapath cell sets the note from
// loader.ResolveAttachMode), the status names it in a Datapath section.
func TestHealthzNamesAnAttachModeFallback(t *testing.T) {
	_, c := startAgent(t, map[string]string{"datapath-attach-mode": "tc"},
		cell.DecorateAll(func(m agentdatapath.AttachMode) agentdatapath.AttachMode {
			m.Note = "the kernel has no TCX links"
			return m
		}))
	var st ext.StatusResponse
	if err := c.Do(context.Background(), http.MethodGet, "/healthz", nil, nil, nil, &st); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, sec := range st.Tendril.Sections {
		for _, l := range sec.Lines {
			if sec.Title == "Datapath" && l.Key == "attach mode" && strings.Contains(l.Value, "no TCX") {
				found = true
			}
		}
	}
	if !found || st.AttachMode != models.AttachModeTc {
		t.Errorf("status after a fallback: attach-mode %q, sections %+v", st.AttachMode, st.Tendril.Sections)
	}
}

func TestHealthzReportsAFailedModule(t *testing.T) {
	a, c := startAgent(t, nil)
	a.Health().Reporter("datapath").Failed("map full")
	var st ext.StatusResponse
	if err := c.Do(context.Background(), http.MethodGet, "/healthz", nil, nil, nil, &st); err != nil {
		t.Fatal(err)
	}
	if st.Cilium.State != models.StatusStateFailure || !strings.Contains(st.Cilium.Msg, "datapath: map full") {
		t.Fatalf("cilium = %+v", st.Cilium)
	}
}

func TestConfigGetAndPatch(t *testing.T) {
	_, c := startAgent(t, nil)
	ctx := context.Background()
	get := func() *models.DaemonConfiguration {
		var cfg models.DaemonConfiguration
		if err := c.Do(ctx, http.MethodGet, "/config", nil, nil, nil, &cfg); err != nil {
			t.Fatal(err)
		}
		return &cfg
	}
	cfg := get()
	if cfg.Spec.PolicyEnforcement != option.EnforcementDefault || cfg.Status.DeviceMTU != 1500 ||
		cfg.Status.DatapathMode != models.DatapathModeVeth || cfg.Status.Addressing == nil || !cfg.Status.Addressing.IPV4.Enabled {
		t.Fatalf("config = %+v / %+v", cfg.Spec, cfg.Status)
	}
	if cfg.Status.DaemonConfigurationMap["node-name"] != "node-a" {
		t.Fatalf("effective map lacks node-name: %v", cfg.Status.DaemonConfigurationMap)
	}

	tests := []struct {
		name     string
		body     any
		wantCode int
		wantMsg  string
	}{
		{"enforcement always", models.DaemonConfigurationSpec{PolicyEnforcement: "always"}, 0, ""},
		{"debug on", models.DaemonConfigurationSpec{Options: models.ConfigurationMap{"Debug": "Enabled"}}, 0, ""},
		{"bad mode", models.DaemonConfigurationSpec{PolicyEnforcement: "sometimes"}, 400, "must be default, always or never"},
		{"immutable", models.DaemonConfigurationSpec{Options: models.ConfigurationMap{"state-dir": "/x"}}, 403, "cannot change at run time"},
		{"unknown", models.DaemonConfigurationSpec{Options: models.ConfigurationMap{"Bogus": "1"}}, 400, "unknown option Bogus"},
		{"malformed", "not an object", 400, "malformed JSON body"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := c.Do(ctx, http.MethodPatch, "/config", nil, nil, tt.body, nil)
			if tt.wantCode == 0 {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			assertAPIError(t, err, tt.wantCode, tt.wantMsg)
		})
	}
	cfg = get()
	if cfg.Spec.PolicyEnforcement != "always" || cfg.Spec.Options["Debug"] != "Enabled" {
		t.Fatalf("after patch: %+v", cfg.Spec)
	}
	if cfg.Status.DaemonConfigurationMap["policy-enforcement"] != "always" {
		t.Fatalf("effective map not updated: %v", cfg.Status.DaemonConfigurationMap["policy-enforcement"])
	}
}

func TestDebugInfo(t *testing.T) {
	t.Setenv("TENDRIL_EXAMPLE", "1")
	_, c := startAgent(t, nil)
	var info models.DebugInfo
	if err := c.Do(context.Background(), http.MethodGet, "/debuginfo", nil, nil, nil, &info); err != nil {
		t.Fatal(err)
	}
	if info.KernelVersion == "" || info.CiliumStatus == nil || !strings.Contains(info.CiliumVersion, "tendril") {
		t.Fatalf("debuginfo = %+v", info)
	}
	found := false
	for _, e := range info.EnvironmentVariables {
		found = found || e == "TENDRIL_EXAMPLE=1"
	}
	if !found {
		t.Fatalf("env = %v", info.EnvironmentVariables)
	}
}

func TestStartFailureRollsBack(t *testing.T) {
	// An address that cannot be listened on makes the metrics module fail
	// after config started; the agent must stop what it started.
	flags := testFlags(t.TempDir(), map[string]string{"prometheus-serve-addr": "256.0.0.1:1", "node-name": "n"})
	a, err := newTestAgent(Deps{}, flags)
	if err != nil {
		t.Fatal(err)
	}
	err = a.Start(context.Background())
	if err == nil || !strings.Contains(err.Error(), "start metrics") {
		t.Fatalf("Start = %v, want metrics failure", err)
	}
	c, _ := client.New("unix://" + flags["socket"])
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := c.Do(ctx, http.MethodGet, "/healthz", nil, nil, nil, nil); err == nil {
		t.Fatal("API served although start failed")
	}
}

func TestInvalidConfigIsRejected(t *testing.T) {
	tests := []struct {
		name  string
		flags map[string]string
		want  string
	}{
		{"relative state dir", map[string]string{"state-dir": "state"}, "state-dir"},
		{"bad enforcement", map[string]string{"policy-enforcement": "x"}, "policy-enforcement"},
		{"bad revoke mode", map[string]string{"policy-revoke-established": "some"}, "policy-revoke-established"},
		{"bad log format", map[string]string{"log-format": "xml"}, "log-format"},
		{"bad external IP range", map[string]string{"service-external-ip-cidrs": "198.51.100.0/33"}, "service-external-ip-cidrs"},
		{"bad mtu", map[string]string{"mtu": "10"}, "mtu"},
		{"bad attach mode", map[string]string{"datapath-attach-mode": "xdp"}, "datapath-attach-mode"},
		// bpffs refuses dots in names; mkdir's EPERM read like a mount
		// or permission problem.
		{"dot in a bpf-root name", map[string]string{"bpf-root": "/sys/fs/bpf/tendril-test.1"}, `bpf-root "/sys/fs/bpf/tendril-test.1": name "tendril-test.1" holds a dot`},
		{"relative bpf-root", map[string]string{"bpf-root": "tendril"}, "bpf-root"},
		{"bad trace events", map[string]string{"hubble-trace-events": "some"}, "hubble-trace-events"},
		{"empty flow buffer", map[string]string{"hubble-flow-buffer-size": "0"}, "hubble-flow-buffer-size"},
		{"relative hubble socket", map[string]string{"hubble-socket": "hubble.sock"}, "hubble-socket"},
		{"hubble TCP without TLS files", map[string]string{"hubble-listen-address": "127.0.0.1:4244"}, "--hubble-disable-tls"},
		{"hubble TCP address without a port", map[string]string{"hubble-listen-address": "127.0.0.1"}, "hubble-listen-address"},
		{"hubble plain text and TLS files", map[string]string{
			"hubble-listen-address": ":4244", "hubble-disable-tls": "true", "hubble-tls-cert-file": "/x.crt",
		}, "hubble-disable-tls with TLS files"},
		{"hubble TLS files missing", map[string]string{
			"hubble-listen-address": ":4244", "hubble-tls-cert-file": "/nonexistent/x.crt", "hubble-tls-key-file": "/nonexistent/x.key",
			"hubble-tls-client-ca-files": "/nonexistent/ca.crt",
		}, "hubble TLS: load TLS certificate /nonexistent/x.crt"},
		{"hubble TLS without client CAs", map[string]string{
			"hubble-listen-address": ":4244", "hubble-tls-cert-file": "/x.crt", "hubble-tls-key-file": "/x.key",
		}, "--hubble-tls-client-ca-files"},
		{"hubble client CAs and no client auth", map[string]string{
			"hubble-listen-address": ":4244", "hubble-tls-cert-file": "/x.crt", "hubble-tls-key-file": "/x.key",
			"hubble-tls-client-ca-files": "/ca.crt", "hubble-disable-client-auth": "true",
		}, "choose one"},
		{"hubble streams unbounded", map[string]string{"hubble-max-concurrent-streams": "0"}, "hubble-max-concurrent-streams"},
		{"hubble connections unbounded", map[string]string{"hubble-max-connections": "0"}, "hubble-max-connections"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// Every other option at its default, as before the cells
			// owned their flags.
			var log strings.Builder
			_, err := newTestAgent(Deps{Log: slog.New(slog.NewTextHandler(&log, nil))}, tt.flags)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("New = %v, want error naming %s", err, tt.want)
			}
			// The error is returned, not also logged: the command
			// reports it once.
			if strings.Contains(log.String(), tt.want) {
				t.Fatalf("the invalid option was logged too:\n%s", log.String())
			}
		})
	}
}

func assertAPIError(t *testing.T, err error, code int, msg string) {
	t.Helper()
	var apiErr *client.APIError
	if !errors.As(err, &apiErr) {
		t.Fatalf("error = %v, want API error %d", err, code)
	}
	if apiErr.Code != code || !strings.Contains(apiErr.Message, msg) {
		t.Fatalf("API error = %d %q, want %d containing %q", apiErr.Code, apiErr.Message, code, msg)
	}
}

func TestMetricsServed(t *testing.T) {
	a, c := startAgent(t, map[string]string{"prometheus-serve-addr": "127.0.0.1:0"})
	if err := c.Do(context.Background(), http.MethodGet, "/healthz", nil, nil, nil, nil); err != nil {
		t.Fatal(err)
	}
	_ = c.Do(context.Background(), http.MethodGet, "/nope", nil, nil, nil, nil)
	resp, err := http.Get("http://" + a.metrics.Addr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for _, want := range []string{
		"go_goroutines",
		`tendril_api_requests_total{code="200",method="GET",path="/v1/healthz"} 1`,
		`tendril_api_requests_total{code="404",method="GET",path="unmatched"} 1`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}

// testLogger logs through t.Log so a failing test shows the agent's log.
func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
