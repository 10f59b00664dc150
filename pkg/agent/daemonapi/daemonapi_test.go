package daemonapi

import (
	"context"
	"errors"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/cilium/api/v1/models"
	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"
	"github.com/spf13/pflag"

	"github.com/tendril-net/tendril/api/v1/ext"
	"github.com/tendril-net/tendril/api/v1/server"
	"github.com/tendril-net/tendril/pkg/agent/agentdatapath"
	"github.com/tendril-net/tendril/pkg/agent/agentendpoints"
	"github.com/tendril-net/tendril/pkg/client"
	"github.com/tendril-net/tendril/pkg/datapath/loader"
	"github.com/tendril-net/tendril/pkg/health"
	"github.com/tendril-net/tendril/pkg/lifecycle"
	"github.com/tendril-net/tendril/pkg/logging"
	"github.com/tendril-net/tendril/pkg/option"
	"github.com/tendril-net/tendril/pkg/status"
)

// addressing is the endpoints' IPAM as the config handler shows it.
type addressing struct{}

func (addressing) NodeAddressing() *models.NodeAddressing {
	return &models.NodeAddressing{IPV4: &models.NodeAddressingElement{Enabled: true, AllocRange: "10.77.3.0/24"}}
}

// world is what the cell takes from the rest of the agent, with a real
// API server on a unix socket under a temp dir, served while the hive
// runs; it returns the health registry and a client of the socket.
func world(t *testing.T, attach agentdatapath.AttachMode) (cell.Cell, *health.Registry, *client.Client) {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "tendril.sock")
	fs := pflag.NewFlagSet("tendril-agent", pflag.ContinueOnError)
	option.DefaultAgent().Flags(fs)
	agentendpoints.DefaultConfig().Flags(fs)
	if err := fs.Parse([]string{"--node-name=node-a", "--mtu=1400", "--ipv4-range=10.77.3.0/24"}); err != nil {
		t.Fatal(err)
	}
	reg := health.NewRegistry()
	c, err := client.New("unix://" + sock)
	if err != nil {
		t.Fatal(err)
	}
	return cell.Group(
		cell.Provide(
			func() option.LocalNode { return option.LocalNode{Name: "node-a"} },
			func() agentdatapath.AttachMode { return attach },
			func() agentendpoints.Config { cfg := agentendpoints.DefaultConfig(); cfg.MTU = 1400; return cfg },
			func() Flags { return Flags{Set: fs} },
			func() Addressing { return addressing{} },
			func() *option.Runtime {
				return option.NewRuntime(option.RuntimeValues{PolicyEnforcement: option.EnforcementDefault})
			},
			func() *health.Registry { return reg },
			lifecycle.NewSteps,
			func(root cell.RootLogger) (*server.Server, error) {
				return server.New(server.Config{Socket: sock}, logging.For(root, "api"), nil)
			},
			func() status.Out {
				return status.Provide(status.Contribution{Order: 90, Section: status.Always(func() ext.Section {
					return ext.Section{Title: "Test", Lines: []ext.Line{{Key: "k", Value: "v"}}}
				})})
			},
		),
		// A start step the status reports, then the API served.
		cell.Invoke(func(lc cell.Lifecycle, steps *lifecycle.Steps, api *server.Server) {
			steps.Append(lc, "config", func(context.Context) error { return nil }, nil)
			lc.Append(cell.Hook{
				OnStart: func(cell.HookContext) error {
					if err := api.Listen(); err != nil {
						return err
					}
					return api.Serve()
				},
				OnStop: func(ctx cell.HookContext) error { return api.Stop(ctx) },
			})
		}),
	), reg, c
}

func start(t *testing.T, cells ...cell.Cell) {
	t.Helper()
	h := hive.New(append([]cell.Cell{cell.Invoke(func(lifecycle.InvokedAll) {}), statedb.Cell, job.Cell}, cells...)...)
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

// TestHealthz: /v1/healthz answers with what the hive holds: the node's
// name, the start steps, the modules' health (a degraded module makes the
// Cilium state a warning naming it), the subsystems' sections and the
// attach mode with its fallback note; the brief form only the state.
func TestHealthz(t *testing.T) {
	w, reg, c := world(t, agentdatapath.AttachMode{Mode: loader.AttachTC, Note: "no TCX in this kernel"})
	start(t, w, Cell)
	ctx := context.Background()

	var st ext.StatusResponse
	if err := c.Do(ctx, http.MethodGet, "/healthz", nil, nil, nil, &st); err != nil {
		t.Fatal(err)
	}
	if st.Cilium == nil || st.Cilium.State != models.StatusStateOk {
		t.Fatalf("state %+v with every module healthy, want Ok", st.Cilium)
	}
	if st.Tendril == nil || st.Tendril.NodeName != "node-a" {
		t.Fatalf("tendril status %+v, want node-a", st.Tendril)
	}
	if len(st.Tendril.Bootstrap.Steps) != 1 || st.Tendril.Bootstrap.Steps[0].Name != "config" {
		t.Fatalf("bootstrap steps %+v, want the config step", st.Tendril.Bootstrap.Steps)
	}
	if st.AttachMode != models.AttachModeTc {
		t.Fatalf("attach mode %q, want tc", st.AttachMode)
	}
	var titles []string
	var note string
	for _, s := range st.Tendril.Sections {
		titles = append(titles, s.Title)
		if s.Title == "Datapath" && len(s.Lines) == 1 {
			note = s.Lines[0].Value
		}
	}
	if !slices.Contains(titles, "Test") || !strings.Contains(note, "tc (fallback): no TCX in this kernel") {
		t.Fatalf("sections %v, datapath note %q; want the contributed section and the fallback note", titles, note)
	}
	if st.Kubernetes == nil || st.Kubernetes.State != models.StatusStateDisabled {
		t.Fatalf("kubernetes %+v with no contribution filling it, want disabled", st.Kubernetes)
	}

	reg.Reporter("policy").Degraded("recompiling")
	var brief ext.StatusResponse
	if err := c.Do(ctx, http.MethodGet, "/healthz", nil, http.Header{"brief": []string{"true"}}, nil, &brief); err != nil {
		t.Fatal(err)
	}
	if brief.Cilium == nil || brief.Cilium.State != models.StatusStateWarning || !strings.Contains(brief.Cilium.Msg, "policy: recompiling") {
		t.Fatalf("brief state %+v with a degraded module, want a warning naming it", brief.Cilium)
	}
	if brief.Tendril != nil {
		t.Fatalf("brief status has the full part: %+v", brief.Tendril)
	}
}

// TestConfig: GET /v1/config is the flags' values (the runtime options
// changeable, the rest immutable), the endpoints' MTU and the IPAM's
// addressing; PATCH changes the policy enforcement and refuses a bad
// mode with a 400 and a start-up flag with a 403, changing nothing.
func TestConfig(t *testing.T) {
	w, _, c := world(t, agentdatapath.AttachMode{Mode: loader.AttachTCX})
	start(t, w, Cell)
	ctx := context.Background()

	get := func() *models.DaemonConfiguration {
		t.Helper()
		var cfg models.DaemonConfiguration
		if err := c.Do(ctx, http.MethodGet, "/config", nil, nil, nil, &cfg); err != nil {
			t.Fatal(err)
		}
		return &cfg
	}
	cfg := get()
	m := cfg.Status.DaemonConfigurationMap
	if m["node-name"] != "node-a" || m["ipv4-range"] != "10.77.3.0/24" || m["mtu"] != "1400" {
		t.Fatalf("configuration map %v, want the flags' values", m)
	}
	if _, ok := cfg.Status.Immutable["policy-enforcement"]; ok {
		t.Fatal("policy-enforcement listed immutable")
	}
	if cfg.Status.Immutable["state-dir"] != option.DefaultAgent().StateDir {
		t.Fatalf("immutable state-dir %q, want the default %q", cfg.Status.Immutable["state-dir"], option.DefaultAgent().StateDir)
	}
	if cfg.Status.DeviceMTU != 1400 || cfg.Status.Addressing == nil || cfg.Status.Addressing.IPV4.AllocRange != "10.77.3.0/24" {
		t.Fatalf("MTU %d addressing %+v, want 1400 and 10.77.3.0/24", cfg.Status.DeviceMTU, cfg.Status.Addressing)
	}
	if cfg.Spec.PolicyEnforcement != option.EnforcementDefault {
		t.Fatalf("policy enforcement %q, want %q", cfg.Spec.PolicyEnforcement, option.EnforcementDefault)
	}

	if err := c.Do(ctx, http.MethodPatch, "/config", nil, nil, &models.DaemonConfigurationSpec{PolicyEnforcement: option.EnforcementAlways}, nil); err != nil {
		t.Fatal(err)
	}
	if got := get().Spec.PolicyEnforcement; got != option.EnforcementAlways {
		t.Fatalf("policy enforcement after PATCH %q, want %q", got, option.EnforcementAlways)
	}
	err := c.Do(ctx, http.MethodPatch, "/config", nil, nil, &models.DaemonConfigurationSpec{PolicyEnforcement: "bogus"}, nil)
	var apiErr *client.APIError
	if !errors.As(err, &apiErr) || apiErr.Code != http.StatusBadRequest || !strings.Contains(apiErr.Error(), "policy-enforcement") {
		t.Fatalf("PATCH with a bad mode: %v, want a 400 naming policy-enforcement", err)
	}
	// A start-up flag is known (the resolved flags) but not changeable.
	err = c.Do(ctx, http.MethodPatch, "/config", nil, nil, &models.DaemonConfigurationSpec{Options: models.ConfigurationMap{"mtu": "9000"}}, nil)
	if !errors.As(err, &apiErr) || apiErr.Code != http.StatusForbidden {
		t.Fatalf("PATCH of an immutable flag: %v, want a 403", err)
	}
	if got := get().Spec.PolicyEnforcement; got != option.EnforcementAlways {
		t.Fatalf("policy enforcement after a refused PATCH %q, want %q still", got, option.EnforcementAlways)
	}
}
